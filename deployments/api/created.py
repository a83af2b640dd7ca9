"""Collections created through the API (``POST /admin/collections``, a framework's ``from_texts``), without Ray: each
one an index root under the service's ``collections_root``, its first version built by a build job from the documents
the request carried, and served by every router replica once that build has activated a version. No redeploy.

Which collections were created is kept in the collections root's own store, one small object a collection
(``.collections/<name>.json``), written only if absent: two replicas creating one name at once, one wins and the
other is refused (409). A replica lists those objects to find the collections it does not serve yet (its start, and
every ``router.version_poll_s``); a collection is opened once its root has an active version. The documents of the
request are written beside the versions first (``uploads/<time>.jsonl``), in the store, so the build job reads them
from whichever node it runs on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from deployments.api.admin import StartJob
from deployments.builds import list_records, root_is_building
from deployments.documents.writes import checked_records
from deployments.edge.guard import Caller
from deployments.edge.schemas import BuildJob, CollectionCreated, CreateCollectionRequest
from deployments.errors import Conflict
from index_format.chunking import Chunking
from index_format.prompts import EncoderSpec
from index_format.store import Conflict as StoreConflict
from index_format.store import is_remote, open_store
from index_format.versions import active_version

REGISTRY = ".collections/"  # in the collections root's store: <name>.json a collection (names never start with ".")
UPLOADS = "uploads/"  # in a created collection's root: the documents its first build read


def collection_root(collections_root: str, name: str) -> str:
    """The index root of collection ``name`` under ``collections_root`` (a folder's subfolder, or a URL's prefix)."""
    if is_remote(collections_root):
        return f"{collections_root.rstrip('/')}/{name}"
    return str(Path(collections_root) / name)


def registered(collections_root: str) -> dict[str, str]:
    """Every collection created under ``collections_root``: name -> its index root (one listing of the store)."""
    keys = open_store(collections_root).list(REGISTRY)
    names = [k.removeprefix(REGISTRY).removesuffix(".json") for k in keys if k.endswith(".json")]
    return {name: collection_root(collections_root, name) for name in sorted(names)}


def claim_name(collections_root: str, name: str, claim: bytes) -> None:
    """Write the registry's object of ``name`` if absent. One already there is taken over only when its collection
    never got a version and no build of its root runs (its lock is free and no job record says running): its first
    build failed, and the name is free again; else ``Conflict``. Every write is conditional on what was read, so two replicas cannot both take it."""
    store, key = open_store(collections_root), f"{REGISTRY}{name}.json"
    held, tag = store.get_tagged(key)
    if held is not None:
        root = collection_root(collections_root, name)
        building = root_is_building(root) or any(r.get("state") == "running" for r in list_records([root]))
        if active_version(root) is not None or building:
            raise Conflict(f"collection {name!r} was created already (its build may still be running: GET "
                           "/admin/builds)")
    try:
        store.put_if(key, claim, tag)
    except StoreConflict:
        raise Conflict(f"collection {name!r} is being created by another request") from None


class CreatedCollections:
    """Creates collections: the name claimed in the registry, the documents uploaded, the build job started.
    ``served``: the names this replica serves now (configured or created); ``encoder``: the default collection's
    encoder, a new collection's unless the request names one."""

    def __init__(self, collections_root: str | None, served: Callable[[], Collection[str]], encoder: EncoderSpec,
                 acl_field: str | None, start_job: StartJob):
        self.collections_root, self.served, self.encoder = collections_root, served, encoder
        self.acl_field, self.start_job = acl_field, start_job

    def _root(self) -> str:
        if self.collections_root is None:
            raise Conflict("creating collections is off on this service: set collections_root (a folder, or "
                           "s3://bucket/prefix every node reads) in its config and redeploy")
        return self.collections_root

    def options(self, body: CreateCollectionRequest, corpus: str) -> dict[str, Any]:
        """The build job's options (``python -m index_build``'s flags): the uploaded corpus, activated when built,
        with the default collection's encoder and prompts unless the request names a model."""
        encoder = ({"encoder": body.encoder} if body.encoder else
                   {"encoder": self.encoder.model, "query_prompt": self.encoder.query_prompt,
                    "document_prompt": self.encoder.document_prompt})
        extra = body.model_dump(include={"shards", "chunk_size", "chunk_overlap"}, exclude_none=True)
        return {"corpus": corpus, "activate": True, **encoder, **extra}

    async def create(self, body: CreateCollectionRequest, caller: Caller) -> CollectionCreated:
        """Claim the name, upload the documents, start the build; the build job's record (state running). A name
        served or created before is a 409; a bad record a 422 naming it, before anything is written."""
        collections_root = self._root()
        name = body.name
        if name in self.served():
            raise Conflict(f"collection {name!r} exists; add documents to it with PUT /collections/{name}/documents")
        chunking = Chunking(**body.model_dump(include={"chunk_size", "chunk_overlap"}, exclude_none=True))
        records = checked_records(body.documents, chunking, caller, self.acl_field)
        root = collection_root(collections_root, name)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        claim = json.dumps({"name": name, "root": root, "created": stamp, "by": caller.key_id}).encode()
        await asyncio.to_thread(claim_name, collections_root, name, claim)
        try:
            corpus = f"{UPLOADS}{stamp}.jsonl"
            data = "".join(json.dumps(r) + "\n" for r in records).encode()
            await asyncio.to_thread(open_store(root).put, corpus, data)
            job = await self.start_job(root, "build", self.options(body, collection_root(root, corpus)),
                                       caller.key_id, name)
        except Exception:  # the name is free again: nothing will build it
            await asyncio.to_thread(open_store(collections_root).delete, [f"{REGISTRY}{name}.json"])
            raise
        return CollectionCreated(collection=name, root=root, build=BuildJob(**job))
