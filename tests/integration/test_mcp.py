"""The MCP endpoint on a served app, through Serve's proxy and the MCP SDK's own Streamable HTTP client: the search
tool answers as POST /search does, a tenant's key never sees another tenant's document through any tool, the write
tools are offered only to write keys (and work for them), and /mcp has the front door's keys and body limit."""

from __future__ import annotations

import asyncio
import json

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from deployments.edge.guard import new_key
from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import write_jsonl
from tests.integration.conftest import auth, tenant_docs, visible_by_principal
from tests.serving import SERVE_PORT, start_serve, stop_serving

PORT = SERVE_PORT
URL = f"http://127.0.0.1:{PORT}/mcp"
T1_KEY, T1_DIGEST = new_key()  # search key of tenant t1
T2_KEY, T2_DIGEST = new_key()  # search key of tenant t2
W1_KEY, W1_DIGEST = new_key()  # write key of tenant t1
L1_KEY, L1_DIGEST = new_key()  # search key of tenant t1 with a budget of its own: 3 at once, then 1 a second
QUERY = "telescope galaxy bread piano"


@pytest.fixture(scope="module")
def root(ray_local, tmp_path_factory):
    folder = tmp_path_factory.mktemp("mcp")
    corpus = write_jsonl(folder / "corpus.jsonl", tenant_docs())
    summary = build_index(BuildConfig(corpus=corpus, out=folder / "index", shards=2, encoder="hashing:32",
                                      chunk_size=40, chunk_overlap=8, progress=False))
    return folder / "index", summary.version_dir


@pytest.fixture(scope="module")
def visible(root):
    return visible_by_principal(root[1])


@pytest.fixture(scope="module")
def client(root):
    from ray import serve

    from deployments.serve.app import build_app

    start_serve()
    app = build_app({"index": str(root[0]), "router": {"shard_timeout_s": 10, "cache_size": 64},
                     "security": {"key_principals": {T1_DIGEST: ["t1"], T2_DIGEST: ["t2"], W1_DIGEST: ["t1"],
                                                     L1_DIGEST: ["t1"]},
                                  "write_key_digests": [W1_DIGEST], "acl_field": "acl",
                                  "key_limits": {L1_DIGEST: {"requests_per_s": 1, "burst": 3, "max_inflight": 4}}}})
    serve.run(app, name="mcp", route_prefix="/", blocking=False)
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as c:
        yield c
    stop_serving()


def mcp(key: str, work):
    """``work(session)`` in an MCP session of the SDK's Streamable HTTP client, sending ``key``."""
    async def run():
        async with (httpx2.AsyncClient(headers=auth(key), timeout=60) as http,
                    streamable_http_client(URL, http_client=http) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            return await work(session)

    return asyncio.run(run())


def tool_names(key: str) -> set[str]:
    async def work(session):
        return {t.name for t in (await session.list_tools()).tools}

    return mcp(key, work)


def call(key: str, tool: str, arguments: dict):
    async def work(session):
        return await session.call_tool(tool, arguments)

    return mcp(key, work)


def found(key: str, query: str = QUERY, method: str = "keyword") -> set[str]:
    result = call(key, "search", {"query": query, "method": method, "limit": 100})
    assert not result.is_error, result.content
    return {r["doc_id"] for r in result.structured_content["results"]}


def test_the_search_tool_answers_as_post_search_does(client):
    request = {"query": QUERY, "method": "hybrid", "limit": 7}
    http = client.post("/search", json=request, headers=auth(T1_KEY))
    assert http.status_code == 200, http.text
    result = call(T1_KEY, "search", request)
    assert not result.is_error, result.content
    tool = result.structured_content
    assert tool["results"] and tool["results"] == http.json()["results"]  # chunk ids, doc ids, text, scores
    assert tool["citations"] == http.json()["citations"]
    assert json.loads(result.content[0].text)["results"] == tool["results"]


def test_a_tenant_never_sees_another_tenants_document_through_any_tool(client, visible):
    for key, who, other in ((T1_KEY, "t1", "t2"), (T2_KEY, "t2", "t1")):
        for method in ("keyword", "vector", "hybrid"):
            docs = found(key, method=method)
            assert docs and docs <= visible[who], (who, method, docs - visible[who])
        theirs = sorted(visible[other] - visible[who])
        assert theirs
        for doc_id in theirs[:4]:
            refused = call(key, "get_document", {"doc_id": doc_id})
            assert refused.is_error and refused.content[0].text.startswith("404: "), refused.content
            assert client.get(f"/collections/default/documents/{doc_id}", headers=auth(key)).status_code == 404
        mine = sorted(visible[who] - visible[other])[0]
        document = call(key, "get_document", {"doc_id": mine})
        assert not document.is_error and document.structured_content["id"] == mine
        assert document.structured_content["chunk_ids"]
        listed = call(key, "list_documents", {"limit": 1000})
        assert not listed.is_error, listed.content
        ids = {d["id"] for d in listed.structured_content["documents"]}
        assert ids == visible[who] and listed.structured_content["total"] == len(ids)  # all its own, none of theirs


def test_write_tools_are_offered_only_to_write_keys_and_work_for_them(client):
    assert tool_names(T1_KEY) == {"search", "list_collections", "get_document", "list_documents"}
    assert tool_names(W1_KEY) == tool_names(T1_KEY) | {"upsert_documents", "delete_documents"}
    record = {"id": "mcp-1", "title": "Quokka", "text": "zyxwvut quokka notes", "metadata": {"acl": ["t1"]}}
    refused = call(T1_KEY, "upsert_documents", {"documents": [record]})
    assert refused.is_error and refused.content[0].text.startswith("403: ") and "write" in refused.content[0].text
    assert "mcp-1" not in found(T1_KEY, "zyxwvut quokka")

    written = call(W1_KEY, "upsert_documents", {"documents": [record]})
    assert not written.is_error, written.content
    assert written.structured_content["upserted"] == 1 and written.structured_content["searchable"]
    assert "mcp-1" in found(T1_KEY, "zyxwvut quokka")  # tenant t1 finds it, through the search tool
    assert "mcp-1" not in found(T2_KEY, "zyxwvut quokka")  # tenant t2 does not
    assert call(T2_KEY, "get_document", {"doc_id": "mcp-1"}).is_error
    assert call(T1_KEY, "get_document", {"doc_id": "mcp-1"}).structured_content["text"] == "zyxwvut quokka notes"

    deleted = call(W1_KEY, "delete_documents", {"ids": ["mcp-1"]})
    assert not deleted.is_error and deleted.structured_content["deleted"] == 1
    assert "mcp-1" not in found(T1_KEY, "zyxwvut quokka")


def test_bad_arguments_are_a_tool_error_naming_the_field(client):
    refused = call(T1_KEY, "search", {"query": QUERY, "limit": 1000})
    assert refused.is_error and refused.content[0].text.startswith("422: ") and "limit" in refused.content[0].text


def test_mcp_has_the_front_doors_keys_and_body_limit(client):
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                             "clientInfo": {"name": "test", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream"}
    assert client.post("/mcp", json=initialize, headers=headers).status_code == 401
    assert client.post("/mcp", json=initialize, headers=headers | {"X-API-Key": T1_KEY}).status_code == 200
    big = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
           "params": {"name": "search", "arguments": {"query": "x" * 70_000}}}
    over = client.post("/mcp", json=big, headers=headers | auth(T1_KEY))
    assert over.status_code == 413 and "limit is 65536" in over.json()["error"]


def test_a_session_under_a_rate_limit_spends_its_budget_on_tool_calls_and_hears_when_to_retry(client):
    """A key allowed 3 at once, then 1 a second: the SDK's own session (initialize, initialized, tools/list) costs
    none of it, three searches are answered, and the fourth is a tool error that says when to retry."""
    async def work(session):
        await session.list_tools()
        return [await session.call_tool("search", {"query": QUERY, "limit": 3}) for _ in range(4)]

    results = mcp(L1_KEY, work)
    assert [r.is_error for r in results] == [False, False, False, True], [r.content for r in results]
    over = results[3]
    assert over.content[0].text.startswith("429: this caller") and 1 <= over.meta["retry_after_s"] <= 3
    assert f"retry after {over.meta['retry_after_s']} s" in over.content[0].text


def test_list_collections_names_the_fields_a_filter_may_use_as_get_collections_does(client):
    result = call(T1_KEY, "list_collections", {})
    assert not result.is_error, result.content
    http = client.get("/collections", headers=auth(T1_KEY))
    assert http.status_code == 200 and http.json() == result.structured_content
    (default,) = result.structured_content["collections"]
    assert default["name"] == "default" and default["default"] and default["documents"] == 30
    fields = {f["name"]: f for f in default["fields"]}
    assert fields["acl"]["kind"] == "string" and fields["acl"]["operators"] == ["eq", "ne", "in", "nin", "exists"]
    assert fields["year"]["kind"] == "number" and {"gt", "gte", "lt", "lte"} <= set(fields["year"]["operators"])
    assert client.get("/collections").status_code == 401  # the front door's keys
