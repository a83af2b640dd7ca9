"""The app's front door, as plain ASGI: keys, body size, each caller's limits and load shedding before anything
else of the app runs.

Starlette's ``BaseHTTPMiddleware`` costs a task and a stream per request. A request counts against
``security.max_inflight`` until its response has been sent, streamed answers included. Shedding comes first:
under overload it is what most requests meet. A request that came through the shedding layer ahead of Serve
(``deployments.edge.shedding``) was counted there, before Serve's own handling of it.

A caller over its own share (``security.key_limit``, ``deployments.edge.key_limits``) is refused here, once its
key is known, with the 429 of the one error table (``deployments.edge.errors``); the answers it is let in for carry
its ``RateLimit-*`` headers.

The guard is the router replica's own (``SearchRouter`` makes it from its config and hands it over with
``guard.install``); until a router has handed one over, nothing is checked.
"""

from __future__ import annotations

import functools

from starlette.datastructures import Headers

from deployments.edge.errors import error_headers, status_of
from deployments.edge.guard import Refusal, installed, route_path
from deployments.edge.metrics import HTTP_REQUESTS, route_label
from deployments.edge.shedding import COUNTED_KEY, budgeted, counted, refuse
from deployments.errors import RateLimited


@functools.cache
def served_by() -> bytes:
    """``<replica>@<node>``, the ``x-served-by`` header of every answer: which router replica on which Ray node
    answered (Serve's replica id and the first 12 characters of the node id), for an operator reading a slow or odd
    answer on a cluster, and for tests that check a write is seen on every replica."""
    try:
        import ray
        from ray import serve

        replica = serve.get_replica_context().replica_id.unique_id
        return f"{replica}@{ray.get_runtime_context().get_node_id()[:12]}".encode()
    except Exception:  # noqa: BLE001 - not in a Serve replica (the app in-process, a test)
        return b"local"


class FrontDoor:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        guard = installed()
        if scope["type"] != "http" or guard is None:
            return await self.app(scope, receive, send)
        path = route_path(scope["path"], scope.get("root_path", ""))  # the same rules under a route prefix
        counted_here = counted(scope) and not scope.get(COUNTED_KEY)  # not already counted ahead of Serve
        if counted_here:
            refusal = guard.admit()
            if refusal is not None:
                HTTP_REQUESTS.count(route_label(scope, path), scope["method"], refusal.status, shed=True)
                return await refuse(refusal, send, Headers(scope=scope).get("x-request-id"))
        status = [500]  # what an exception that escapes the app becomes (Starlette's outer layer answers 500)
        budget, limit_headers = None, {}  # the caller's share this request counts against, and where it stands

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = [*message.get("headers", ()), (b"x-served-by", served_by()),
                                      *((k.lower().encode(), v.encode()) for k, v in limit_headers.items())]
            await send(message)

        try:
            headers = Headers(scope=scope)
            refusal = guard.check(scope["method"], path, headers)
            if refusal is not None:
                status[0] = refusal.status
                return await refuse(refusal, send, headers.get("x-request-id"))
            caller = guard.caller(headers)
            if budgeted(scope):  # the routes that do work count against their caller's share too (MCP: per tool call)
                try:
                    budget, limit_headers = guard.key_limits.admit(caller.key_id, caller.principals)
                except RateLimited as e:
                    status[0] = status_of(e)
                    return await refuse(Refusal(status[0], str(e), error_headers(e)), send, headers.get("x-request-id"))
            scope.setdefault("state", {})["caller"] = caller  # the routes' `current_caller`
            await self.app(scope, receive, send_and_note)
        finally:
            HTTP_REQUESTS.count(route_label(scope, path), scope["method"], status[0])
            if counted_here:
                guard.release()
            guard.key_limits.release(budget)
