"""What the framework adapters share: where the service is, the clients that reach it, and a search request made
of an adapter's defaults and one call's options.

An adapter is built from plain settings (an address, a key), as frameworks build and copy their components, so it
cannot hold a client passed in; it opens its own here. One ``SearchClient`` serves every sync call. An async call
gets the ``AsyncSearchClient`` of the event loop it runs on: an ``httpx.AsyncClient``'s pooled connections belong
to the loop that opened them, and frameworks run coroutines on loops of their own (a new one per ``asyncio.run``).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from raysearch_client.client import AsyncSearchClient, SearchClient
from raysearch_client.models import Result, SearchRequest

MAX_BATCH = 1000  # documents in one write, one delete or one listed page (the API's limit)


def batches(items: list[Any]) -> list[list[Any]]:
    """``items`` cut into calls of at most ``MAX_BATCH`` (each call atomic, the whole not)."""
    return [items[n:n + MAX_BATCH] for n in range(0, len(items), MAX_BATCH)]


class Connection:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 60.0):
        self.base_url, self.api_key, self.timeout = base_url, api_key, timeout
        self._sync: SearchClient | None = None
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncSearchClient] = (
            weakref.WeakKeyDictionary())

    @property
    def sync(self) -> SearchClient:
        if self._sync is None:
            self._sync = SearchClient(self.base_url, api_key=self.api_key, timeout=self.timeout)
        return self._sync

    @property
    def aio(self) -> AsyncSearchClient:
        """The async client of the running event loop (made on its first call there)."""
        loop = asyncio.get_running_loop()
        if loop not in self._by_loop:
            self._by_loop[loop] = AsyncSearchClient(self.base_url, api_key=self.api_key, timeout=self.timeout)
        return self._by_loop[loop]

    def close(self) -> None:
        """Close the sync client (an async one closes with its loop's end, or with ``aclose`` on that loop)."""
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        client = self._by_loop.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()


def write_creating(client: SearchClient, collection: str, batches: list[list[dict[str, Any]]],
                   served: bool | None = None) -> None:
    """Upsert ``batches`` of records into ``collection``; a collection the service does not serve is created first
    from the first batch (a build job, waited for: admin keys), the rest written to it after. ``served``: whether the
    caller knows it is served (None: asked of ``GET /collections``)."""
    if served is None:
        served = is_served(client, collection)
    if batches and not served:
        client.create_collection(collection, batches[0])
        batches = batches[1:]
    for batch in batches:
        client.upsert_documents(collection, batch)


async def awrite_creating(client: AsyncSearchClient, collection: str, batches: list[list[dict[str, Any]]],
                          served: bool | None = None) -> None:
    if served is None:
        served = await ais_served(client, collection)
    if batches and not served:
        await client.create_collection(collection, batches[0])
        batches = batches[1:]
    for batch in batches:
        await client.upsert_documents(collection, batch)


def is_served(client: SearchClient, collection: str) -> bool:
    return collection in {c.name for c in client.collections()}


async def ais_served(client: AsyncSearchClient, collection: str) -> bool:
    return collection in {c.name for c in await client.collections()}


def search_request(query: str, limit: int, defaults: dict[str, Any], options: dict[str, Any]) -> SearchRequest:
    """``POST /search``'s body: the adapter's default fields, then this call's, with the framework's result count
    as ``limit``; checked by the API's model, so a misspelt field fails here, before anything is sent."""
    return SearchRequest.model_validate({**defaults, **options, "query": query, "limit": limit})


def check_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Search fields given to an adapter up front, checked once (a typo fails when the adapter is made)."""
    if "query" in fields or "limit" in fields:
        raise ValueError("the query and the result count are each call's own (query, and k or top_k): "
                         f"not search fields of the adapter ({sorted(fields)})")
    SearchRequest.model_validate({**fields, "query": "-"})
    return fields


def result_metadata(result: Result) -> dict[str, Any]:
    """A result's chunk metadata (its document's) with where it came from and how it scored; the result's own
    names (``doc_id``, ``chunk_id``, ``score``, ...) win over a metadata field of the same name."""
    return {**result.metadata, "doc_id": result.doc_id, "chunk_id": result.chunk_id, "collection": result.collection,
            "title": result.title, "source": result.source, "rank": result.rank, "score": result.score,
            "relevance_score": result.relevance_score}
