"""Load shedding ahead of Serve's own request handling: the outermost ASGI layer of the router's HTTP server.

At four times its capacity a router replica refuses hundreds of requests a second. Refused inside the app
(``deployments.edge.front_door``), each refusal first paid for Serve's handling of a request (its request object,
context, metrics and scheduling on the replica), a few hundred microseconds of the event loop that also
serves the admitted requests. Installed as Serve's HTTP middleware, this layer counts the requests that do
work against ``security.max_inflight`` and refuses the excess before Serve sees them. ``python -m deployments``
installs it: it names ``middlewares`` below in ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``, which every Serve
process reads when it starts an HTTP server.

Serve applies its HTTP middlewares in every process that answers HTTP (the proxy as well); only a process
whose router configured the guard counts anything. A request this layer counted says so in its ASGI scope
(``COUNTED_KEY``), and ``FrontDoor`` counts every other one: requests through the proxy, and every request
of an app started without the variable (``serve run serve_config.yaml``, unless it is exported before Ray
starts). Kept free of the router's imports: the proxy loads this module too.
"""

from __future__ import annotations

import json

from deployments.edge.guard import Refusal, installed
from deployments.edge.metrics import HTTP_REQUESTS

# The routes that do a request's work (search, streamed answers until they end, judgments' disk writes, the MCP
# tools, which search and write); health, the console and /admin/ (an operator's rollback must get through) are
# never refused for load. Matched at the end of the path: this layer runs before the app's route prefix is taken off.
COUNTED_ENDINGS = ("/search", "/search/batch", "/feedback", "/documents", "/documents/delete", "/mcp")
COUNTED_KEY = "raysearch.counted"  # set in the scope of a request this layer counted


async def refuse(refusal: Refusal, send, request_id: str | None = None) -> None:
    """The refusal as two raw ASGI messages: no response object, no header parsing, one small ``dumps``. Refused
    ahead of Serve, a request has no id yet; inside the app it has one, and the body says it."""
    body = json.dumps({"error": refusal.message} | ({"request_id": request_id} if request_id else {})).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in refusal.headers.items()]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def counted(scope) -> bool:
    return scope["type"] == "http" and scope["path"].rstrip("/").endswith(COUNTED_ENDINGS)


def budgeted(scope) -> bool:
    """Whether a request counts against its caller's own budget (``security.key_limit``): every counted route but
    ``/mcp``, whose protocol exchanges (initialize, notifications, tools/list) are not the caller's work; each MCP
    tool call counts instead, on its own (``deployments.api.mcp``)."""
    return counted(scope) and not scope["path"].rstrip("/").endswith("/mcp")


def middlewares() -> list:
    """What Serve's HTTP servers wrap themselves in (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``)."""
    from starlette.middleware import Middleware

    return [Middleware(ShedFirst)]


class ShedFirst:
    """Reads the guard the router replica of this process handed over (``guard.install``); in a process without
    one (Serve's proxy) every request passes."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        guard = installed()
        if guard is None or not counted(scope):
            return await self.app(scope, receive, send)
        refusal = guard.admit()
        if refusal is not None:
            route = next(e for e in COUNTED_ENDINGS if scope["path"].rstrip("/").endswith(e))  # before any prefix is taken off
            HTTP_REQUESTS.count(route, scope["method"], refusal.status, shed=True)
            return await refuse(refusal, send)
        scope[COUNTED_KEY] = True
        try:
            await self.app(scope, receive, send)
        finally:
            guard.release()
