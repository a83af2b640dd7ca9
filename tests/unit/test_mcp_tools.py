"""The MCP tools' catalogue and refusals, Ray-free: which key is offered which tool, schemas taken from the HTTP
request models, and refusals answered as tool errors that start with the status HTTP gives them."""

from __future__ import annotations

import asyncio

from deployments.api.mcp import McpTools, UpsertDocumentsArgs, visible_tools
from deployments.edge.guard import Caller
from deployments.edge.schemas import SearchRequest, SearchResponse

SEARCH_KEY = Caller("a" * 16, ("t1",), admin=False, writer=False)
WRITE_KEY = Caller("b" * 16, ("t1",), admin=False, writer=True)


def not_reached(*_):
    raise AssertionError("a refused call reached the search")


def call(caller: Caller, name: str, arguments: dict):
    # No documents: a refusal must come before anything is read or written.
    return asyncio.run(McpTools(not_reached, None, "default").call(name, arguments, caller, {}, None))


def test_write_tools_are_offered_only_to_keys_that_may_write():
    assert [t.name for t in visible_tools(SEARCH_KEY)] == ["search", "get_document"]
    assert [t.name for t in visible_tools(WRITE_KEY)] == ["search", "get_document", "upsert_documents",
                                                         "delete_documents"]
    assert [t.name for t in visible_tools(Caller())] == [t.name for t in visible_tools(WRITE_KEY)]  # keys off


def test_schemas_are_the_http_models():
    tools = {t.name: t for t in visible_tools(WRITE_KEY)}
    assert tools["search"].input_schema == SearchRequest.model_json_schema()
    assert tools["search"].output_schema == SearchResponse.model_json_schema()
    upsert = tools["upsert_documents"].input_schema
    assert upsert == UpsertDocumentsArgs.model_json_schema() and upsert["properties"]["documents"]["maxItems"] == 1000
    assert tools["search"].annotations.read_only_hint and not tools["upsert_documents"].annotations.read_only_hint


def test_a_write_tool_called_with_a_search_key_is_refused_naming_why():
    for name, arguments in (("upsert_documents", {"documents": [{"id": "x", "text": "y"}]}),
                            ("delete_documents", {"ids": ["x"]})):
        result = call(SEARCH_KEY, name, arguments)
        assert result.is_error
        assert result.content[0].text == ("403: this API key may not write documents: add its digest to "
                                          "security.write_key_digests")


def test_bad_arguments_unknown_tools_and_streams_are_tool_errors():
    limit = call(SEARCH_KEY, "search", {"query": "x", "limit": 1000})
    assert limit.is_error and limit.content[0].text.startswith("422: invalid arguments: limit: ")
    extra = call(SEARCH_KEY, "get_document", {"doc_id": "d1", "tenant": "t2"})
    assert extra.is_error and "tenant: Extra inputs are not permitted" in extra.content[0].text
    stream = call(SEARCH_KEY, "search", {"query": "x", "synthesize": True, "stream": True})
    assert stream.is_error and stream.content[0].text.startswith("400: stream: true is for POST /search")
    unknown = call(SEARCH_KEY, "drop_index", {})
    assert unknown.is_error and unknown.content[0].text.startswith("404: no tool 'drop_index'")
