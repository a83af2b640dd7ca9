"""Haystack over the service (``pip install "raysearch-client[haystack]"``): ``RaySearchRetriever``, a component
whose ``run(query)`` answers ``{"documents": [Document]}``, the service's ranked chunks, for a ``Pipeline`` (or
``AsyncPipeline``: ``run_async``).

    pipeline = Pipeline()
    pipeline.add_component("retriever", RaySearchRetriever(url="http://127.0.0.1:8000", top_k=5))
    pipeline.run({"retriever": {"query": "compress a file"}})["retriever"]["documents"]

Only this module imports ``haystack``.
"""

from __future__ import annotations

from typing import Any

from haystack import Document, component, default_to_dict

from raysearch_client.connection import Connection, check_fields, result_metadata, search_request
from raysearch_client.models import Result, SearchResponse


def document(result: Result) -> Document:
    """A ranked chunk as a Haystack document: its id the chunk id, its score the result's ``score``, its meta as
    ``result_metadata`` gives it (``doc_id``, ``rank``, ``relevance_score``, the document's metadata)."""
    return Document(id=result.chunk_id, content=result.content, meta=result_metadata(result), score=result.score)


@component
class RaySearchRetriever:
    """The best ``top_k`` chunks for a query, searched with ``search_kwargs`` (any field of ``POST /search``);
    a run's ``filters`` (the request's metadata filter), ``top_k`` and ``search_kwargs`` take their place."""

    def __init__(self, url: str = "http://127.0.0.1:8000", api_key: str | None = None, top_k: int = 10,
                 search_kwargs: dict[str, Any] | None = None, timeout_s: float = 60.0):
        self.url, self.api_key, self.top_k, self.timeout_s = url, api_key, top_k, timeout_s
        self.search_kwargs = check_fields(dict(search_kwargs or {}))
        self._connection = Connection(url, api_key, timeout_s)

    def to_dict(self) -> dict[str, Any]:
        # The key stays out of a pipeline's saved YAML: give it again when loading.
        return default_to_dict(self, url=self.url, top_k=self.top_k, search_kwargs=self.search_kwargs,
                               timeout_s=self.timeout_s)

    def _request(self, query: str, filters: dict[str, Any] | None, top_k: int | None,
                 search_kwargs: dict[str, Any] | None):
        options = dict(search_kwargs or {})
        if filters is not None:
            options["filters"] = filters
        return search_request(query, top_k or self.top_k, self.search_kwargs, options)

    @staticmethod
    def _documents(page: SearchResponse) -> dict[str, list[Document]]:
        return {"documents": [document(r) for r in page.results]}

    @component.output_types(documents=list[Document])
    def run(self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None,
            search_kwargs: dict[str, Any] | None = None) -> dict[str, list[Document]]:
        return self._documents(self._connection.sync.search(self._request(query, filters, top_k, search_kwargs)))

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None,
                        search_kwargs: dict[str, Any] | None = None) -> dict[str, list[Document]]:
        page = await self._connection.aio.search(self._request(query, filters, top_k, search_kwargs))
        return self._documents(page)
