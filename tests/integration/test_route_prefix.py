"""The front door under a route prefix (``route_prefix: /api``), through Serve's proxy with keys on: the
same rules as without one, judged on the path after the prefix."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from deployments.edge.guard import new_key
from tests.serving import SERVE_PORT, start_serve, stop_serving

PORT = SERVE_PORT
USER_KEY, USER_DIGEST = new_key()
ADMIN_KEY, ADMIN_DIGEST = new_key()


@pytest.fixture(scope="module")
def served(built, ray_local):
    from ray import serve

    from deployments.serve.app import build_app

    _, summary = built[3]
    start_serve()
    app = build_app({"index": str(summary.version_dir), "router": {"shard_timeout_s": 10, "cache_size": 0},
                     "security": {"api_key_digests": [USER_DIGEST], "admin_key_digests": [ADMIN_DIGEST],
                                  "max_inflight": 2, "retry_after_s": 3}})
    serve.run(app, name="prefixed", route_prefix="/api", blocking=False)
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}/api", timeout=60) as client:
        yield client
    stop_serving()


def test_open_routes_stay_open_and_keys_bind_under_the_prefix(served):
    client = served
    user, admin = {"Authorization": f"Bearer {USER_KEY}"}, {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert client.get("/health").status_code == 200  # open, as without a prefix
    assert client.get("/openapi.json").status_code == 200
    assert client.post("/search", json={"query": "telescope"}).status_code == 401
    assert client.post("/search", json={"query": "telescope"}, headers=user).status_code == 200
    assert client.get("/admin/versions", headers=user).status_code == 403  # a search key is no admin key
    assert client.get("/admin/versions", headers=admin).status_code == 200


def test_searches_under_the_prefix_count_against_max_inflight(served):
    async def burst():
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{PORT}/api", timeout=60,
                                     headers={"Authorization": f"Bearer {USER_KEY}"}) as client:
            return await asyncio.gather(*(client.post("/search", json={"query": f"telescope galaxy {i}",
                                                                       "limit": 100}) for i in range(24)))

    answers = asyncio.run(burst())
    shed = [r for r in answers if r.status_code == 503]
    assert shed and all(r.headers["Retry-After"] == "3" for r in shed)
    assert {r.status_code for r in answers} <= {200, 503}


def test_mcp_answers_under_the_prefix_with_the_same_keys(served):
    """The MCP endpoint at PREFIX/mcp, through the SDK's client: an admin key is offered the write tools, a search
    key is not, and a search answers; without a key, 401."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def session_with(key: str):
        async with (httpx2.AsyncClient(headers={"X-API-Key": key}, timeout=60) as http,
                    streamable_http_client(f"http://127.0.0.1:{PORT}/api/mcp", http_client=http) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            tools = {t.name for t in (await session.list_tools()).tools}
            return tools, await session.call_tool("search", {"query": "telescope galaxy", "limit": 3})

    user_tools, found = asyncio.run(session_with(USER_KEY))
    assert user_tools == {"search", "list_collections", "get_document", "list_documents"}
    assert not found.is_error and found.structured_content["results"]
    admin_tools, _ = asyncio.run(session_with(ADMIN_KEY))
    assert admin_tools == user_tools | {"upsert_documents", "delete_documents"}
    assert served.post("/mcp", json={}, headers={"Accept": "application/json, text/event-stream"}).status_code == 401
