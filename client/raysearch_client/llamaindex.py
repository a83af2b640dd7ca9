"""LlamaIndex over the service (``pip install "raysearch-client[llamaindex]"``): ``RaySearchRetriever``, the
service's ranked chunks as ``NodeWithScore``, for a ``RetrieverQueryEngine`` or anything else that takes a
retriever.

    retriever = RaySearchRetriever("http://127.0.0.1:8000", similarity_top_k=5, search_kwargs={"rerank": True})
    nodes = retriever.retrieve("compress a file")          # or await retriever.aretrieve(...)

A filter is LlamaIndex's ``MetadataFilters``, given as ``filters=`` (as to ``VectorIndexRetriever``) and translated
by ``filters.from_llamaindex``; the API's own syntax goes in ``search_kwargs={"filters": ...}``. Only this module
imports ``llama_index``.
"""

from __future__ import annotations

from typing import Any

from raysearch_client.extras import needs

with needs("llamaindex", "llama_index.core"):
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import (
        NodeRelationship,
        NodeWithScore,
        QueryBundle,
        RelatedNodeInfo,
        TextNode,
    )
    from llama_index.core.vector_stores.types import MetadataFilters

from raysearch_client.connection import Connection, check_fields, result_metadata, search_request
from raysearch_client.filters import from_llamaindex
from raysearch_client.models import Result, SearchResponse


def node(result: Result) -> NodeWithScore:
    """A ranked chunk as a node: its id the chunk id, its source (``ref_doc_id``) the document, its metadata as
    ``result_metadata`` gives it; the score is the result's ``relevance_score`` (the same scale for every query,
    so a ``SimilarityPostprocessor`` cutoff means the same for each; the method's own ``score`` is in metadata)."""
    text_node = TextNode(id_=result.chunk_id, text=result.content, metadata=result_metadata(result),
                         relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=result.doc_id)})
    return NodeWithScore(node=text_node, score=result.relevance_score)


class RaySearchRetriever(BaseRetriever):
    """The best ``similarity_top_k`` chunks for a query, searched with ``search_kwargs`` (any field of
    ``POST /search``: method, filters, collections, rerank, ...) and ``filters`` (LlamaIndex's ``MetadataFilters``,
    translated), checked by the API's model when made."""

    def __init__(self, url: str = "http://127.0.0.1:8000", api_key: str | None = None, similarity_top_k: int = 4,
                 search_kwargs: dict[str, Any] | None = None, timeout_s: float = 60.0,
                 callback_manager: CallbackManager | None = None, verbose: bool = False,
                 filters: MetadataFilters | None = None):
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        self.similarity_top_k = similarity_top_k
        self.filters = filters
        fields = dict(search_kwargs or {})
        if filters is not None:
            if fields.get("filters") is not None:
                raise ValueError("both filters (LlamaIndex's MetadataFilters) and search_kwargs['filters'] (the "
                                 "API's syntax) are given; give one")
            fields["filters"] = from_llamaindex(filters)
        self.search_kwargs = check_fields(fields)
        self._connection = Connection(url, api_key, timeout_s)

    def _request(self, query: QueryBundle):
        return search_request(query.query_str, self.similarity_top_k, self.search_kwargs, {})

    @staticmethod
    def _nodes(page: SearchResponse) -> list[NodeWithScore]:
        return [node(r) for r in page.results]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._nodes(self._connection.sync.search(self._request(query_bundle)))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._nodes(await self._connection.aio.search(self._request(query_bundle)))
