"""Haystack over the service (``pip install "raysearch-client[haystack]"``): ``RaySearchRetriever``, a component
whose ``run(query)`` answers ``{"documents": [Document]}``, the service's ranked chunks, for a ``Pipeline`` (or
``AsyncPipeline``: ``run_async``).

    pipeline = Pipeline()
    pipeline.add_component("retriever", RaySearchRetriever(url="http://127.0.0.1:8000", top_k=5))
    pipeline.run({"retriever": {"query": "compress a file"}})["retriever"]["documents"]

A run's ``filters`` are Haystack's (``{"field": "meta.year", "operator": ">=", "value": 2005}``, AND, OR, NOT),
translated by ``filters.from_haystack``; the API's own syntax goes in ``search_kwargs={"filters": ...}``. Only this
module imports ``haystack``.
"""

from __future__ import annotations

from typing import Any

from raysearch_client.extras import needs

with needs("haystack", "haystack"):
    from haystack import Document, component, default_from_dict, default_to_dict
    from haystack.utils import Secret, deserialize_secrets_inplace

from raysearch_client.client import API_KEY_ENV
from raysearch_client.connection import Connection, check_fields, result_metadata, search_request
from raysearch_client.filters import from_haystack
from raysearch_client.models import Result, SearchResponse

# The default key: the variable's value when the component is made (unset: no key), saved by its name.
FROM_ENV = Secret.from_env_var(API_KEY_ENV, strict=False)


def document(result: Result) -> Document:
    """A ranked chunk as a Haystack document: its id the chunk id, its score the result's ``relevance_score`` (the
    same scale for every query: a cut on it means the same for each), its meta as ``result_metadata`` gives it
    (``doc_id``, ``rank``, ``score``, the document's metadata)."""
    return Document(id=result.chunk_id, content=result.content, meta=result_metadata(result),
                    score=result.relevance_score)


@component
class RaySearchRetriever:
    """The best ``top_k`` chunks for a query, searched with ``search_kwargs`` (any field of ``POST /search``);
    a run's ``filters`` (a Haystack filter, sent as the request's ``filters``), ``top_k`` and ``search_kwargs``
    take their place."""

    def __init__(self, url: str = "http://127.0.0.1:8000",
                 api_key: Secret | str | None = FROM_ENV, top_k: int = 10,
                 search_kwargs: dict[str, Any] | None = None, timeout_s: float = 60.0):
        """``api_key``: a Haystack ``Secret`` (by default ``$RAYSEARCH_API_KEY``, read when the component is made;
        unset: no key), a key as a string (``Secret.from_token``: such a pipeline cannot be saved, as Haystack
        refuses to write a token out), or None for no key."""
        self.url, self.top_k, self.timeout_s = url, top_k, timeout_s
        self.api_key = Secret.from_token(api_key) if isinstance(api_key, str) else api_key
        self.search_kwargs = check_fields(dict(search_kwargs or {}))
        key = self.api_key.resolve_value() if self.api_key is not None else None
        # An environment variable's secret that is unset resolves to None: no key, not $RAYSEARCH_API_KEY again.
        self._connection = Connection(url, key or "", timeout_s)

    def to_dict(self) -> dict[str, Any]:
        # A secret from an environment variable is saved as the variable's name, so a reloaded pipeline reads it
        # again; a token secret raises (Haystack's rule: a key is never written into a pipeline's YAML).
        return default_to_dict(self, url=self.url, api_key=self.api_key.to_dict() if self.api_key else None,
                               top_k=self.top_k, search_kwargs=self.search_kwargs, timeout_s=self.timeout_s)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RaySearchRetriever:
        deserialize_secrets_inplace(data["init_parameters"], keys=["api_key"])
        return default_from_dict(cls, data)

    def _request(self, query: str, filters: dict[str, Any] | None, top_k: int | None,
                 search_kwargs: dict[str, Any] | None):
        options = dict(search_kwargs or {})
        if filters is not None:
            if options.get("filters") is not None:
                raise ValueError("a run got both filters (Haystack's syntax) and search_kwargs['filters'] (the "
                                 "API's); give one")
            options["filters"] = from_haystack(filters)
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
