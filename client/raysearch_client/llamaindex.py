"""LlamaIndex over the service (``pip install "raysearch-client[llamaindex]"``): ``RaySearchRetriever``, the
service's ranked chunks as ``NodeWithScore``, for a ``RetrieverQueryEngine`` or anything else that takes a
retriever; and ``RaySearchVectorStore``, a vector store over one collection's documents API, for a
``VectorStoreIndex``.

    retriever = RaySearchRetriever("http://127.0.0.1:8000", similarity_top_k=5, search_kwargs={"rerank": True})
    nodes = retriever.retrieve("compress a file")          # or await retriever.aretrieve(...)

A filter is LlamaIndex's ``MetadataFilters``, given as ``filters=`` (as to ``VectorIndexRetriever``) and translated
by ``filters.from_llamaindex``; the API's own syntax goes in ``search_kwargs={"filters": ...}``. Only this module
imports ``llama_index``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from raysearch_client.extras import needs

with needs("llamaindex", "llama_index.core"):
    from llama_index.core.bridge.pydantic import Field, PrivateAttr
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import (
        BaseNode,
        NodeRelationship,
        NodeWithScore,
        QueryBundle,
        RelatedNodeInfo,
        TextNode,
    )
    from llama_index.core.vector_stores.types import (
        BasePydanticVectorStore,
        MetadataFilters,
        VectorStoreQuery,
        VectorStoreQueryMode,
        VectorStoreQueryResult,
    )

from raysearch_client.calls import SearchServiceError
from raysearch_client.client import SearchClient
from raysearch_client.connection import (
    MAX_BATCH,
    Connection,
    awrite_creating,
    batches,
    check_fields,
    result_metadata,
    search_request,
    write_creating,
)
from raysearch_client.filters import from_llamaindex
from raysearch_client.models import CollectionInfo, DocumentResponse, Result, SearchRequest, SearchResponse

REF_DOC_ID = "ref_doc_id"  # the metadata field that holds a node's source document
# A query's mode as the search's method; DEFAULT keeps the store's (search_kwargs', else the service's: hybrid).
MODES = {VectorStoreQueryMode.DEFAULT: {}, VectorStoreQueryMode.HYBRID: {"method": "hybrid"},
         VectorStoreQueryMode.TEXT_SEARCH: {"method": "keyword"}}
STORE_FIELDS = ("group_by", "collections")  # the store's own: one result a node, from its collection


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


class RaySearchVectorStore(BasePydanticVectorStore):
    """A collection of the service as a LlamaIndex vector store: nodes written, listed and deleted through the
    documents API (searchable when a write returns), and searched with ``POST /search``, one result a node.

    Each node is a document of the collection: its id the node id, its text ``node.get_content()``, its metadata the
    node's with ``ref_doc_id`` added when the node has a source; it is read back as a ``TextNode`` of that id, text
    and metadata, its source (``ref_doc_id``) restored. Other relationships and a node's text templates are not kept.

    The service embeds: it chunks and embeds every written node with the collection's own encoder, and embeds each
    query's text with it too, so a node's ``embedding`` is not stored and a query needs ``query_str`` (its
    ``query_embedding`` is not used). ``is_embedding_query`` is False, so ``VectorIndexRetriever`` never embeds a
    query. A ``VectorStoreIndex`` still resolves an embed model when it is made (by default OpenAI's, from a package
    this client does not need), and embeds the nodes inserted through it, vectors this store drops: make it with
    ``embed_model=MockEmbedding(embed_dim=1)`` (from ``llama_index.core.embeddings``), which costs nothing.

    A query searches ``query_str`` grouped by ``doc_id`` (``similarity_top_k`` nodes, each with the text of its best
    chunk: the whole text of a node that fits one chunk), scored by ``relevance_score`` in [0, 1]. Its mode: DEFAULT
    (the store's ``search_kwargs``' method, else the service's), HYBRID or TEXT_SEARCH (keyword); its ``filters``
    (``MetadataFilters``, ``filters.from_llamaindex``) and ``doc_ids`` (source documents) are ANDed with
    ``search_kwargs``' ``filters``. A filter naming a field no document of the collection holds is refused by the
    service (422), ``delete(ref_doc_id)``'s excepted.
    """

    stores_text: bool = True
    is_embedding_query: bool = False
    url: str = Field("http://127.0.0.1:8000", description="Where the service is.")
    collection: str = Field("default", description="The collection that holds the nodes.")
    search_kwargs: dict[str, Any] = Field(default_factory=dict,
                                          description="Fields of POST /search for every query (not group_by, "
                                          "collections: the store's own).")
    timeout_s: float = 60.0
    _defaults: dict[str, Any] = PrivateAttr()
    _connection: Connection = PrivateAttr()

    def __init__(self, url: str = "http://127.0.0.1:8000", collection: str = "default", api_key: str | None = None,
                 search_kwargs: dict[str, Any] | None = None, timeout_s: float = 60.0, **kwargs: Any):
        """``api_key``: sent as ``Authorization: Bearer``; None reads ``$RAYSEARCH_API_KEY``. It is not a field, so
        the store's ``to_dict`` never holds it."""
        super().__init__(url=url, collection=collection, search_kwargs=dict(search_kwargs or {}),
                         timeout_s=timeout_s, **kwargs)
        self._defaults = check_fields({**_search_fields(self.search_kwargs), "group_by": "doc_id",
                                       "collections": [collection]})
        self._connection = Connection(url, api_key, timeout_s)

    @classmethod
    def class_name(cls) -> str:
        return "RaySearchVectorStore"

    @property
    def client(self) -> SearchClient:
        return self._connection.sync

    # Writes: upserts of whole documents, 1,000 to a call (each call atomic, the whole not).

    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        """Upsert the nodes (a node id given twice: its last); their ids, in order. A collection the service does not
        serve is created from the first 1,000 (``POST /admin/collections``: an admin key, and the service's
        ``collections_root``), so ``VectorStoreIndex.from_documents`` makes one; it returns once that is served."""
        write_creating(self._connection.sync, self.collection, batches(_records(nodes)))
        return [n.node_id for n in nodes]

    async def async_add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        await awrite_creating(self._connection.aio, self.collection, batches(_records(nodes)))
        return [n.node_id for n in nodes]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node whose source is ``ref_doc_id`` (listed by a filter on the ``ref_doc_id`` metadata)."""
        try:
            ids = [d.id for d in self._connection.sync.documents(self.collection, filters={REF_DOC_ID: ref_doc_id},
                                                                   limit=MAX_BATCH)]
        except SearchServiceError as e:
            if e.status != 422 or _holds_ref_doc_id(self._connection.sync.collections(), self.collection):
                raise
            return  # no document of the collection has a source (the service refuses a filter on a field it lacks)
        self._delete(ids)

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        client = self._connection.aio
        try:
            ids = [d.id async for d in client.documents(self.collection, filters={REF_DOC_ID: ref_doc_id},
                                                        limit=MAX_BATCH)]
        except SearchServiceError as e:
            if e.status != 422 or _holds_ref_doc_id(await client.collections(), self.collection):
                raise
            return
        await self._adelete(ids)

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Delete the nodes of these ids that the filters match; no ids: every node they match; neither: every
        node (the rule of LlamaIndex's ``SimpleVectorStore``). Ids the collection does not have are passed over."""
        self._delete([d.id for d in self._listed(node_ids, filters)])

    async def adelete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                            **delete_kwargs: Any) -> None:
        await self._adelete([d.id async for d in self._alisted(node_ids, filters)])

    def clear(self) -> None:
        self.delete_nodes()

    async def aclear(self) -> None:
        await self.adelete_nodes()

    def _delete(self, ids: list[str]) -> None:
        for batch in batches(ids):
            self._connection.sync.delete_documents(self.collection, batch)

    async def _adelete(self, ids: list[str]) -> None:
        for batch in batches(ids):
            await self._connection.aio.delete_documents(self.collection, batch)

    # Reads.

    def get_nodes(self, node_ids: list[str] | None = None,
                  filters: MetadataFilters | None = None) -> list[BaseNode]:
        """The nodes of these ids (those the collection has) that the filters match; no ids: every node they
        match; in id order."""
        return [_stored_node(d) for d in self._listed(node_ids, filters)]

    async def aget_nodes(self, node_ids: list[str] | None = None,
                         filters: MetadataFilters | None = None) -> list[BaseNode]:
        return [_stored_node(d) async for d in self._alisted(node_ids, filters)]

    def _listed(self, node_ids: list[str] | None, filters: MetadataFilters | None) -> Iterator[DocumentResponse]:
        for fields in _listings(node_ids, filters):
            yield from self._connection.sync.documents(self.collection, **fields)

    async def _alisted(self, node_ids: list[str] | None,
                       filters: MetadataFilters | None) -> AsyncIterator[DocumentResponse]:
        for fields in _listings(node_ids, filters):
            async for document in self._connection.aio.documents(self.collection, **fields):
                yield document

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The best ``similarity_top_k`` nodes for ``query_str``; ``kwargs`` are fields of ``POST /search`` for this
        query (a retriever's ``vector_store_kwargs``)."""
        return _result(self._connection.sync.search(self._request(query, kwargs)))

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        return _result(await self._connection.aio.search(self._request(query, kwargs)))

    def _request(self, query: VectorStoreQuery, options: dict[str, Any]) -> SearchRequest:
        fields = {**self._defaults, **_mode(query), **_search_fields(options)}
        fields["filters"] = _all_of([fields.get("filters"), *_query_filters(query)])
        return search_request(_query_text(query), query.similarity_top_k, fields, {})


def _search_fields(fields: dict[str, Any]) -> dict[str, Any]:
    own = [f for f in STORE_FIELDS if f in fields]
    if own:
        raise ValueError(f"{own} are the vector store's own (one result a node, from its collection): not search "
                         "fields to give it")
    return fields


def _records(nodes: Sequence[BaseNode]) -> list[dict[str, Any]]:
    """Each node as a record of the documents API, one per node id (the last given)."""
    return list({n.node_id: _record(n) for n in nodes}.values())


def _record(node: BaseNode) -> dict[str, Any]:
    text = node.get_content()
    if not text:
        raise ValueError(f"node {node.node_id!r} has no text: the service stores and embeds text (an image or an "
                         "embedding alone cannot be written)")
    metadata = dict(node.metadata)
    if node.ref_doc_id is not None:
        metadata[REF_DOC_ID] = node.ref_doc_id
    return {"id": node.node_id, "text": text, "metadata": metadata}


def _text_node(node_id: str, text: str, metadata: dict[str, Any]) -> TextNode:
    """A stored node as LlamaIndex's: ``ref_doc_id`` out of its metadata, back as its source."""
    metadata = dict(metadata)
    ref_doc_id = metadata.pop(REF_DOC_ID, None)
    relationships = ({NodeRelationship.SOURCE: RelatedNodeInfo(node_id=ref_doc_id)}
                     if isinstance(ref_doc_id, str) else {})
    return TextNode(id_=node_id, text=text, metadata=metadata, relationships=relationships)


def _stored_node(document: DocumentResponse) -> TextNode:
    return _text_node(document.id, document.text, document.metadata)


def _result(page: SearchResponse) -> VectorStoreQueryResult:
    return VectorStoreQueryResult(nodes=[_text_node(r.doc_id, r.content, r.metadata) for r in page.results],
                                  similarities=[r.relevance_score for r in page.results],
                                  ids=[r.doc_id for r in page.results])


def _listings(node_ids: list[str] | None, filters: MetadataFilters | None) -> list[dict[str, Any]]:
    """The listings (fields of ``documents``) that find these nodes: one for a filter alone, one a 1,000 ids."""
    base = {"filters": (from_llamaindex(filters) if filters is not None else None) or None, "limit": MAX_BATCH}
    if node_ids is None:
        return [base]
    return [{**base, "ids": ids} for ids in batches(list(dict.fromkeys(node_ids)))]


def _query_text(query: VectorStoreQuery) -> str:
    if not query.query_str:
        raise ValueError("the service searches by text and embeds the query itself: give the query's query_str (a "
                         "query_embedding alone cannot be searched against the collection's vectors)")
    return query.query_str


def _mode(query: VectorStoreQuery) -> dict[str, Any]:
    """The search fields of the query's mode; a query field with no counterpart here raises ValueError."""
    if query.mode not in MODES:
        raise ValueError(f"query mode {query.mode.value!r} is not supported; supported: "
                         f"{', '.join(m.value for m in MODES)}")
    if query.node_ids:
        raise ValueError("a query restricted to node_ids cannot be searched (POST /search filters on metadata, not "
                         "ids; make the index without store_nodes_override)")
    given = [f for f in ("alpha", "mmr_threshold", "sparse_top_k", "hybrid_top_k") if getattr(query, f) is not None]
    if given:
        raise ValueError(f"query fields {given} have no counterpart here; give the search's own fields as the "
                         "retriever's vector_store_kwargs (fusion, weights, mmr_lambda, candidates)")
    return MODES[query.mode]


def _query_filters(query: VectorStoreQuery) -> list[dict[str, Any] | None]:
    """The query's ``filters`` and ``doc_ids`` (its source documents) as API filters."""
    return [from_llamaindex(query.filters) if query.filters is not None else None,
            {REF_DOC_ID: {"in": list(query.doc_ids)}} if query.doc_ids is not None else None]


def _all_of(filters: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The API filter every one of these matches (an empty or missing one matches everything)."""
    given = [f for f in filters if f]
    return None if not given else given[0] if len(given) == 1 else {"$and": given}


def _holds_ref_doc_id(collections: list[CollectionInfo], collection: str) -> bool:
    """Whether the collection's metadata fields (GET /collections: its version's and its written documents') name
    ``ref_doc_id``."""
    return any(f.name == REF_DOC_ID for c in collections if c.name == collection for f in c.fields)


