"""The MCP endpoint (``/mcp``, Streamable HTTP): the router's search and documents work offered as MCP tools.

A tool is a second door to the same work, never a second implementation: ``search`` calls the function the
``POST /search`` route calls (the pipeline with the caller's principals, recorded in the search metrics), and the
document tools call the same ``DocumentWrites`` the documents routes call, which holds the write-scope and ACL
rules. Who calls is the ``Caller`` the front door made from the request's key (``Authorization: Bearer`` or
``X-API-Key``) and left in the request's state, so keys, tenants, ACLs, body limits and load shedding are those of
HTTP, checked before the MCP SDK sees the request. Tool arguments are the HTTP request models (their limits and
descriptions become the tools' input schemas, so the two contracts cannot drift); a refusal is a tool error
(``isError``) whose text starts with the HTTP status the same refusal gets on the routes.

Stateless (``stateless_http``): each POST is answered on its own, with no MCP session kept on the replica. Router
replicas sit behind Serve's proxy and a load balancer that may send a client's next request to any replica, and the
tools need nothing between calls; a session kept on one replica would be unknown to the others (a 404 for the
client). JSON answers, not SSE: each tool answers once, and a stateless request has no back channel to stream on.

A caller's own budget (``security.key_limit``) counts tool calls, not HTTP exchanges: a session's initialize,
notifications and tools/list are the protocol's, and counted they would spend a small budget before the first
search. A call over the budget is a tool error (``429: ...; retry after N s``, with ``retry_after_s`` in its
``_meta``), which an MCP client shows its model, where an HTTP 429 would end the session in a transport error.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mcp import types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import BaseModel, Field, ValidationError

from deployments.documents.writes import may_write_documents
from deployments.edge.errors import ERROR_ROOTS, error_headers, status_of
from deployments.edge.guard import Caller
from deployments.edge.key_limits import KeyLimiter
from deployments.edge.schemas import (
    CollectionsResponse,
    DeleteDocumentsRequest,
    DocumentResponse,
    DocumentsPage,
    ListDocumentsRequest,
    RequestBody,
    SearchRequest,
    SearchResponse,
    UpsertDocumentsRequest,
    WriteResponse,
    response_json,
)
from deployments.errors import InvalidRequest, RateLimited

# The search route's work (``SearchRouter.answer``): a request, its headers and id, and who asked.
Search = Callable[[SearchRequest, Mapping[str, str], "str | None", Caller], Awaitable[SearchResponse]]


class InCollection(BaseModel):
    collection: str | None = Field(None, description="The collection; default: the service's default collection.")


class GetDocumentArgs(InCollection, RequestBody):
    doc_id: str = Field(min_length=1, max_length=512, description="The document's id (a search result's doc_id).")


class ListCollectionsArgs(RequestBody):
    pass


class ListDocumentsArgs(InCollection, ListDocumentsRequest):
    pass


class UpsertDocumentsArgs(InCollection, UpsertDocumentsRequest):
    pass


class DeleteDocumentsArgs(InCollection, DeleteDocumentsRequest):
    pass


# name -> (arguments, answer, whether only a write key sees it, what it does)
TOOLS: dict[str, tuple[type[BaseModel], type[BaseModel], bool, str]] = {
    "search": (SearchRequest, SearchResponse, False,
               "Hybrid (dense + BM25) search: the fields of POST /search in, its answer out (each result with its "
               "chunk_id, doc_id, content and score; the citations). Only documents this key may see."),
    "list_collections": (ListCollectionsArgs, CollectionsResponse, False,
                         "The collections this service searches (the default one marked), each with its index "
                         "version, document and chunk counts, and the metadata fields a search's filters may name, "
                         "with each field's kind and the operators it takes. As GET /collections."),
    "get_document": (GetDocumentArgs, DocumentResponse, False,
                     "A document by id, with its text and chunk ids, as this key may see it."),
    "list_documents": (ListDocumentsArgs, DocumentsPage, False,
                       "A page of a collection's documents in id order, without a query: those a metadata filter "
                       "(as a search's) lets through, optionally among given ids, with the count of all that match; "
                       "page on with after = the page's next_after. As POST /collections/{c}/documents/list."),
    "upsert_documents": (UpsertDocumentsArgs, WriteResponse, True,
                         "Add or replace up to 1,000 documents atomically (write keys only)."),
    "delete_documents": (DeleteDocumentsArgs, WriteResponse, True,
                         "Delete documents by id atomically; one missing id deletes none (write keys only)."),
}


# Made once: pydantic writes a JSON schema anew on each call, and tools/list is asked for on every connection.
_CATALOGUE = [(writes, types.Tool(name=name, description=text, input_schema=args.model_json_schema(),
                                  output_schema=answer.model_json_schema(),
                                  annotations=types.ToolAnnotations(read_only_hint=not writes)))
              for name, (args, answer, writes, text) in TOOLS.items()]


def visible_tools(caller: Caller) -> list[types.Tool]:
    """The tools a caller is offered: the write tools only to a key that may write (a write or admin key)."""
    return [tool for writes, tool in _CATALOGUE if caller.writer or not writes]


def refused(status: int, message: str, retry_after_s: int | None = None) -> types.CallToolResult:
    """A tool error, its text as HTTP would answer: the status first, then the message with its remedy; when HTTP
    would send ``Retry-After``, its seconds in ``_meta`` as ``retry_after_s``."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"{status}: {message}")], is_error=True,
                                meta=None if retry_after_s is None else {"retry_after_s": retry_after_s})


def retry_after(error: Exception) -> int | None:
    """The seconds of the ``Retry-After`` HTTP answers ``error`` with (the one error table's), if any."""
    seconds = (error_headers(error) or {}).get("Retry-After")
    return None if seconds is None else int(seconds)


def answered(answer: BaseModel | str) -> types.CallToolResult:
    """The answer as structured content and as the same JSON in text (for clients that read only text)."""
    text = answer if isinstance(answer, str) else answer.model_dump_json(exclude_none=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=json.loads(text))


class McpTools:
    """The tools over the router's work: its search (``search``), its documents (``DocumentWrites``) and the
    collections it serves (``collections``: their ``GET /collections`` answer). ``limits``: the callers' budgets,
    which each call counts against (None: none)."""

    def __init__(self, search: Search, documents, default_collection: str,
                 collections: Callable[[], CollectionsResponse] | None = None, limits: KeyLimiter | None = None):
        self.search, self.documents, self.default_collection = search, documents, default_collection
        self.collections, self.limits = collections, limits

    async def call(self, name: str, arguments: Mapping[str, Any], caller: Caller, headers: Mapping[str, str],
                   request_id: str | None) -> types.CallToolResult:
        """One tool call, counted against the caller's budget as one request of HTTP is."""
        budget = None
        try:
            if self.limits is not None:
                budget, _ = self.limits.admit(caller.key_id, caller.principals)
        except RateLimited as exc:
            return refused(429, str(exc), exc.retry_after_s)
        try:
            return await self._call(name, arguments, caller, headers, request_id)
        finally:
            if self.limits is not None:
                self.limits.release(budget)

    async def _call(self, name: str, arguments: Mapping[str, Any], caller: Caller, headers: Mapping[str, str],
                    request_id: str | None) -> types.CallToolResult:
        if name not in TOOLS:
            return refused(404, f"no tool {name!r}: the tools are {', '.join(TOOLS)}")
        try:
            if TOOLS[name][2]:  # a write tool this key was not offered: refused before its arguments are looked at
                may_write_documents(caller)
            args = TOOLS[name][0].model_validate(dict(arguments))
            return answered(await self._run(name, args, caller, headers, request_id))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                                 for e in exc.errors())
            return refused(422, f"invalid arguments: {problems}")
        except ERROR_ROOTS as exc:
            return refused(status_of(exc), str(exc), retry_after(exc))

    async def _run(self, name: str, args: Any, caller: Caller, headers, request_id) -> BaseModel | str:
        if name == "search":
            if args.stream:
                raise InvalidRequest("stream: true is for POST /search (NDJSON lines); the search tool answers "
                                     "whole: leave stream out")
            return response_json(await self.search(args, headers, request_id, caller))
        if name == "list_collections":
            return self.collections()
        collection = args.collection or self.default_collection
        if name == "get_document":
            return await self.documents.get(collection, args.doc_id, caller)
        if name == "list_documents":
            return await self.documents.list(collection, ListDocumentsRequest(**args.model_dump(exclude={"collection"})),
                                             caller)
        if name == "upsert_documents":
            return await self.documents.upsert(collection, args.documents, caller)
        return await self.documents.delete(collection, args.ids, caller)


def caller_of(request) -> Caller:
    """The caller the front door made from the request's key (``current_caller``'s rule: none checked, keys off)."""
    state = request.scope.get("state", {}) if request is not None else {}
    return state.get("caller") or Caller()


class McpEndpoint:
    """The ``/mcp`` ASGI app of one router replica: the MCP SDK's low-level server and its Streamable HTTP session
    manager, stateless. ``start()`` runs the manager's lifespan, held open for as long as the replica lives."""

    def __init__(self, tools: McpTools, max_body_bytes: int):
        async def list_tools(ctx, params) -> types.ListToolsResult:
            return types.ListToolsResult(tools=visible_tools(caller_of(ctx.request)))

        async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
            request = ctx.request
            headers = request.headers if request is not None else {}
            return await tools.call(params.name, params.arguments or {}, caller_of(request), headers,
                                    headers.get("x-request-id"))

        self.server = Server("raysearch", on_list_tools=list_tools, on_call_tool=call_tool)
        # The front door already refused a body over the limit by its Content-Length; the SDK's own check is
        # set to the same limit so the two cannot disagree.
        self.sessions = StreamableHTTPSessionManager(app=self.server, stateless=True, json_response=True,
                                                     max_request_body_size=max_body_bytes)

    async def start(self) -> asyncio.Task:
        """Start the session manager (the SDK's lifespan: the task group its requests run in) in a task of its own
        that holds it open until cancelled; returns once requests can be served. A Serve replica runs no ASGI
        lifespan for its ingress app, so the replica starts it here, as it starts its other followers."""
        started = asyncio.Event()

        async def hold() -> None:
            async with self.sessions.run():
                started.set()
                await asyncio.Event().wait()  # until the replica ends (the task is cancelled)

        task = asyncio.create_task(hold())
        ready = asyncio.ensure_future(started.wait())
        await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():  # the manager failed to start: the replica fails to start, with its error
            ready.cancel()
            task.result()
        return task

    async def __call__(self, scope, receive, send) -> None:
        await self.sessions.handle_request(scope, receive, send)
