"""LangChain over the service (``pip install "raysearch-client[langchain]"``): ``RaySearchRetriever``, a retriever
of ranked chunks, and ``RaySearchVectorStore``, a vector store over a collection's documents API.

    retriever = RaySearchRetriever(url="http://127.0.0.1:8000", k=5, search_kwargs={"method": "hybrid"})
    docs = retriever.invoke("compress a file")            # or await retriever.ainvoke(...)

Both pass the search's fields through (``search_kwargs``, or keywords of a call), checked by the API's
``SearchRequest`` before anything is sent. A filter is LangChain's, as its vector stores take it: the store's
``filter=`` argument, or ``filter`` among the search fields (``search_kwargs={"filter": {"year": {"$gte": 2005}}}``),
translated by ``filters.from_langchain`` (which also passes the API's own syntax through); the API's ``filters``
field is taken as it is. Only this module imports ``langchain_core``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from raysearch_client.extras import needs

with needs("langchain", "langchain_core"):
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.utils import secret_from_env
    from langchain_core.vectorstores import VectorStore
from pydantic import Field, PrivateAttr, SecretStr, field_validator

from raysearch_client.calls import SearchServiceError
from raysearch_client.client import API_KEY_ENV
from raysearch_client.connection import (
    Connection,
    awrite_creating,
    batches,
    check_fields,
    result_metadata,
    search_request,
    write_creating,
)
from raysearch_client.filters import from_langchain
from raysearch_client.models import Result, SearchResponse


def api_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Search fields with ``filter`` (LangChain's filter syntax, ``from_langchain``) as the API's ``filters``; a
    ``filter`` of None is no filter. Raises ValueError on a filter that cannot be translated, or on both given."""
    if "filter" not in fields:
        return fields
    fields = dict(fields)
    given = fields.pop("filter")
    if given is not None:
        if fields.get("filters") is not None:
            raise ValueError("both filter (LangChain's syntax) and filters (the API's) are given; give one")
        fields["filters"] = from_langchain(given)
    return fields


def chunk_document(result: Result) -> Document:
    """A ranked chunk: its text, its id, and in metadata its document's metadata with ``doc_id``, ``chunk_id``,
    ``rank``, ``score`` and ``relevance_score`` (``result_metadata``)."""
    return Document(id=result.chunk_id, page_content=result.content, metadata=result_metadata(result))


class RaySearchRetriever(BaseRetriever):
    """The service's ranked chunks for a query, best first: ``k`` of them (a call's ``k=`` keyword wins), searched
    with ``search_kwargs`` (any field of ``POST /search``: method, filters, collections, rerank, group_by, ..., and
    ``filter`` in LangChain's syntax) and a call's other keywords on top."""

    url: str = "http://127.0.0.1:8000"
    api_key: SecretStr | None = Field(default_factory=secret_from_env(API_KEY_ENV, default=None),
                                      description="The service's key; default $RAYSEARCH_API_KEY.")
    k: int = Field(4, ge=1, le=100, description="Results to return (the request's limit).")
    search_kwargs: dict[str, Any] = Field(default_factory=dict, description="Fields of POST /search.")
    timeout_s: float = 60.0
    _connection: Connection = PrivateAttr()

    @field_validator("search_kwargs")
    @classmethod
    def _known_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_fields(api_fields(value))  # kept as given (``filter`` in LangChain's syntax), translated per search
        return value

    def model_post_init(self, context: Any) -> None:
        key = self.api_key.get_secret_value() if self.api_key is not None else None
        self._connection = Connection(self.url, key, self.timeout_s)

    def _documents(self, page: SearchResponse) -> list[Document]:
        return [chunk_document(r) for r in page.results]

    def _request(self, query: str, options: dict[str, Any]):
        k = options.pop("k", self.k)
        return search_request(query, k, api_fields(self.search_kwargs), api_fields(options))

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **options: Any) -> list[Document]:
        return self._documents(self._connection.sync.search(self._request(query, options)))

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **options: Any) -> list[Document]:
        return self._documents(await self._connection.aio.search(self._request(query, options)))


class RaySearchVectorStore(VectorStore):
    """A collection of the service as a LangChain vector store: documents are written, read and deleted through
    the documents API (searchable when the write returns), and searched with ``POST /search``.

    The service embeds: it chunks and embeds every written document with the collection's own encoder, and
    embeds each query with it too, so the vectors of the index and of its queries always come from one model.
    An ``Embeddings`` given here (``embedding=``) is kept for LangChain's sake and never called: vectors made
    on this side could not be searched against the collection's. For the same reason there is no search by
    vector.

    A search answers documents, not chunks: grouped by ``doc_id`` (``k`` documents), each with the text of its
    best chunk (the whole text of a document that fits one chunk), its id and its metadata as written; scores
    are ``relevance_score``, in [0, 1], higher is better; ``k`` is at most 100 (the API's limit). ``search_kwargs``
    (fields of ``POST /search``) apply to every search, a call's keywords on top. ``filter`` is LangChain's filter
    (``from_langchain``: ``{"year": {"$gte": 2005}}``, ``$and``, ``$or``, ``$not``), sent as the API's ``filters``.
    """

    def __init__(self, url: str = "http://127.0.0.1:8000", collection: str = "default", api_key: str | None = None,
                 embedding: Embeddings | None = None, search_kwargs: dict[str, Any] | None = None,
                 timeout_s: float = 60.0):
        self.collection = collection
        self.search_kwargs = check_fields(api_fields({"group_by": "doc_id", **(search_kwargs or {}),
                                                      "collections": [collection]}))
        self._embedding = embedding
        self._connection = Connection(url, api_key, timeout_s)

    @property
    def embeddings(self) -> Embeddings | None:
        return self._embedding

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings | None = None,
                   metadatas: list[dict[str, Any]] | None = None, *, ids: list[str] | None = None,
                   **kwargs: Any) -> RaySearchVectorStore:
        """A store over ``kwargs``' collection (``url=``, ``collection=``, ...), with ``texts`` written to it. A
        collection the service does not serve is created from them (``POST /admin/collections``: an admin key, and
        the service's ``collections_root``), returning once it is built and served."""
        store = cls(embedding=embedding, **kwargs)
        ids, batches = _records(list(texts), metadatas, ids)
        write_creating(store._connection.sync, store.collection, batches)
        return store

    @classmethod
    async def afrom_texts(cls, texts: list[str], embedding: Embeddings | None = None,
                          metadatas: list[dict[str, Any]] | None = None, *, ids: list[str] | None = None,
                          **kwargs: Any) -> RaySearchVectorStore:
        store = cls(embedding=embedding, **kwargs)
        ids, batches = _records(list(texts), metadatas, ids)
        await awrite_creating(store._connection.aio, store.collection, batches)
        return store

    # Writes: upserts of whole documents, 1,000 to a call (each call atomic).

    def add_texts(self, texts: Iterable[str], metadatas: list[dict[str, Any]] | None = None, *,
                  ids: list[str | None] | None = None, **kwargs: Any) -> list[str]:
        """Upsert documents (an id given replaces that document; a missing one is a new uuid4); their ids."""
        ids, batches = _records(list(texts), metadatas, ids)
        for batch in batches:
            self._connection.sync.upsert_documents(self.collection, batch)
        return ids

    async def aadd_texts(self, texts: Iterable[str], metadatas: list[dict[str, Any]] | None = None, *,
                         ids: list[str | None] | None = None, **kwargs: Any) -> list[str]:
        ids, batches = _records(list(texts), metadatas, ids)
        for batch in batches:
            await self._connection.aio.upsert_documents(self.collection, batch)
        return ids

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete these documents; ids the collection does not have are passed over (LangChain's rule), so a
        batch naming one becomes a delete per id (each atomic, the whole no longer)."""
        for batch in _deletes(ids):
            try:
                self._connection.sync.delete_documents(self.collection, batch)
            except SearchServiceError as e:
                if e.status != 404:
                    raise
                for doc_id in batch:
                    _unless_missing(lambda i=doc_id: self._connection.sync.delete_documents(self.collection, [i]))
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        client = self._connection.aio
        for batch in _deletes(ids):
            try:
                await client.delete_documents(self.collection, batch)
            except SearchServiceError as e:
                if e.status != 404:
                    raise
                for doc_id in batch:
                    try:
                        await client.delete_documents(self.collection, [doc_id])
                    except SearchServiceError as missing:
                        if missing.status != 404:
                            raise
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents of these ids that exist (whole texts), in the order asked."""
        found = [_unless_missing(lambda i=doc_id: self._connection.sync.get_document(self.collection, i))
                 for doc_id in ids]
        return [_whole(d) for d in found if d is not None]

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        client, found = self._connection.aio, []
        for doc_id in ids:
            try:
                found.append(_whole(await client.get_document(self.collection, doc_id)))
            except SearchServiceError as e:
                if e.status != 404:
                    raise
        return found

    # Searches.

    def _request(self, query: str, k: int, filter: dict[str, Any] | None, options: dict[str, Any]):
        return search_request(query, k, self.search_kwargs, api_fields({**options, "filter": filter}))

    def similarity_search_with_score(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        return _scored(self._connection.sync.search(self._request(query, k, filter, kwargs)))

    async def asimilarity_search_with_score(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                                            **kwargs: Any) -> list[tuple[Document, float]]:
        return _scored(await self._connection.aio.search(self._request(query, k, filter, kwargs)))

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, **kwargs)]

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, **kwargs)]

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      **kwargs: Any) -> list[Document]:
        """The service's MMR (``mmr_lambda``) over ``fetch_k`` candidates a leg; MMR does not group, so this
        answers chunks (a document's id, its best chunk's text) and may name a document twice."""
        options = {**kwargs, "mmr_lambda": lambda_mult, "candidates": max(fetch_k, k), "group_by": None}
        return self.similarity_search(query, k, **options)

    async def amax_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20,
                                             lambda_mult: float = 0.5, **kwargs: Any) -> list[Document]:
        options = {**kwargs, "mmr_lambda": lambda_mult, "candidates": max(fetch_k, k), "group_by": None}
        return await self.asimilarity_search(query, k, **options)

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return lambda score: score  # relevance_score is already in [0, 1], higher is better


def _records(texts: list[str], metadatas: list[dict[str, Any]] | None,
             ids: list[str | None] | None) -> tuple[list[str], list[list[dict[str, Any]]]]:
    """Each text as a record of the documents API (its id, text and metadata), cut into writes of 1,000."""
    metadatas = metadatas if metadatas is not None else [{} for _ in texts]
    given = ids if ids is not None else [None] * len(texts)
    if not len(texts) == len(metadatas) == len(given):
        raise ValueError(f"{len(texts)} texts, {len(metadatas)} metadatas and {len(given)} ids: give one of each "
                         "a text")
    ids = [i if i else str(uuid.uuid4()) for i in given]
    records = [{"id": i, "text": t, "metadata": dict(m)} for i, t, m in zip(ids, texts, metadatas, strict=True)]
    return ids, batches(records)


def _deletes(ids: list[str] | None) -> list[list[str]]:
    if ids is None:
        raise ValueError("name the documents to delete (ids): the service has no delete-all")
    unique = list(dict.fromkeys(ids))
    return batches(unique)


def _unless_missing(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except SearchServiceError as e:
        if e.status != 404:
            raise
        return None


def _whole(document) -> Document:
    """A stored document (``DocumentResponse``) as LangChain's: its whole text, its metadata, its id."""
    return Document(id=document.id, page_content=document.text, metadata=document.metadata)


def _scored(page: SearchResponse) -> list[tuple[Document, float]]:
    return [(Document(id=r.doc_id, page_content=r.content, metadata=r.metadata), r.relevance_score)
            for r in page.results]
