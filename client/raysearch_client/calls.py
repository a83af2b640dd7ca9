"""The API as calls: each client method is one ``Call`` (HTTP method, route, body, the statuses that answer it,
how the answer is read), built here once for the sync and the async client alike; with the one retry rule and the
one error both clients raise.

The routes are the server's (deployments/serve/router.py); a request is checked against the API's models
(``raysearch_client.models``) before it is sent, so a field out of its limits is a ``ValidationError`` here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from raysearch_client.models import (
    BatchSearchResponse,
    BuildJob,
    BuildJobs,
    BuildRequest,
    CollectionCreated,
    CollectionsResponse,
    CreateCollectionRequest,
    DeleteDocumentsRequest,
    DocumentResponse,
    DocumentsPage,
    FeedbackRequest,
    FeedbackResponse,
    HealthResponse,
    ListDocumentsRequest,
    SearchRequest,
    SearchResponse,
    UpsertDocumentsRequest,
    WriteResponse,
)


class SearchServiceError(Exception):
    """What the service answered instead of a result: its status, message, detail and request id (the
    ``X-Request-Id`` every log line of the request carries)."""

    def __init__(self, status: int, message: str, detail: Any = None, request_id: str | None = None):
        super().__init__(f"{status}: {message}" + (f" (request {request_id})" if request_id else ""))
        self.status, self.message, self.detail, self.request_id = status, message, detail, request_id


class BuildFailed(Exception):
    """A collection's build job ended without a version (``job``: its record, whose ``error`` is the end of its
    output)."""

    def __init__(self, job: BuildJob):
        super().__init__(f"build {job.id} of collection {job.collection!r} failed: {(job.error or '')[-2000:]}")
        self.job = job


CREATE_POLL_S = 1.0  # how often a client waiting for a created collection asks about it


def waited_for(name: str, job: BuildJob, served: set[str] | None, deadline: float) -> bool:
    """Whether a client waiting for collection ``name`` may stop (its build done and the collection served); raises
    ``BuildFailed`` for a failed build and ``TimeoutError`` past ``deadline`` (``time.monotonic``)."""
    if job.state == "failed":
        raise BuildFailed(job)
    if job.state == "succeeded" and served is not None and name in served:
        return True
    if time.monotonic() > deadline:
        raise TimeoutError(f"collection {name!r} is not served yet (build {job.id}: {job.state}); follow it with "
                           "client.build(id) and client.collections()")
    return False


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    read: Callable[[httpx.Response], Any]
    body: Any = None
    ok: tuple[int, ...] = (200,)
    idempotent: bool = False  # sent twice, the same as once: sent again when its connection went away mid-call


def reader(model: type[BaseModel]) -> Callable[[httpx.Response], Any]:
    return lambda r: model.model_validate_json(r.content)


def search_request(query: str | SearchRequest | dict, options: dict[str, Any]) -> SearchRequest:
    """A query text with request fields as keywords, a request body as a dict, or a ``SearchRequest``."""
    if isinstance(query, SearchRequest):
        return query.model_copy(update=options) if options else query
    if isinstance(query, dict):
        return SearchRequest.model_validate(query | options)
    return SearchRequest(query=query, **options)


def sent(req: SearchRequest | BuildRequest) -> dict[str, Any]:
    """Only the fields given: the server's defaults (and its settings) decide the rest."""
    return req.model_dump(mode="json", exclude_unset=True)


def search(req: SearchRequest) -> Call:
    return Call("POST", "/search", reader(SearchResponse), sent(req), idempotent=True)


def next_page(req: SearchRequest, page: SearchResponse) -> SearchRequest | None:
    """The request of the page after ``page``: the same search from its ``next_cursor`` (None after the last)."""
    if page.next_cursor is None:
        return None
    return req.model_copy(update={"cursor": page.next_cursor, "offset": 0})


def stream_answer(req: SearchRequest) -> Call:
    """``POST /search`` with ``synthesize`` and ``stream``: NDJSON events (``raysearch_client.events``)."""
    return Call("POST", "/search", lambda r: r, sent(req.model_copy(update={"synthesize": True, "stream": True})),
                idempotent=True)


def search_batch(searches: Sequence[str | SearchRequest | dict]) -> Call:
    return Call("POST", "/search/batch", batch_answers, {"searches": [sent(search_request(s, {})) for s in searches]},
                idempotent=True)


def batch_answers(r: httpx.Response) -> list[SearchResponse | SearchServiceError]:
    """Each search's answer, or its error (with the batch's request id), in the order sent."""
    answer = BatchSearchResponse.model_validate_json(r.content)
    return [item.response if item.status == 200 and item.response is not None
            else SearchServiceError(item.status, item.error or "", item.detail, answer.request_id)
            for item in answer.responses]


def feedback(query: str, label: int, doc_id: str | None, fields: dict[str, Any]) -> Call:
    req = FeedbackRequest(query=query, label=label, doc_id=doc_id, **fields)
    return Call("POST", "/feedback", reader(FeedbackResponse), req.model_dump(mode="json", exclude_none=True), (201,))


def health() -> Call:
    # A service with no shard up answers 503 with the same body.
    return Call("GET", "/health", reader(HealthResponse), ok=(200, 503), idempotent=True)


def collections() -> Call:
    return Call("GET", "/collections", reader(CollectionsResponse), idempotent=True)


def documents_path(collection: str, *rest: str) -> str:
    # Ids are path segments: quoted whole, so a "/", "#" or "?" in one stays in it.
    return "/".join(["/collections", quote(collection, safe=""), "documents", *(quote(p, safe="") for p in rest)])


def upsert_documents(collection: str, documents: Sequence[dict[str, Any]]) -> Call:
    req = UpsertDocumentsRequest(documents=list(documents))
    return Call("PUT", documents_path(collection), reader(WriteResponse), req.model_dump(mode="json"), idempotent=True)


def get_document(collection: str, doc_id: str) -> Call:
    return Call("GET", documents_path(collection, doc_id), reader(DocumentResponse), idempotent=True)


def delete_documents(collection: str, ids: Sequence[str]) -> Call:
    req = DeleteDocumentsRequest(ids=list(ids))
    return Call("POST", documents_path(collection, "delete"), reader(WriteResponse), req.model_dump(mode="json"))


def list_documents(collection: str, fields: dict[str, Any]) -> Call:
    req = ListDocumentsRequest(**fields)
    return Call("POST", documents_path(collection, "list"), reader(DocumentsPage), req.model_dump(mode="json",
                exclude_none=True), idempotent=True)


def create_collection(fields: dict[str, Any]) -> Call:
    req = CreateCollectionRequest(**fields)
    return Call("POST", "/admin/collections", reader(CollectionCreated), req.model_dump(mode="json", exclude_none=True),
                (202,))


def start_build(fields: dict[str, Any]) -> Call:
    return Call("POST", "/admin/builds", reader(BuildJob), sent(BuildRequest(**fields)), (202,))


def build(build_id: str) -> Call:
    return Call("GET", f"/admin/builds/{quote(build_id, safe='')}", reader(BuildJob), idempotent=True)


def builds() -> Call:
    return Call("GET", "/admin/builds", lambda r: BuildJobs.model_validate_json(r.content).builds, idempotent=True)


RETRIED = (429, 503)  # the statuses that say when to come back (Retry-After)
GONE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)  # a connection closed mid-call


def retry_after(r: httpx.Response, max_wait_s: float) -> float | None:
    """Seconds to wait before sending again, at most ``max_wait_s``: only a 503 (overloaded, or a replica
    restarting) or a 429 (over the key's own limits) that says when is worth sending again; every other failure is
    the caller's to see."""
    if r.status_code not in RETRIED or "retry-after" not in r.headers:
        return None
    try:
        return min(max(0.0, float(r.headers["retry-after"])), max_wait_s)
    except ValueError:
        return None


def from_proxy(r: httpx.Response) -> bool:
    """A 404 that is not the service's (its errors are a JSON object with ``error``): a proxy in front of it that
    has no route to it now, one starting or one draining with its node. The call never reached the service."""
    if r.status_code != 404:
        return False
    try:
        body = r.json()
    except ValueError:
        return True
    return not (isinstance(body, dict) and "error" in body)


def fresh(attempt: int) -> dict[str, str]:
    """The headers of a call's ``attempt``: a call sent again asks for its connection to be closed after it, so a
    connection to a proxy going away is not kept for the next call (and the next attempt opens a new one)."""
    return {"Connection": "close"} if attempt else {}


def resend_wait(call: Call, attempt: int, r: httpx.Response | None = None, error: Exception | None = None,
                max_wait_s: float = 10.0) -> float | None:
    """Seconds to wait before sending ``call`` again after ``attempt`` (0 for the first), or None: its answer says
    when to come back (``retry_after``); it never reached the service (a connection refused, a proxy's own 404);
    or it is idempotent and its connection closed before the answer (a proxy or a node going away mid-call).
    Every other failure is the caller's to see."""
    backoff = min(0.1 * 2 ** attempt, max_wait_s)
    if error is not None:
        return backoff if isinstance(error, httpx.ConnectError) or (call.idempotent and isinstance(error, GONE)) \
            else None
    assert r is not None
    return backoff if from_proxy(r) else retry_after(r, max_wait_s)


def error_of(r: httpx.Response) -> SearchServiceError:
    """The service's one error body (``error``, ``detail``, ``request_id``), or what came instead of it."""
    try:
        body = r.json()
    except ValueError:
        body = {"error": r.text[:500]}
    if not isinstance(body, dict):
        body = {"error": str(body)[:500]}
    return SearchServiceError(r.status_code, str(body.get("error", r.reason_phrase)), body.get("detail"),
                              body.get("request_id") or r.headers.get("x-request-id"))
