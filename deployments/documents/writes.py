"""The documents API of one router replica, without Ray: who may write what (the write ACL), the records checked
as the index build checks them, upserts and deletes into a collection's change log, reads by id, and the replica
following the other replicas' writes (with a fold started when a collection's fresh segment is due for one).

The routes (``deployments.serve.router``) only hand a request and its caller here. A collection serving a pinned
version is read-only (409); one that does not exist is a 404, like a document the caller may not see.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from deployments.documents.service import CollectionDocuments
from deployments.edge.guard import Caller
from deployments.edge.schemas import DocumentResponse, DocumentsPage, ListDocumentsRequest, WriteResponse
from deployments.errors import Conflict, Forbidden, InvalidField, NotFound
from deployments.judgments import check_identifier
from deployments.search.clients import collection
from index_format.records import BadRecord, record_to_document

if TYPE_CHECKING:
    from deployments.search.pipeline import SearchPipeline
    from index_format.chunking import Chunking

logger = logging.getLogger("ray.serve")
FOLD_RETRY_S = 60.0  # a replica tries to start a due fold of a collection at most this often


def may_write_documents(caller: Caller) -> None:
    """Search keys never write (a write or an admin key does; keys off: everyone). Raises ``Forbidden``."""
    if not caller.writer:
        raise Forbidden("this API key may not write documents: add its digest to security.write_key_digests")


def may_write(caller: Caller, acl_field: str | None, what: str, metadata: Mapping[str, Any]) -> None:
    """The write ACL: search keys never write; a write key with principals writes only documents whose ACL field
    lists nothing but its principals (so a tenant can neither write into another's view nor make a document
    public). An admin key, no ACL field, or a key without principals writes any document. Raises ``Forbidden``."""
    may_write_documents(caller)
    if caller.admin or not acl_field or not caller.principals:
        return
    value = metadata.get(acl_field)
    values = [value] if isinstance(value, str) else list(value) if isinstance(value, list) else []
    if not values or not set(values) <= set(caller.principals):
        raise Forbidden(f"{what}: its {acl_field!r} must list only this key's principals "
                        f"({', '.join(caller.principals)}); it lists {values or 'none'}")


def checked_records(raw: list[dict], chunking: Chunking, caller: Caller, acl_field: str | None) -> list[dict]:
    """The records of an upsert as the change log stores them (id, title, text, metadata), each read as the index
    build reads a corpus line (``record_to_document``, with the version's id and text fields), its id checked, given
    once in the batch, and the caller's to write (``may_write``). The first bad record refuses the whole batch."""
    records, ids = [], set()
    for i, item in enumerate(raw):
        doc = record_to_document(item, ("documents", i), chunking.id_fields, chunking.text_fields)
        if isinstance(doc, BadRecord):
            raise InvalidField(f"documents[{i}]: {doc.reason}")
        check_identifier(f"documents[{i}].id", doc.doc_id)
        if doc.doc_id in ids:
            raise InvalidField(f"documents[{i}]: id {doc.doc_id!r} is given twice in this batch; send each once")
        ids.add(doc.doc_id)
        may_write(caller, acl_field, f"documents[{i}]", doc.metadata)
        records.append({"id": doc.doc_id, "title": doc.title, "text": doc.text, "metadata": doc.metadata})
    return records


def fold_due(docs: int, oldest_write: float | None, fold_after_documents: int | None, fold_after_s: float | None,
             now: float) -> bool:
    """Whether a fresh segment holding ``docs`` documents, the oldest written at ``oldest_write`` (epoch seconds), is
    due to be folded into a version: ``fold_after_documents`` of them, or its oldest ``fold_after_s`` old (either
    None or 0: that rule off). An empty segment never is."""
    if not docs:
        return False
    return bool((fold_after_documents and docs >= fold_after_documents)
                or (fold_after_s and oldest_write and now - oldest_write >= fold_after_s))


class DocumentWrites:
    """The collections' documents as one replica serves them: ``documents`` (the writable ones: those following an
    index root) beside the pipeline that searches them (which finds a document, and knows the ACL field)."""

    def __init__(self, pipeline: SearchPipeline, documents: dict[str, CollectionDocuments]):
        self.pipeline, self.documents = pipeline, documents
        self._fold_tried: dict[str, float] = {}  # collection -> when this replica last tried to start a fold

    def writable(self, name: str) -> CollectionDocuments:
        collection(self.pipeline.collections, name)
        if name not in self.documents:
            raise Conflict(f"collection {name!r} serves a pinned index version (a version folder, or 'version' "
                           "in the config): its documents are read-only; serve its index root to write to it")
        return self.documents[name]

    async def upsert(self, name: str, raw: list[dict], caller: Caller) -> WriteResponse:
        """Add or replace documents, atomically: durable in the change log before it returns."""
        docs = self.writable(name)
        records = checked_records(raw, docs.segment.chunking, caller, self.pipeline.acl_field)
        change, live = await docs.write(records, [], caller.key_id)
        _log_write(name, change.seq, upserted=len(records))
        return WriteResponse(collection=name, seq=change.seq, upserted=len(records), searchable=live)

    async def delete(self, name: str, ids: list[str], caller: Caller) -> WriteResponse:
        """Delete documents, atomically: one the caller cannot find (or may not write) refuses them all."""
        docs = self.writable(name)
        for doc_id in ids:
            check_identifier("id", doc_id)
            found = await self.pipeline.document(name, doc_id, list(caller.principals))
            if found is None:  # missing, deleted, or not the caller's to see: the same answer
                raise NotFound(f"no document {doc_id!r} in collection {name!r}; nothing was deleted")
            may_write(caller, self.pipeline.acl_field, f"document {doc_id!r}", found["metadata"])
        change, live = await docs.write([], list(dict.fromkeys(ids)), caller.key_id)
        _log_write(name, change.seq, deleted=len(set(ids)))
        return WriteResponse(collection=name, seq=change.seq, deleted=len(set(ids)), searchable=live)

    async def get(self, name: str, doc_id: str, caller: Caller) -> DocumentResponse:
        """A document by id as the caller may see it (one it may not see is answered as one that does not exist)."""
        collection(self.pipeline.collections, name)
        found = await self.pipeline.document(name, doc_id, list(caller.principals))
        if found is None:
            raise NotFound(f"no document {doc_id!r} in collection {name!r}")
        return DocumentResponse(collection=name, **found)

    async def list(self, name: str, req: ListDocumentsRequest, caller: Caller) -> DocumentsPage:
        """A page of the collection's documents in id order, without a query, as the caller may see them."""
        return await self.pipeline.list_documents(name, req, list(caller.principals))

    async def rebase(self, name: str, version_dir) -> Any:
        """The fresh segment to search beside ``version_dir`` (a switch to it: what it lacks of the change log); the
        one later writes go to (``CollectionDocuments.rebase``)."""
        return await self.documents[name].rebase(version_dir)

    async def catch_up(self) -> None:
        """Apply what every change log holds that this replica has not applied yet (other replicas' writes)."""
        for docs in self.documents.values():
            await docs.catch_up()

    async def follow(self, settings, start_fold: Callable[[str], Awaitable[dict]]) -> None:
        """One look at every change log: other replicas' writes applied here, and a fold started (``start_fold``,
        the collection's name) where a collection's segment is due (``router.fold_after_documents``,
        ``fold_after_s``), at most once a minute per collection and replica (a fold of a root already running,
        another replica's, is refused: ``Conflict``)."""
        for docs in self.documents.values():
            try:
                await docs.catch_up()
                segment = docs.segment
                if not fold_due(len(segment.docs), segment.oldest_write, settings.fold_after_documents,
                                settings.fold_after_s, time.time()):
                    continue
                if time.monotonic() - self._fold_tried.get(docs.name, -FOLD_RETRY_S) < FOLD_RETRY_S:
                    continue
                self._fold_tried[docs.name] = time.monotonic()
                try:
                    job = await start_fold(docs.name)
                    logger.info(f"collection {docs.name!r}: folding {len(segment.docs)} written documents "
                                f"(build {job['id']})")
                except Conflict:
                    pass  # a build or another replica's fold is writing into the root; the next try comes
            except Exception:  # noqa: BLE001 - a follower that died would stop every later write showing up
                logger.exception("following the change log of %s", docs.name)


def _log_write(collection: str, seq: int, upserted: int = 0, deleted: int = 0) -> None:
    """One line an acknowledged write, as one a search (``api.observe``): in a replica, Serve's logger adds the
    request id and the replica that took it."""
    logger.info("write", extra={"event": "write", "collection": collection, "seq": seq, "upserted": upserted,
                                "deleted": deleted})
