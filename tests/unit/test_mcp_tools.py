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
    reads = ["search", "list_collections", "get_document", "list_documents"]
    assert [t.name for t in visible_tools(SEARCH_KEY)] == reads
    assert [t.name for t in visible_tools(WRITE_KEY)] == [*reads, "upsert_documents", "delete_documents"]
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


class Fresh:
    """The fresh segment's part of a collection that ``list_collections`` reads: its metadata fields."""

    def __init__(self, fields: dict[str, str]):
        self.metadata = type("Table", (), {"fields": lambda _self: fields})()


def catalogue():
    from deployments.api.collections import list_collections
    from deployments.search.clients import Collection

    docs = Collection.at_version("docs", "v3", [], None, fields={"year": "number", "topic": "string"},
                                 counts={"docs": 12, "chunks": 40}, fresh=Fresh({"lang": "string", "year": "string"}))
    notes = Collection.at_version("notes", "v1", [], None, fields={"published": "date"})
    return list_collections([notes, docs], "docs")


def test_list_collections_gives_each_collection_its_fields_and_their_operators():
    tools = McpTools(not_reached, None, "docs", catalogue)
    assert "list_collections" in [t.name for t in visible_tools(SEARCH_KEY)]
    result = asyncio.run(tools.call("list_collections", {}, SEARCH_KEY, {}, None))
    assert not result.is_error
    docs, notes = result.structured_content["collections"]
    assert (docs["name"], docs["default"], docs["version"], docs["documents"], docs["chunks"]) == \
        ("docs", True, "v3", 12, 40)
    # The version's fields and, after them, those only written documents hold; the version's kind wins.
    assert [(f["name"], f["kind"]) for f in docs["fields"]] == [("lang", "string"), ("topic", "string"),
                                                                 ("year", "number")]
    by_name = {f["name"]: f["operators"] for f in docs["fields"] + notes["fields"]}
    assert by_name["year"] == by_name["published"] == ["eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "exists"]
    assert by_name["topic"] == ["eq", "ne", "in", "nin", "exists"]
    assert (notes["default"], notes["documents"]) == (False, 0)
    assert asyncio.run(tools.call("list_collections", {"collection": "x"}, SEARCH_KEY, {}, None)).is_error


def test_each_tool_call_counts_against_the_callers_budget_and_a_call_over_it_says_when_to_retry():
    from deployments.config import KeyLimit
    from deployments.edge.key_limits import KeyLimiter

    limits = KeyLimiter(default=KeyLimit(requests_per_s=1, burst=2, max_inflight=5))
    tools = McpTools(not_reached, None, "docs", catalogue, limits)
    other = Caller("c" * 16, ("t2",), admin=False, writer=False)
    results = [asyncio.run(tools.call("list_collections", {}, SEARCH_KEY, {}, None)) for _ in range(3)]
    assert [r.is_error for r in results] == [False, False, True]
    over = results[2]
    assert over.content[0].text.startswith(f"429: this caller (key:{'a' * 16}) sent more than 2 requests in 2 s")
    assert 1 <= over.meta["retry_after_s"] <= 2 and f"retry after {over.meta['retry_after_s']} s" in \
        over.content[0].text
    assert not asyncio.run(tools.call("list_collections", {}, other, {}, None)).is_error  # its own budget
    assert limits.inflight == {}  # every call released what it held, the refused one included


def test_a_tool_call_over_the_callers_in_flight_limit_is_refused_until_one_ends():
    from deployments.config import KeyLimit
    from deployments.edge.key_limits import KeyLimiter

    limits = KeyLimiter(default=KeyLimit(requests_per_s=100, burst=100, max_inflight=1), retry_after_s=3)
    release = asyncio.Event()

    async def held(*_):
        await release.wait()
        return SearchResponse(query="x", method="hybrid", method_used="hybrid", results=[], total=0, total_results=0,
                              index_version={}, timings_ms={}, coverage={"shards_asked": 1, "shards_answered": 1, "ratio": 1.0, "degraded": False})

    async def run():
        tools = McpTools(held, None, "docs", catalogue, limits)
        first = asyncio.create_task(tools.call("search", {"query": "x"}, SEARCH_KEY, {}, None))
        await asyncio.sleep(0.05)
        second = await tools.call("search", {"query": "x"}, SEARCH_KEY, {}, None)
        release.set()
        return await first, second, await tools.call("list_collections", {}, SEARCH_KEY, {}, None)

    first, second, after = asyncio.run(run())
    assert not first.is_error and first.structured_content["query"] == "x"
    assert second.is_error and second.meta == {"retry_after_s": 3}
    assert "in progress on this replica, its max_inflight; retry after 3 s" in second.content[0].text
    assert not after.is_error
