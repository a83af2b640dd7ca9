"""Each caller's share at the front door (``security.key_limit``): a key over its rate or its in-flight limit gets a
429 with ``Retry-After`` and ``RateLimit-*`` while another key is still served, counted as outcome ``429``.

The app's real front door (``FrontDoor``) in-process over ``httpx.ASGITransport``, around a route that answers at
once or holds its requests until released; the guard is the one a router makes from its config."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pydantic import ValidationError

from deployments.config import KeyLimit, SecurityConfig
from deployments.edge.front_door import FrontDoor, served_by
from deployments.edge.guard import Guard, key_digest
from tests.waiting import until

LIMIT = {"requests_per_s": 1, "burst": 2, "max_inflight": 5}  # 2 at once, then 1 a second (a 2 s window)


def guard_of(monkeypatch, **security) -> Guard:
    guard = Guard.from_config(SecurityConfig(api_key_digests=[key_digest("alpha"), key_digest("beta")], **security))
    monkeypatch.setattr("deployments.edge.guard._installed", guard)
    served_by()  # the first answer's header imports Ray Serve (seconds on a busy machine): not inside a 2 s window
    return guard


async def answered(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


def client(app=answered) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=FrontDoor(app)), base_url="http://test")


async def search(c: httpx.AsyncClient, key: str) -> httpx.Response:
    return await c.post("/search", json={"query": "q"}, headers={"x-api-key": key})


def test_a_key_over_its_rate_gets_429_with_the_headers_while_another_key_is_served(monkeypatch):
    guard_of(monkeypatch, key_limit=LIMIT)

    async def run():
        async with client() as c:
            return [await search(c, "alpha") for _ in range(3)] + [await search(c, "beta")]

    first, second, over, other = asyncio.run(run())
    assert [r.status_code for r in (first, second, over, other)] == [200, 200, 429, 200]
    assert first.headers["ratelimit-limit"] == "2" and first.headers["ratelimit-remaining"] == "1"
    assert first.headers["ratelimit-policy"] == "2;w=2"
    assert over.headers["ratelimit-remaining"] == "0" and over.headers["ratelimit-limit"] == "2"
    assert 1 <= int(over.headers["retry-after"]) <= 2 and over.headers["retry-after"] == over.headers["ratelimit-reset"]
    assert "more than 2 requests in 2 s" in over.json()["error"]
    assert other.headers["ratelimit-remaining"] == "1"  # beta's own budget, untouched by alpha's


def test_in_flight_requests_are_capped_per_key(monkeypatch):
    guard = guard_of(monkeypatch, key_limit={"requests_per_s": 100, "burst": 100, "max_inflight": 2},
                     retry_after_s=3)
    release, held = asyncio.Event(), []

    async def holding(scope, receive, send):
        held.append(scope["path"])
        await release.wait()
        await answered(scope, receive, send)

    async def run():
        async with client(holding) as c:
            alphas = [asyncio.ensure_future(search(c, "alpha")) for _ in range(2)]
            await until(lambda: len(held) == 2, 5, "alpha's two requests held in the app")
            third = await asyncio.wait_for(search(c, "alpha"), 5)  # alpha is at its max_inflight: refused at once
            beta = asyncio.ensure_future(search(c, "beta"))  # beta is not
            await until(lambda: len(held) == 3, 5, "beta's request held in the app")
            release.set()
            return third, await asyncio.gather(*alphas, beta), await search(c, "alpha")

    third, held_answers, after = asyncio.run(run())
    assert third.status_code == 429 and third.headers["retry-after"] == "3" and "in progress" in third.json()["error"]
    assert [r.status_code for r in held_answers] == [200, 200, 200] and after.status_code == 200
    assert guard.key_limits.inflight == {}  # every request's count was given back


def test_a_tenant_shares_one_budget_and_a_key_of_its_own_wins(monkeypatch):
    tenant = {key_digest("alpha"): ["tenant-a"], key_digest("beta"): ["tenant-a"], key_digest("gamma"): ["tenant-a"]}
    guard_of(monkeypatch, key_principals=tenant,
             key_limits={"tenant-a": {"requests_per_s": 1, "burst": 1, "max_inflight": 1},
                         key_digest("gamma"): {"requests_per_s": 3, "burst": 3, "max_inflight": 3}})

    async def run():
        async with client() as c:
            return [(await search(c, k)).status_code for k in ("alpha", "beta", "gamma", "gamma", "gamma", "gamma")]

    assert asyncio.run(run()) == [200, 429, 200, 200, 200, 429]  # alpha spent tenant-a's one; gamma has 3 of its own


def test_without_limits_or_without_keys_nobody_is_limited_apart(monkeypatch):
    guard_of(monkeypatch)  # keys, no key_limit

    async def burst():
        async with client() as c:
            return {(await search(c, "alpha")).status_code for _ in range(5)}

    assert asyncio.run(burst()) == {200}
    monkeypatch.setattr("deployments.edge.guard._installed", Guard.from_config(SecurityConfig(key_limit=LIMIT)))
    assert asyncio.run(burst()) == {200}  # keys off: nothing tells callers apart


def test_health_and_admin_are_never_limited(monkeypatch):
    guard_of(monkeypatch, key_limit={"requests_per_s": 1, "burst": 1, "max_inflight": 1})

    async def run():
        async with client() as c:
            await search(c, "alpha")
            return [(await c.get("/health", headers={"x-api-key": "alpha"})).status_code for _ in range(3)]

    assert asyncio.run(run()) == [200, 200, 200]


class Recorded:
    """Stands in for Ray's counter (which needs a Ray worker): what the front door counted."""

    def __init__(self):
        self.tags = []

    def inc(self, value, tags):
        self.tags.append(tags)


def test_a_refusal_for_a_keys_limit_is_counted_as_outcome_429(monkeypatch):
    from deployments.edge.metrics import HTTP_REQUESTS

    recorded = Recorded()
    monkeypatch.setattr(HTTP_REQUESTS, "_counter", recorded)
    monkeypatch.setattr(HTTP_REQUESTS, "_ready", True)
    guard_of(monkeypatch, key_limit={"requests_per_s": 1, "burst": 1, "max_inflight": 1})

    async def run():
        async with client() as c:
            return [(await search(c, "alpha")).status_code for _ in range(2)]

    assert asyncio.run(run()) == [200, 429]
    HTTP_REQUESTS.held.flush()  # made half a second after, on a loop that has ended here
    assert [t["outcome"] for t in recorded.tags] == ["ok", "429"]
    assert recorded.tags[1] == {"route": "/search", "method": "POST", "outcome": "429"}


@pytest.mark.parametrize("limit,message", [
    ({"requests_per_s": -1, "burst": 2, "max_inflight": 1}, "greater than 0"),
    ({"requests_per_s": 0, "burst": 2, "max_inflight": 1}, "greater than 0"),
    ({"requests_per_s": 10, "burst": 0, "max_inflight": 1}, "greater than or equal to 1"),
    ({"requests_per_s": 10, "burst": 20, "max_inflight": 0}, "greater than or equal to 1"),
    ({"requests_per_s": 10, "burst": 25, "max_inflight": 1}, "2.5 s: the window must be a whole number of seconds"),
    ({"requests_per_s": 10, "burst": 5, "max_inflight": 1}, "0.5 s: the window must be a whole number of seconds"),
])
def test_nonsense_limits_are_refused_with_the_rule(limit, message):
    with pytest.raises(ValidationError, match=message):
        SecurityConfig(key_limit=limit)
    with pytest.raises(ValidationError, match=message):
        SecurityConfig(key_principals={key_digest("alpha"): ["tenant-a"]}, key_limits={"tenant-a": limit})
    assert KeyLimit(requests_per_s=0.5, burst=1, max_inflight=1).window_s == 2  # slower than one a second is fine


def test_key_limits_name_a_key_digest_or_a_principal():
    ok = {"requests_per_s": 1, "burst": 1, "max_inflight": 1}
    assert SecurityConfig(key_limits={key_digest("alpha"): ok}).key_limits[key_digest("alpha")].burst == 1
    with pytest.raises(ValidationError, match="'rsk_raw', neither a key digest .* nor a principal of key_principals "
                                              r"\(tenant-a\)"):
        SecurityConfig(key_principals={key_digest("alpha"): ["tenant-a"]}, key_limits={"rsk_raw": ok})


def test_mcp_exchanges_are_not_counted_against_the_callers_budget_but_still_need_a_key(monkeypatch):
    """/mcp's protocol exchanges (initialize, notifications, tools/list) pass whatever the caller's budget; its tool
    calls count, one by one, in the MCP tools (``deployments.api.mcp``)."""
    guard_of(monkeypatch, key_limit={"requests_per_s": 1, "burst": 1, "max_inflight": 1})

    async def run():
        async with client() as c:
            mcp = [(await c.post("/mcp", json={}, headers={"x-api-key": "alpha"})).status_code for _ in range(4)]
            return mcp, (await c.post("/mcp", json={})).status_code, [(await search(c, "alpha")).status_code
                                                                      for _ in range(2)]

    assert asyncio.run(run()) == ([200] * 4, 401, [200, 429])
