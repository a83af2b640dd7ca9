"""Haystack over the service (``pip install "raysearch-client[haystack]"``): ``RaySearchRetriever``, a component
whose ``run(query)`` answers ``{"documents": [Document]}``, the service's ranked chunks, for a ``Pipeline`` (or
``AsyncPipeline``: ``run_async``); and ``RaySearchDocumentStore``, a Haystack ``DocumentStore`` over one collection's
documents API, for a ``DocumentWriter`` and anything else that writes, lists or deletes documents.

    pipeline = Pipeline()
    pipeline.add_component("retriever", RaySearchRetriever(url="http://127.0.0.1:8000", top_k=5))
    pipeline.run({"retriever": {"query": "compress a file"}})["retriever"]["documents"]

Filters are Haystack's (``{"field": "meta.year", "operator": ">=", "value": 2005}``, AND, OR, NOT), translated by
``filters.from_haystack``; the API's own syntax goes in the retriever's ``search_kwargs={"filters": ...}``. Only this
module imports ``haystack``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from raysearch_client.extras import needs

with needs("haystack", "haystack"):
    from haystack import Document, component, default_from_dict, default_to_dict
    from haystack.document_stores.errors import DuplicateDocumentError
    from haystack.document_stores.types import DuplicatePolicy
    from haystack.errors import FilterError
    from haystack.utils import Secret, deserialize_secrets_inplace

from raysearch_client.calls import SearchServiceError
from raysearch_client.client import API_KEY_ENV
from raysearch_client.connection import (
    MAX_BATCH,
    Connection,
    ais_served,
    awrite_creating,
    batches,
    check_fields,
    is_served,
    result_metadata,
    search_request,
    write_creating,
)
from raysearch_client.filters import from_haystack, haystack_selection
from raysearch_client.models import DocumentResponse, Result, SearchResponse

# The default key: the variable's value when the component is made (unset: no key), saved by its name.
FROM_ENV = Secret.from_env_var(API_KEY_ENV, strict=False)


def secret(api_key: Secret | str | None) -> Secret | None:
    """A key as Haystack keeps it: a string is a token secret (which Haystack refuses to save)."""
    return Secret.from_token(api_key) if isinstance(api_key, str) else api_key


def connection(url: str, api_key: Secret | None, timeout_s: float) -> Connection:
    # An environment variable's secret that is unset resolves to None: no key, not $RAYSEARCH_API_KEY again.
    key = api_key.resolve_value() if api_key is not None else None
    return Connection(url, key or "", timeout_s)


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
        self.api_key = secret(api_key)
        self.search_kwargs = check_fields(dict(search_kwargs or {}))
        self._connection = connection(url, self.api_key, timeout_s)

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


class RaySearchDocumentStore:
    """A collection of the service as a Haystack ``DocumentStore``: documents written, listed by a filter, counted and
    deleted through the documents API (searchable when a write returns; ``RaySearchRetriever`` searches them).

    A Document is a record ``{"id": doc.id, "text": doc.content, "metadata": doc.meta}`` and is read back as
    ``Document(id=, content=, meta=)``. The service embeds: it chunks and embeds every written document with the
    collection's own encoder, so a Document's ``embedding`` (and ``sparse_embedding``, ``blob``, ``score``) is not
    stored: vectors made on this side could not be searched against the collection's. A Document without text is
    refused.

    Filters are Haystack's, translated by ``filters.from_haystack`` (where its rules and Haystack's differ, it says
    so); one the service refuses (422: an unknown field, a range on a string) raises Haystack's ``FilterError`` with
    the service's message (but an empty collection answers such a filter with no document). ``== None`` and
    ``!= None`` are the API's ``exists`` (false, true); ``in`` and ``not in`` with None among the values raise
    ``FilterError``. ``write_documents`` with ``DuplicatePolicy.NONE`` overwrites, as
    OVERWRITE does.

    Beyond Haystack's protocol, as its extended stores have them (each with an ``_async`` variant): deleting all
    documents or those a filter selects, merging metadata into those a filter selects, counting them, and reading
    metadata fields (their types, a field's distinct values, its min and max). Each lists what it needs through the
    documents API (every page) and writes or deletes in batches of 1,000: none is atomic as a whole.
    """

    def __init__(self, url: str = "http://127.0.0.1:8000", collection: str = "default",
                 api_key: Secret | str | None = FROM_ENV, timeout_s: float = 60.0):
        """``api_key``: as ``RaySearchRetriever``'s (a ``Secret``, by default ``$RAYSEARCH_API_KEY``; a string is a
        token secret, which Haystack refuses to save; None: no key)."""
        self.url, self.collection, self.timeout_s = url, collection, timeout_s
        self.api_key = secret(api_key)
        self._connection = connection(url, self.api_key, timeout_s)
        self._served = False  # the collection seen served: writes need not ask again whether to create it

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, url=self.url, collection=self.collection,
                               api_key=self.api_key.to_dict() if self.api_key else None, timeout_s=self.timeout_s)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RaySearchDocumentStore:
        deserialize_secrets_inplace(data["init_parameters"], keys=["api_key"])
        return default_from_dict(cls, data)

    def count_documents(self) -> int:
        return self._connection.sync.count_documents(self.collection)

    async def count_documents_async(self) -> int:
        return await self._connection.aio.count_documents(self.collection)

    def filter_documents(self, filters: dict[str, Any] | None = None) -> list[Document]:
        """Every document the filter lets through (every page read), in id order."""
        return [_document(d) for d in self._stored(filters)]

    async def filter_documents_async(self, filters: dict[str, Any] | None = None) -> list[Document]:
        return [_document(d) for d in await self._astored(filters)]

    def write_documents(self, documents: list[Document], policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        """Upsert the documents, 1,000 to a call (each call atomic, the whole not); into a collection the service does
        not serve, it is created from the first 1,000 (``POST /admin/collections``: an admin key and the service's
        ``collections_root``; returns once it is served). FAIL raises
        ``DuplicateDocumentError`` before anything is written when an id exists (or comes twice); SKIP writes the
        ids that do not exist (the first of an id given twice); OVERWRITE and NONE write all (the last of an id
        given twice). Returns how many were written (under OVERWRITE and NONE, as many as were given)."""
        records = _records(documents)
        served = self._served = self._served or is_served(self._connection.sync, self.collection)
        existing: set[str] = set()
        if served and policy in (DuplicatePolicy.FAIL, DuplicatePolicy.SKIP):
            existing = {i for ids in batches(_ids(records)) for i in self._existing(ids)}
        written = _to_write(records, existing, policy)
        write_creating(self._connection.sync, self.collection, batches(written), served)
        return _written(documents, written, policy)

    async def write_documents_async(self, documents: list[Document],
                                    policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        records = _records(documents)
        served = self._served = self._served or await ais_served(self._connection.aio, self.collection)
        existing: set[str] = set()
        if served and policy in (DuplicatePolicy.FAIL, DuplicatePolicy.SKIP):
            existing = {i for ids in batches(_ids(records)) for i in await self._aexisting(ids)}
        written = _to_write(records, existing, policy)
        await awrite_creating(self._connection.aio, self.collection, batches(written), served)
        return _written(documents, written, policy)

    def delete_documents(self, document_ids: list[str]) -> None:
        """Delete these documents; ids the collection does not have are passed over (the API refuses a delete
        naming one, so each batch is listed first and only what exists is deleted)."""
        for ids in batches(list(dict.fromkeys(document_ids))):
            found = self._existing(ids)
            if found:
                self._connection.sync.delete_documents(self.collection, found)

    async def delete_documents_async(self, document_ids: list[str]) -> None:
        for ids in batches(list(dict.fromkeys(document_ids))):
            found = await self._aexisting(ids)
            if found:
                await self._connection.aio.delete_documents(self.collection, found)

    def delete_all_documents(self, recreate_index: bool = False) -> None:
        """Delete every document of the collection. ``recreate_index`` (Haystack's name) changes nothing: the
        collection's index, encoder and settings are the service's, made by a build job and kept; through the documents
        API a collection is emptied, never recreated, and an emptied one takes writes as a new one does."""
        self.delete_by_filter({})

    async def delete_all_documents_async(self, recreate_index: bool = False) -> None:
        await self.delete_by_filter_async({})

    def delete_by_filter(self, filters: dict[str, Any]) -> int:
        """Delete the documents the filter selects (``{}``: all), 1,000 to a call; returns how many."""
        ids = [d.id for d in self._stored(filters)]
        for batch in batches(ids):
            self._connection.sync.delete_documents(self.collection, batch)
        return len(ids)

    async def delete_by_filter_async(self, filters: dict[str, Any]) -> int:
        ids = [d.id for d in await self._astored(filters)]
        for batch in batches(ids):
            await self._connection.aio.delete_documents(self.collection, batch)
        return len(ids)

    def update_by_filter(self, filters: dict[str, Any], meta: dict[str, Any]) -> int:
        """Merge ``meta`` into the metadata of the documents the filter selects (its keys replace theirs; the rest
        is kept), rewritten 1,000 to a call (the service embeds each again); returns how many."""
        records = [_merged(d, meta) for d in self._stored(filters)]
        for batch in batches(records):
            self._connection.sync.upsert_documents(self.collection, batch)
        return len(records)

    async def update_by_filter_async(self, filters: dict[str, Any], meta: dict[str, Any]) -> int:
        records = [_merged(d, meta) for d in await self._astored(filters)]
        for batch in batches(records):
            await self._connection.aio.upsert_documents(self.collection, batch)
        return len(records)

    def count_documents_by_filter(self, filters: dict[str, Any]) -> int:
        """How many documents the filter selects, counted by the service (no document is read)."""
        selection = _selection(filters)
        if selection is None:
            return 0
        try:
            with _filter_refused():
                return self._connection.sync.count_documents(self.collection, selection.get("filters"))
        except FilterError:
            if self.count_documents() == 0:
                return 0  # nothing to select (see _stored)
            raise

    async def count_documents_by_filter_async(self, filters: dict[str, Any]) -> int:
        selection = _selection(filters)
        if selection is None:
            return 0
        try:
            with _filter_refused():
                return await self._connection.aio.count_documents(self.collection, selection.get("filters"))
        except FilterError:
            if await self.count_documents_async() == 0:
                return 0
            raise

    def count_unique_metadata_by_filter(self, filters: dict[str, Any], metadata_fields: list[str]) -> dict[str, int]:
        """For each field (with or without ``meta.``), how many distinct values the selected documents hold (None
        and a missing field not counted; values of different types are different: 1, 1.0, "1", True)."""
        return _unique_counts(self._stored(filters), metadata_fields)

    async def count_unique_metadata_by_filter_async(self, filters: dict[str, Any],
                                                    metadata_fields: list[str]) -> dict[str, int]:
        return _unique_counts(await self._astored(filters), metadata_fields)

    def get_metadata_fields_info(self) -> dict[str, dict[str, str]]:
        """Each metadata field the documents hold, with its type as Haystack's in-memory store names it from the
        values (``boolean``, ``int``, ``float``, ``keyword``; ``mixed`` where they differ). Read from the documents
        (all of them), not from ``GET /collections``: that lists the fields of the index version too, kept when its
        documents are deleted (an emptied collection would still name them), and kinds of the service's own."""
        return _fields_info(self._stored(None))

    async def get_metadata_fields_info_async(self) -> dict[str, dict[str, str]]:
        return _fields_info(await self._astored(None))

    def get_metadata_field_min_max(self, metadata_field: str) -> dict[str, Any]:
        """``{"min": ..., "max": ...}`` of a field's numbers, or of its strings (ISO dates order as dates), over every
        document (all read: a field no filter may name, as no document holds it, answers None and None too); None
        and None when no document holds it or its values cannot be ordered together."""
        return _min_max(self._stored(None), metadata_field)

    async def get_metadata_field_min_max_async(self, metadata_field: str) -> dict[str, Any]:
        return _min_max(await self._astored(None), metadata_field)

    def get_metadata_field_unique_values(self, metadata_field: str, search_term: str | None = None, from_: int = 0,
                                         size: int = 10,
                                         filters: dict[str, Any] | None = None) -> tuple[list[Any], int]:
        """A page (``from_``, ``size``) of a field's distinct values among the documents the filter selects, those
        whose text holds ``search_term`` (any case), ordered by their text (then type), and how many there are.
        Values keep their type; 1, 1.0, "1" and True are four values."""
        return _unique_page(self._stored(filters), metadata_field, search_term, from_, size)

    async def get_metadata_field_unique_values_async(self, metadata_field: str, search_term: str | None = None,
                                                     from_: int = 0, size: int = 10,
                                                     filters: dict[str, Any] | None = None) -> tuple[list[Any], int]:
        return _unique_page(await self._astored(filters), metadata_field, search_term, from_, size)

    def _stored(self, filters: dict[str, Any] | None) -> list[DocumentResponse]:
        """Every document the filter selects (every page read), as the service holds it. A filter the service refuses
        selects nothing from an empty collection: a field no document holds may be unknown to the service (refused,
        422), where Haystack's stores select no document."""
        selection = _selection(filters)
        if selection is None:
            return []
        try:
            with _filter_refused():
                return list(self._connection.sync.documents(self.collection, **selection))
        except FilterError:
            if self.count_documents() == 0:
                return []
            raise

    async def _astored(self, filters: dict[str, Any] | None) -> list[DocumentResponse]:
        selection = _selection(filters)
        if selection is None:
            return []
        try:
            with _filter_refused():
                return [d async for d in self._connection.aio.documents(self.collection, **selection)]
        except FilterError:
            if await self.count_documents_async() == 0:
                return []
            raise

    def _existing(self, ids: list[str]) -> list[str]:
        """Those of (at most 1,000) ids that the collection has."""
        page = self._connection.sync.list_documents(self.collection, ids=ids, limit=MAX_BATCH)
        return [d.id for d in page.documents]

    async def _aexisting(self, ids: list[str]) -> list[str]:
        page = await self._connection.aio.list_documents(self.collection, ids=ids, limit=MAX_BATCH)
        return [d.id for d in page.documents]


def _selection(filters: dict[str, Any] | None) -> dict[str, Any] | None:
    """The listing's fields for a Haystack filter (no filter, or ``{}``: every document); None when the filter
    matches no document. Raises ``FilterError`` on a filter with no exact translation."""
    if not filters:
        return {"limit": MAX_BATCH}
    try:
        selection = haystack_selection(filters)
    except ValueError as e:
        raise FilterError(str(e)) from e
    return None if selection is None else {"filters": selection or None, "limit": MAX_BATCH}


@contextmanager
def _filter_refused() -> Iterator[None]:
    """The service's refusal of a filter (422) as Haystack's ``FilterError``, with the service's message."""
    try:
        yield
    except SearchServiceError as e:
        if e.status != 422:
            raise
        raise FilterError(e.message) from e


def _records(documents: Any) -> list[dict[str, Any]]:
    """Each Document as a record of the documents API; ValueError for anything but a list of Documents with text."""
    if not isinstance(documents, list) or not all(isinstance(d, Document) for d in documents):
        raise ValueError(f"write_documents takes a list of Haystack Documents, got {type(documents).__name__}: "
                         f"{documents!r:.200}")
    for d in documents:
        if not d.content:
            raise ValueError(f"Document {d.id!r} has no content: the service stores and embeds text (a blob or an "
                             "embedding alone cannot be written)")
    return [{"id": d.id, "text": d.content, "metadata": dict(d.meta)} for d in documents]


def _ids(records: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["id"] for r in records))


def _to_write(records: list[dict[str, Any]], existing: set[str], policy: DuplicatePolicy) -> list[dict[str, Any]]:
    """The records a policy writes, one per id: FAIL raises ``DuplicateDocumentError`` on an id that exists or comes
    twice; SKIP drops ids that exist and keeps an id's first record; OVERWRITE and NONE keep an id's last."""
    if policy == DuplicatePolicy.FAIL:
        taken = sorted(existing | {i for i, n in Counter(r["id"] for r in records).items() if n > 1})
        if taken:
            raise DuplicateDocumentError(f"ids already in the collection or given twice: {taken[:10]}; write them "
                                         "with DuplicatePolicy.OVERWRITE or SKIP")
        return records
    if policy == DuplicatePolicy.SKIP:
        first: dict[str, dict[str, Any]] = {}
        for r in records:
            if r["id"] not in existing:
                first.setdefault(r["id"], r)
        return list(first.values())
    return list({r["id"]: r for r in records}.values())


def _written(documents: list[Document], written: list[dict[str, Any]], policy: DuplicatePolicy) -> int:
    """The count Haystack's protocol asks for: every Document given under OVERWRITE (and NONE, which overwrites),
    else the records written."""
    return len(documents) if policy in (DuplicatePolicy.OVERWRITE, DuplicatePolicy.NONE) else len(written)


def _document(stored: DocumentResponse) -> Document:
    return Document(id=stored.id, content=stored.text, meta=stored.metadata)


def _merged(stored: DocumentResponse, meta: dict[str, Any]) -> dict[str, Any]:
    """A stored document as a record to write again, ``meta`` merged into its metadata (title and text kept)."""
    return {"id": stored.id, "title": stored.title, "text": stored.text, "metadata": {**stored.metadata, **meta}}


def _field(name: str) -> str:
    """A metadata field's name as the documents hold it (Haystack writes it with or without ``meta.``)."""
    return name.removeprefix("meta.")


def _distinct(documents: Iterable[DocumentResponse], name: str) -> dict[tuple[str, str], Any]:
    """A field's distinct non-null values, each under its type and JSON text (so 1, 1.0, "1" and True stay four, and
    lists and dicts can be told apart), in the documents' order."""
    values: dict[tuple[str, str], Any] = {}
    for d in documents:
        value = d.metadata.get(_field(name))
        if value is not None:
            values.setdefault((type(value).__name__, json.dumps(value, sort_keys=True, default=str)), value)
    return values


def _unique_counts(documents: list[DocumentResponse], names: list[str]) -> dict[str, int]:
    return {_field(name): len(_distinct(documents, name)) for name in names}


def _unique_page(documents: list[DocumentResponse], name: str, search_term: str | None, from_: int,
                 size: int) -> tuple[list[Any], int]:
    """Haystack's in-memory store's rule: values holding ``search_term`` (any case) in their text, ordered by their
    text then their type's name; the page ``[from_, from_ + size)`` and how many there are in all."""
    found = [(key, value) for key, value in _distinct(documents, name).items()
             if not search_term or search_term.lower() in str(value).lower()]
    found.sort(key=lambda kv: (str(kv[1]), kv[0][0]))
    return [value for _, value in found[from_:from_ + size]], len(found)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "int"
    return "float" if isinstance(value, float) else "keyword"


def _fields_info(documents: list[DocumentResponse]) -> dict[str, dict[str, str]]:
    """Each field some document holds a non-null value of, with the type of its values (``mixed`` where they
    differ), sorted by name."""
    types: dict[str, set[str]] = {}
    for d in documents:
        for name, value in d.metadata.items():
            if value is not None:
                types.setdefault(name, set()).add(_type_name(value))
    return {name: {"type": kinds.pop() if len(kinds) == 1 else "mixed"} for name, kinds in sorted(types.items())}


def _min_max(documents: list[DocumentResponse], name: str) -> dict[str, Any]:
    """The least and greatest of a field's numbers (booleans are not numbers here) or strings; None and None when it
    has none, or both kinds (which do not order together), as Haystack's in-memory store answers."""
    values = [v for d in documents for v in [d.metadata.get(_field(name))]
              if isinstance(v, int | float | str) and not isinstance(v, bool)]
    if not values:
        return {"min": None, "max": None}
    try:
        return {"min": min(values), "max": max(values)}
    except TypeError:
        return {"min": None, "max": None}
