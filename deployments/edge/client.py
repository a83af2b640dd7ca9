"""A small typed client of the search service, sync (``SearchClient``) and async (``AsyncSearchClient``).

Requests and answers are the server's own pydantic models (``deployments.edge.schemas``): a typo in a field is a
``ValidationError`` here, before anything is sent, and an answer is a ``SearchResponse``, not a dict.

    from deployments.edge.client import SearchClient

    with SearchClient("http://127.0.0.1:8000") as client:
        page = client.search("how do I parse arguments", limit=5)
        for result in page.results:
            print(result.rank, result.score, result.doc_id)
        for page in client.pages("gzip", limit=10):      # follows next_cursor to the last page
            ...
        answers = client.search_batch(["gzip", {"query": "tar", "method": "keyword"}])

Only a 503 that says when to come back (``Retry-After``: overloaded, or a replica restarting) is sent again,
after that many seconds (at most ``max_retry_wait_s``), ``max_retries`` times: every other failure is the
caller's to see, as a ``SearchServiceError`` with the status, the message and the request id to find it in
the service's logs. A search of a batch that failed is a ``SearchServiceError`` in its place.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx

from deployments.edge.schemas import (
    FeedbackRequest,
    FeedbackResponse,
    HealthResponse,
    SearchRequest,
    SearchResponse,
)


class SearchServiceError(Exception):
    """What the service answered instead of a result: its status, message, detail and request id."""

    def __init__(self, status: int, message: str, detail: Any = None, request_id: str | None = None):
        super().__init__(f"{status}: {message}" + (f" (request {request_id})" if request_id else ""))
        self.status, self.message, self.detail, self.request_id = status, message, detail, request_id


def _request(query: str | SearchRequest | dict, options: dict[str, Any]) -> SearchRequest:
    if isinstance(query, SearchRequest):
        return query.model_copy(update=options) if options else query
    if isinstance(query, dict):
        return SearchRequest.model_validate(query | options)
    return SearchRequest(query=query, **options)


def _body(req: SearchRequest) -> dict[str, Any]:
    return req.model_dump(mode="json", exclude_unset=True)


def _error(r: httpx.Response) -> SearchServiceError:
    try:
        body = r.json()
    except ValueError:
        body = {"error": r.text[:500]}
    if not isinstance(body, dict):
        body = {"error": str(body)[:500]}
    return SearchServiceError(r.status_code, str(body.get("error", r.reason_phrase)), body.get("detail"),
                              body.get("request_id") or r.headers.get("x-request-id"))


def _retry_after(r: httpx.Response, max_wait_s: float) -> float | None:
    """Seconds to wait before sending again: only a 503 that says when."""
    if r.status_code != 503 or "retry-after" not in r.headers:
        return None
    try:
        return min(max(0.0, float(r.headers["retry-after"])), max_wait_s)
    except ValueError:
        return None


def _batch(answer: dict) -> list[SearchResponse | SearchServiceError]:
    out: list[SearchResponse | SearchServiceError] = []
    for item in answer["responses"]:
        if item["status"] == 200:
            out.append(SearchResponse.model_validate(item["response"]))
        else:
            out.append(SearchServiceError(item["status"], item.get("error") or "", item.get("detail"),
                                          answer.get("request_id")))
    return out


class _Settings:
    def __init__(self, base_url: str, api_key: str | None, timeout: float, max_retries: int, max_retry_wait_s: float):
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout, self.max_retries, self.max_retry_wait_s = timeout, max_retries, max_retry_wait_s


class SearchClient:
    """The service over HTTP, one connection pool; use it as a context manager or call ``close``."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None, timeout: float = 60.0,
                 max_retries: int = 3, max_retry_wait_s: float = 10.0, transport: httpx.BaseTransport | None = None):
        self.settings = s = _Settings(base_url, api_key, timeout, max_retries, max_retry_wait_s)
        self.http = httpx.Client(base_url=s.base_url, headers=s.headers, timeout=s.timeout, transport=transport)

    def __enter__(self) -> SearchClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _send(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,)) -> httpx.Response:
        for attempt in range(self.settings.max_retries + 1):
            r = self.http.request(method, path, json=body)
            wait = _retry_after(r, self.settings.max_retry_wait_s)
            if wait is None or attempt == self.settings.max_retries:
                break
            time.sleep(wait)
        if r.status_code not in ok:
            raise _error(r)
        return r

    def search(self, query: str | SearchRequest | dict, **options: Any) -> SearchResponse:
        """One search: a query text with request fields as keywords, or a whole ``SearchRequest``."""
        return SearchResponse.model_validate_json(self._send("POST", "/search", _body(_request(query, options))).content)

    def pages(self, query: str | SearchRequest | dict, **options: Any) -> Iterator[SearchResponse]:
        """The search's pages in order, following ``next_cursor`` until the last one."""
        req = _request(query, options)
        while True:
            page = self.search(req)
            yield page
            if page.next_cursor is None:
                return
            req = req.model_copy(update={"cursor": page.next_cursor, "offset": 0})

    def search_batch(self, searches: Sequence[str | SearchRequest | dict]) -> list[SearchResponse | SearchServiceError]:
        """Up to 64 searches in one call (queries embedded as one batch); each answer or error in its place."""
        body = {"searches": [_body(_request(s, {})) for s in searches]}
        return _batch(self._send("POST", "/search/batch", body).json())

    def feedback(self, query: str, label: int, doc_id: str | None = None, **fields: Any) -> FeedbackResponse:
        """Store a relevance judgment (``POST /feedback``)."""
        req = FeedbackRequest(query=query, label=label, doc_id=doc_id, **fields)
        r = self._send("POST", "/feedback", req.model_dump(mode="json", exclude_none=True), ok=(201,))
        return FeedbackResponse.model_validate_json(r.content)

    def health(self) -> HealthResponse:
        """Every shard and stage; a service with no shard up answers 503 with the same body."""
        return HealthResponse.model_validate_json(self._send("GET", "/health", ok=(200, 503)).content)


class AsyncSearchClient:
    """``SearchClient`` for asyncio: the same methods, awaited (``pages`` is an async iterator)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None, timeout: float = 60.0,
                 max_retries: int = 3, max_retry_wait_s: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.settings = s = _Settings(base_url, api_key, timeout, max_retries, max_retry_wait_s)
        self.http = httpx.AsyncClient(base_url=s.base_url, headers=s.headers, timeout=s.timeout, transport=transport)

    async def __aenter__(self) -> AsyncSearchClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def _send(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,)) -> httpx.Response:
        for attempt in range(self.settings.max_retries + 1):
            r = await self.http.request(method, path, json=body)
            wait = _retry_after(r, self.settings.max_retry_wait_s)
            if wait is None or attempt == self.settings.max_retries:
                break
            await asyncio.sleep(wait)
        if r.status_code not in ok:
            raise _error(r)
        return r

    async def search(self, query: str | SearchRequest | dict, **options: Any) -> SearchResponse:
        r = await self._send("POST", "/search", _body(_request(query, options)))
        return SearchResponse.model_validate_json(r.content)

    async def pages(self, query: str | SearchRequest | dict, **options: Any) -> AsyncIterator[SearchResponse]:
        req = _request(query, options)
        while True:
            page = await self.search(req)
            yield page
            if page.next_cursor is None:
                return
            req = req.model_copy(update={"cursor": page.next_cursor, "offset": 0})

    async def search_batch(self, searches: Sequence[str | SearchRequest | dict]) -> list[SearchResponse | SearchServiceError]:
        body = {"searches": [_body(_request(s, {})) for s in searches]}
        return _batch((await self._send("POST", "/search/batch", body)).json())

    async def feedback(self, query: str, label: int, doc_id: str | None = None, **fields: Any) -> FeedbackResponse:
        req = FeedbackRequest(query=query, label=label, doc_id=doc_id, **fields)
        r = await self._send("POST", "/feedback", req.model_dump(mode="json", exclude_none=True), ok=(201,))
        return FeedbackResponse.model_validate_json(r.content)

    async def health(self) -> HealthResponse:
        return HealthResponse.model_validate_json((await self._send("GET", "/health", ok=(200, 503))).content)
