"""The HTTP app the router's routes are declared on: its front door and its error handlers, Ray-free.

Every error leaves through one of three handlers here, in the one error body (``ErrorResponse``): a request
that fails validation (422 with each field and rule), Starlette's own (404 no such route, 405), and the
service's error kinds (and the change log's), whose status comes from the one table
(``deployments.edge.errors.HTTP_STATUS``).
The router (``deployments.serve.router``) adds the routes and hands its guard over (``guard.install``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.edge.errors import ERROR_ROOTS, error_body, error_headers, status_of
from deployments.edge.front_door import FrontDoor
from deployments.edge.guard import Caller
from deployments.edge.schemas import ErrorResponse

app = FastAPI(
    title="raysearch",
    version="0.1.0",
    description="Hybrid (dense + BM25) retrieval over sharded indexes, fused, diversified and assembled.",
)
app.add_middleware(FrontDoor)


def error_responses(extra: dict[int, str] | None = None) -> dict[int, dict]:
    """OpenAPI entries for a route's error statuses, every one with the one error body (``ErrorResponse``:
    ``{"error": message, "detail": ...}``), the same for the front door's refusals and the handlers'."""
    common = {401: "No API key, or one that is not valid (when keys are on)",
              413: "Body over security.max_body_bytes",
              422: "Invalid request: the field, the rule and the fix in the message",
              429: "Over the caller's own limits (security.key_limit): Retry-After and RateLimit-* say when to retry",
              503: "Overloaded (Retry-After says when to retry), or a stage it needs is restarting"}
    return {code: {"model": ErrorResponse, "description": text} for code, text in (common | (extra or {})).items()}


def request_id(request: Request) -> str | None:
    """The request's id: the caller's ``X-Request-Id``, or the one Serve made for it (Serve puts it in the request's
    headers, returns it in the response's, and writes it in every log line of the request, in every replica)."""
    return request.headers.get("x-request-id")


async def current_caller(request: Request) -> Caller:
    """Who sent the request: the caller the front door knew from its key (``FrontDoor`` puts it in the request's
    state), or, where no guard checked it, one with every right (keys off). A coroutine: FastAPI runs a plain
    function's dependency on a thread, a hop for every request."""
    return getattr(request.state, "caller", None) or Caller()


# A route's caller: ``caller: CurrentCaller`` (FastAPI's dependency on ``current_caller``).
CurrentCaller = Annotated[Caller, Depends(current_caller)]


def error_response(request: Request, status: int, message: str, detail: Any = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(message, request_id(request), detail),
                        headers=headers)


def validation_problems(exc) -> list[dict[str, str]]:
    """Each problem of a request body: the field's path and the rule it broke."""
    return [{"field": ".".join(str(p) for p in e["loc"] if p != "body"), "error": e["msg"]} for e in exc.errors()]


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(request, 422, "invalid request", validation_problems(exc))


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    # Starlette's own (no such route, method not allowed), in the app's one error body.
    return error_response(request, exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))


async def _service_error(request: Request, exc: Exception) -> JSONResponse:
    """Every error a core raises on purpose (``deployments.errors``, the change log's), answered by the one table."""
    return error_response(request, status_of(exc), str(exc), headers=error_headers(exc))


for _root in ERROR_ROOTS:
    app.add_exception_handler(_root, _service_error)


# The MCP endpoint (``deployments.api.mcp``) of this process's router replica, handed over when it starts
# (``install_mcp``), as the guard is: Serve serves a frozen copy of this app, which the router never sees.
_mcp = None


def install_mcp(endpoint) -> None:
    global _mcp
    _mcp = endpoint


class _McpRoute:
    """``/mcp`` as a plain ASGI route (the SDK answers the request itself: JSON-RPC over POST), behind the same
    front door as every route: keys, the body limit, shedding and the request count (route ``/mcp``)."""

    async def __call__(self, scope, receive, send) -> None:
        if _mcp is None:
            response = error_response(Request(scope), 503, "the MCP endpoint is starting; retry shortly",
                                      headers={"Retry-After": "1"})
            return await response(scope, receive, send)
        await _mcp(scope, receive, send)


app.add_route("/mcp", _McpRoute(), methods=["GET", "POST", "DELETE"], include_in_schema=False)
