"""The front door: keys, body size and load shedding, decided from the method, path and headers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from deployments.config import SecurityConfig
from deployments.edge.guard import Guard, key_digest, new_key
from deployments.edge.keys import main as keys_main


def headers(**kw) -> dict[str, str]:
    return {k.replace("_", "-"): v for k, v in kw.items()}


def test_keys_off_lets_everyone_in():
    assert Guard().check("POST", "/search", headers(content_length="10")) is None


def test_keys_on():
    key, digest = new_key()
    guard = Guard(key_digests=frozenset({digest}))
    ok = headers(content_length="10")
    assert guard.check("POST", "/search", ok | {"authorization": f"Bearer {key}"}) is None
    assert guard.check("POST", "/search", ok | {"x-api-key": key}) is None
    missing = guard.check("POST", "/search", ok)
    assert missing.status == 401 and "API key is required" in missing.message
    assert missing.headers == {"WWW-Authenticate": "Bearer"}
    assert guard.check("POST", "/search", ok | {"x-api-key": key + "x"}).message == "this API key is not valid"
    for path in ("/health", "/docs", "/openapi.json"):
        assert guard.check("GET", path, {}) is None  # probes and docs stay open


def test_admin_routes_need_an_admin_key_when_keys_are_on():
    user, user_digest = new_key()
    admin, admin_digest = new_key()
    guard = Guard(key_digests=frozenset({user_digest, admin_digest}), admin_digests=frozenset({admin_digest}))
    body = headers(content_length="20")
    path = "/admin/collections/default/activate"
    assert guard.check("POST", path, body | {"x-api-key": admin}) is None
    assert guard.check("POST", "/search", body | {"x-api-key": admin}) is None
    assert guard.check("POST", path, body | {"x-api-key": user}).status == 403
    assert guard.check("POST", path, body).status == 401
    assert Guard().check("POST", path, body) is None  # keys off: open, like every route


def test_body_size_is_checked_before_reading_it():
    guard = Guard(max_body_bytes=2048)
    assert guard.check("POST", "/search", headers(content_length="2048")) is None
    assert guard.check("POST", "/search", headers(content_length="2049")).status == 413
    assert guard.check("POST", "/search", {}).status == 411
    assert guard.check("POST", "/search", headers(content_length="12a")).status == 400
    assert guard.check("GET", "/health", {}) is None


def test_overload_is_shed_with_retry_after():
    guard = Guard(max_inflight=2, retry_after_s=3)
    assert guard.admit() is None and guard.admit() is None
    refused = guard.admit()
    assert refused.status == 503 and refused.headers == {"Retry-After": "3"} and guard.inflight == 2
    guard.release()
    assert guard.admit() is None
    guard.release(), guard.release(), guard.release()
    assert guard.inflight == 0


def test_configuration_holds_digests_not_keys(capsys):
    key, digest = new_key()
    assert SecurityConfig(api_key_digests=[digest]).api_key_digests == [digest]
    with pytest.raises(ValidationError, match="not keys"):
        SecurityConfig(api_key_digests=[key])
    keys_main(["digest", key])
    assert capsys.readouterr().out.strip() == key_digest(key) == digest
    keys_main(["new"])
    out = capsys.readouterr().out.split()
    assert out[0] == "key:" and key_digest(out[1]) == out[3]


def test_a_routers_guard_is_made_from_its_config_with_keys_from_the_environment(monkeypatch):
    guard = Guard.from_config(SecurityConfig(api_keys_env="RS_KEYS", max_inflight=5), {"RS_KEYS": "alpha, beta"})
    assert guard.key_digests == {key_digest("alpha"), key_digest("beta")} and guard.max_inflight == 5
    with pytest.raises(ValueError, match="holds no keys"):
        Guard.from_config(SecurityConfig(api_keys_env="RS_KEYS"), {"RS_KEYS": ""})
    monkeypatch.setenv("RS_KEYS", "gamma")  # the process's environment by default
    assert Guard.from_config(SecurityConfig(api_keys_env="RS_KEYS")).key_digests == {key_digest("gamma")}
    admin = key_digest("root")
    both = Guard.from_config(SecurityConfig(api_key_digests=[key_digest("u")], admin_key_digests=[admin],
                                            key_principals={key_digest("t"): ["tenant-a"]}))
    assert both.key_digests == {key_digest("u"), admin, key_digest("t")} and both.admin_digests == {admin}
    assert both.key_principals == {key_digest("t"): ("tenant-a",)}


def test_the_front_door_judges_the_path_after_the_route_prefix():
    from deployments.edge.guard import route_path

    assert route_path("/api/health", "/api") == "/health"
    assert route_path("/api/admin/versions", "/api/") == "/admin/versions"
    assert route_path("/api", "/api") == "/"
    assert route_path("/apikeys/search", "/api") == "/apikeys/search"  # another prefix, not this one
    assert route_path("/search", "") == "/search" and route_path("/search", "/") == "/search"


def test_the_caller_is_known_from_its_key_alone():
    user, user_digest = new_key()
    admin, admin_digest = new_key()
    g = Guard(key_digests=frozenset({user_digest, admin_digest}), admin_digests=frozenset({admin_digest}),
              key_principals={user_digest: ("t1", "staff")})
    me = g.caller({"authorization": f"Bearer {user}"})
    assert (me.key_id, me.principals, me.admin) == (user_digest[:16], ("t1", "staff"), False)
    assert g.caller({"x-api-key": admin}).admin and g.caller({"x-api-key": admin}).principals == ()
    assert not g.caller({}).admin  # keys on and none shown: nobody in particular (the front door refuses it)
    open_door = Guard()
    assert open_door.caller({}).admin and open_door.caller({}).key_id is None  # keys off: nothing tells callers apart


def test_the_layer_ahead_of_serve_counts_each_request_once_and_the_app_door_counts_the_rest(monkeypatch):
    """``ShedFirst`` (outermost, before Serve's request handling) and the app's ``FrontDoor`` read the one guard
    the router handed over: a request the first counted is not counted again; one that came another way
    (through Serve's proxy) is counted by the door; a process whose router handed over no guard counts nothing."""
    import asyncio

    from deployments.edge.front_door import FrontDoor
    from deployments.edge.shedding import COUNTED_KEY, ShedFirst
    from tests.waiting import until

    guard = Guard(max_inflight=2, retry_after_s=4)
    monkeypatch.setattr("deployments.edge.guard._installed", guard)
    seen, release = [], {}  # release["now"]: an event of the running burst's loop

    async def app(scope, receive, send):  # holds every request until released
        seen.append((scope["path"], guard.inflight))
        await release["now"].wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})

    def call(layer, path):
        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"content-length", b"2")]}
        return scope, sent, layer(scope, None, send)

    async def burst(layer, paths):
        release["now"] = asyncio.Event()
        calls = [call(layer, p) for p in paths]
        tasks = [asyncio.ensure_future(c[2]) for c in calls]
        await until(lambda: sum(1 for _, sent, _ in calls if sent) + sum(1 for p, _ in seen if isinstance(p, str))
                    >= len(calls), 5, "every request either in the app (held) or refused")
        seen.append(("held", guard.inflight))
        release["now"].set()
        await asyncio.gather(*tasks)
        return [(scope, sent[0]["status"], dict(sent[0]["headers"])) for scope, sent, _ in calls]

    both = ShedFirst(FrontDoor(app))
    answers = asyncio.run(burst(both, ["/search", "/api/search", "/search/", "/health", "/feedback"]))
    statuses = [status for _, status, _ in answers]
    assert statuses == [200, 200, 503, 200, 503]  # two counted once each; the health probe is never shed
    assert answers[2][2][b"retry-after"] == b"4" and guard.inflight == 0
    assert seen[-1] == ("held", 2)  # two held requests, counted once each (the door did not count them again)
    assert answers[0][0][COUNTED_KEY] and COUNTED_KEY not in answers[3][0]

    seen.clear()
    door_only = FrontDoor(app)  # through the proxy: the app's door counts
    assert [s for _, s, _ in asyncio.run(burst(door_only, ["/search", "/search", "/search"]))] == [200, 200, 503]

    monkeypatch.setattr("deployments.edge.guard._installed", None)  # the proxy's copy: no router handed one over
    assert [s for _, s, _ in asyncio.run(burst(ShedFirst(app), ["/search"] * 3))] == [200, 200, 200]
    assert guard.inflight == 0


def test_mcp_requests_count_against_max_inflight():
    """``/mcp`` does a request's work (its tools search and write): shed under load like /search, also under a prefix."""
    from deployments.edge.shedding import counted

    assert counted({"type": "http", "path": "/mcp"}) and counted({"type": "http", "path": "/api/mcp/"})
    assert not counted({"type": "http", "path": "/health"})
