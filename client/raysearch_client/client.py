"""The search service over HTTP, sync (``SearchClient``) and async (``AsyncSearchClient``): the same methods, each
one call of ``raysearch_client.calls`` sent with the one retry rule.

A call is sent again, ``max_retries`` times, when the answer says when to come back (a 503 or a 429 with
``Retry-After``: overloaded, a replica restarting, or the key over its own limits; after that many seconds, at most
``max_retry_wait_s``), and when it never reached the service or lost its connection before the answer (a refused
connection, a proxy's own 404, a connection closed mid-call of a search or another idempotent call: a proxy or node
going away; after a short backoff, on a new connection: ``calls.resend_wait``). Every other failure is the caller's
to see, as a ``SearchServiceError``. A search of a batch that failed is a ``SearchServiceError`` in its place.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx

from raysearch_client import calls
from raysearch_client.calls import Call, SearchServiceError
from raysearch_client.events import AnswerStreamEvent, event
from raysearch_client.models import (
    BuildJob,
    CollectionCreated,
    CollectionInfo,
    DocumentResponse,
    DocumentsPage,
    FeedbackResponse,
    HealthResponse,
    SearchRequest,
    SearchResponse,
    WriteResponse,
)

Query = str | SearchRequest | dict

# Where a client (and every framework adapter, which holds one) finds its key when it is given none.
API_KEY_ENV = "RAYSEARCH_API_KEY"


def api_key_or_env(api_key: str | None) -> str | None:
    """The key given, else ``$RAYSEARCH_API_KEY`` (unset or empty: no key)."""
    return api_key if api_key is not None else (os.environ.get(API_KEY_ENV) or None)


class _Settings:
    def __init__(self, base_url: str, api_key: str | None, timeout: float, max_retries: int, max_retry_wait_s: float):
        self.base_url = base_url.rstrip("/")
        api_key = api_key_or_env(api_key)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout, self.max_retries, self.max_retry_wait_s = timeout, max_retries, max_retry_wait_s


class SearchClient:
    """The service over HTTP, one connection pool; use it as a context manager or call ``close``. ``api_key``: sent as
    ``Authorization: Bearer``; None reads ``$RAYSEARCH_API_KEY``."""

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

    def _send(self, call: Call, stream: bool = False) -> httpx.Response:
        last = self.settings.max_retries
        for attempt in range(last + 1):
            try:
                r = self.http.send(self.http.build_request(call.method, call.path, json=call.body,
                                                           headers=calls.fresh(attempt)), stream=stream)
            except httpx.TransportError as e:
                wait = calls.resend_wait(call, attempt, error=e, max_wait_s=self.settings.max_retry_wait_s)
                if wait is None or attempt == last:
                    raise
                time.sleep(wait)
                continue
            wait = calls.resend_wait(call, attempt, r, max_wait_s=self.settings.max_retry_wait_s)
            if wait is None or attempt == last:
                break
            r.close()
            time.sleep(wait)
        if r.status_code not in call.ok:
            r.read()
            r.close()
            raise calls.error_of(r)
        return r

    def _answer(self, call: Call) -> Any:
        return call.read(self._send(call))

    def search(self, query: Query, **options: Any) -> SearchResponse:
        """One search: a query text with request fields as keywords, or a whole ``SearchRequest`` (or its dict)."""
        return self._answer(calls.search(calls.search_request(query, options)))

    def pages(self, query: Query, **options: Any) -> Iterator[SearchResponse]:
        """The search's pages in order, following ``next_cursor`` until the last one."""
        req = calls.search_request(query, options)
        while req is not None:
            page = self.search(req)
            yield page
            req = calls.next_page(req, page)

    def search_batch(self, searches: Sequence[Query]) -> list[SearchResponse | SearchServiceError]:
        """Up to 64 searches in one call (queries embedded as one batch); each answer or error in its place."""
        return self._answer(calls.search_batch(searches))

    def stream_answer(self, query: Query, **options: Any) -> Iterator[AnswerStreamEvent]:
        """A synthesized answer as it is written: a ``ResultsEvent``, ``TokenEvent``s, then an ``AnswerEvent`` (or
        an ``ErrorEvent`` when synthesis failed after the results were sent)."""
        r = self._send(calls.stream_answer(calls.search_request(query, options)), stream=True)
        try:
            for line in r.iter_lines():
                if line.strip():
                    yield event(line)
        finally:
            r.close()

    def feedback(self, query: str, label: int, doc_id: str | None = None, **fields: Any) -> FeedbackResponse:
        """Store a relevance judgment (``chunk_id`` or ``doc_id`` names the judged result)."""
        return self._answer(calls.feedback(query, label, doc_id, fields))

    def health(self) -> HealthResponse:
        """Every shard and stage; a service with no shard up answers 503 with the same body."""
        return self._answer(calls.health())

    def collections(self) -> list[CollectionInfo]:
        """The collections served (the default one marked), each with its version, counts and the metadata fields a
        filter may name, with the operators each takes."""
        return self._answer(calls.collections()).collections

    def upsert_documents(self, collection: str, documents: Sequence[dict[str, Any]]) -> WriteResponse:
        """Add or replace up to 1,000 documents (records as the build reads them), atomically."""
        return self._answer(calls.upsert_documents(collection, documents))

    def get_document(self, collection: str, doc_id: str) -> DocumentResponse:
        return self._answer(calls.get_document(collection, doc_id))

    def delete_documents(self, collection: str, ids: Sequence[str]) -> WriteResponse:
        """Delete up to 1,000 documents, atomically: one unknown id refuses them all (404)."""
        return self._answer(calls.delete_documents(collection, ids))

    def list_documents(self, collection: str, **fields: Any) -> DocumentsPage:
        """A page of the collection's documents in id order, without a query (``ListDocumentsRequest``'s fields:
        ``filters``, ``ids``, ``limit``, ``after``), with the count of all that match."""
        return self._answer(calls.list_documents(collection, fields))

    def documents(self, collection: str, **fields: Any) -> Iterator[DocumentResponse]:
        """Every document the filter lets through, in id order, a page (``limit``, 100 by default) at a time."""
        while True:
            page = self.list_documents(collection, **fields)
            yield from page.documents
            if page.next_after is None:
                return
            fields = {**fields, "after": page.next_after}

    def count_documents(self, collection: str, filters: dict[str, Any] | None = None) -> int:
        """How many of the collection's documents the filter lets through (all: none given)."""
        return self.list_documents(collection, filters=filters, limit=0).total

    def create_collection(self, name: str, documents: Sequence[dict[str, Any]], wait: bool = True,
                          timeout_s: float = 3600.0, **options: Any) -> CollectionCreated:
        """Create a collection from its first documents (up to 1,000; admin keys): a build job makes its first version
        (``options``: ``encoder``, ``shards``, ``chunk_size``, ``chunk_overlap``). With ``wait``, returns once the
        build succeeded and the service serves it (``BuildFailed`` if the build failed, ``TimeoutError`` past
        ``timeout_s``); else at once, the build running."""
        created = self._answer(calls.create_collection({"name": name, "documents": list(documents), **options}))
        job, deadline = created.build, time.monotonic() + timeout_s
        while wait:
            served = {c.name for c in self.collections()} if job.state == "succeeded" else None
            if calls.waited_for(name, job, served, deadline):
                break
            time.sleep(calls.CREATE_POLL_S)
            job = self.build(job.id)
        return created.model_copy(update={"build": job})

    def start_build(self, **fields: Any) -> BuildJob:
        """Start a build or fold job (``BuildRequest``'s fields: ``corpus=...``, ``kind="fold"``, ...); admin keys."""
        return self._answer(calls.start_build(fields))

    def build(self, build_id: str) -> BuildJob:
        """A build or fold job's state, progress and, once it ended, its summary or error."""
        return self._answer(calls.build(build_id))

    def builds(self) -> list[BuildJob]:
        """The latest builds and folds of every collection, newest first."""
        return self._answer(calls.builds())


class AsyncSearchClient:
    """``SearchClient`` for asyncio: the same methods, awaited (``pages`` and ``stream_answer`` are async
    iterators)."""

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

    async def _send(self, call: Call, stream: bool = False) -> httpx.Response:
        last = self.settings.max_retries
        for attempt in range(last + 1):
            try:
                r = await self.http.send(self.http.build_request(call.method, call.path, json=call.body,
                                                                 headers=calls.fresh(attempt)), stream=stream)
            except httpx.TransportError as e:
                wait = calls.resend_wait(call, attempt, error=e, max_wait_s=self.settings.max_retry_wait_s)
                if wait is None or attempt == last:
                    raise
                await asyncio.sleep(wait)
                continue
            wait = calls.resend_wait(call, attempt, r, max_wait_s=self.settings.max_retry_wait_s)
            if wait is None or attempt == last:
                break
            await r.aclose()
            await asyncio.sleep(wait)
        if r.status_code not in call.ok:
            await r.aread()
            await r.aclose()
            raise calls.error_of(r)
        return r

    async def _answer(self, call: Call) -> Any:
        return call.read(await self._send(call))

    async def search(self, query: Query, **options: Any) -> SearchResponse:
        return await self._answer(calls.search(calls.search_request(query, options)))

    async def pages(self, query: Query, **options: Any) -> AsyncIterator[SearchResponse]:
        req = calls.search_request(query, options)
        while req is not None:
            page = await self.search(req)
            yield page
            req = calls.next_page(req, page)

    async def search_batch(self, searches: Sequence[Query]) -> list[SearchResponse | SearchServiceError]:
        return await self._answer(calls.search_batch(searches))

    async def stream_answer(self, query: Query, **options: Any) -> AsyncIterator[AnswerStreamEvent]:
        r = await self._send(calls.stream_answer(calls.search_request(query, options)), stream=True)
        try:
            async for line in r.aiter_lines():
                if line.strip():
                    yield event(line)
        finally:
            await r.aclose()

    async def feedback(self, query: str, label: int, doc_id: str | None = None, **fields: Any) -> FeedbackResponse:
        return await self._answer(calls.feedback(query, label, doc_id, fields))

    async def health(self) -> HealthResponse:
        return await self._answer(calls.health())

    async def collections(self) -> list[CollectionInfo]:
        return (await self._answer(calls.collections())).collections

    async def upsert_documents(self, collection: str, documents: Sequence[dict[str, Any]]) -> WriteResponse:
        return await self._answer(calls.upsert_documents(collection, documents))

    async def get_document(self, collection: str, doc_id: str) -> DocumentResponse:
        return await self._answer(calls.get_document(collection, doc_id))

    async def delete_documents(self, collection: str, ids: Sequence[str]) -> WriteResponse:
        return await self._answer(calls.delete_documents(collection, ids))

    async def list_documents(self, collection: str, **fields: Any) -> DocumentsPage:
        return await self._answer(calls.list_documents(collection, fields))

    async def documents(self, collection: str, **fields: Any) -> AsyncIterator[DocumentResponse]:
        while True:
            page = await self.list_documents(collection, **fields)
            for document in page.documents:
                yield document
            if page.next_after is None:
                return
            fields = {**fields, "after": page.next_after}

    async def count_documents(self, collection: str, filters: dict[str, Any] | None = None) -> int:
        return (await self.list_documents(collection, filters=filters, limit=0)).total

    async def create_collection(self, name: str, documents: Sequence[dict[str, Any]], wait: bool = True,
                                timeout_s: float = 3600.0, **options: Any) -> CollectionCreated:
        created = await self._answer(calls.create_collection({"name": name, "documents": list(documents),
                                                              **options}))
        job, deadline = created.build, time.monotonic() + timeout_s
        while wait:
            served = {c.name for c in await self.collections()} if job.state == "succeeded" else None
            if calls.waited_for(name, job, served, deadline):
                break
            await asyncio.sleep(calls.CREATE_POLL_S)
            job = await self.build(job.id)
        return created.model_copy(update={"build": job})

    async def start_build(self, **fields: Any) -> BuildJob:
        return await self._answer(calls.start_build(fields))

    async def build(self, build_id: str) -> BuildJob:
        return await self._answer(calls.build(build_id))

    async def builds(self) -> list[BuildJob]:
        return await self._answer(calls.builds())
