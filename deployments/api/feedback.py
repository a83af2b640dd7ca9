"""``POST /feedback`` and ``GET /feedback/qrels`` without Ray: a judgment belongs to the caller's key, and only a
document the caller can find (and, with ACLs, may see) can be judged; qrels are read back per tenant.

With keys on, a judgment's tenant is the key's principals, never a field the caller fills in (a ``tenant`` that is
not one of them is refused); with keys off the request's ``tenant`` is kept as given. The store is
``deployments.judgments.JudgmentStore``, one per collection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from deployments.edge.guard import Caller
from deployments.edge.schemas import FeedbackRequest, FeedbackResponse
from deployments.errors import Forbidden, NotFound
from deployments.judgments import JudgmentStore
from deployments.search.clients import collection
from index_format.chunk_ids import doc_of

if TYPE_CHECKING:
    from deployments.search.pipeline import SearchPipeline


class Feedback:
    def __init__(self, pipeline: SearchPipeline, stores: Mapping[str, JudgmentStore], keys_on: bool):
        self.pipeline, self.stores, self.keys_on = pipeline, stores, keys_on

    def _store(self, name: str | None) -> tuple[str, JudgmentStore]:
        name = name or self.pipeline.default_collection
        return name, collection(self.stores, name)

    async def add(self, body: FeedbackRequest, caller: Caller) -> FeedbackResponse:
        """Store a judgment durably (appended and fsynced before it returns)."""
        name, store = self._store(body.collection)
        if self.keys_on and body.tenant is not None and body.tenant not in caller.principals:
            raise Forbidden(f"tenant {body.tenant!r} is not one of this API key's principals; leave tenant out "
                            "(a judgment belongs to the key's tenant)")
        doc_id = body.doc_id or doc_of(body.chunk_id)
        if not await self.pipeline.can_see(name, doc_id, body.chunk_id, list(caller.principals)):
            # The same answer for a document that does not exist and one the caller may not see.
            raise NotFound(f"no document {doc_id!r}" + (f" with chunk {body.chunk_id!r}" if body.chunk_id else "")
                           + f" in collection {name!r}")
        record = await asyncio.to_thread(store.add, body.query, doc_id, body.label, body.chunk_id, body.user,
                                         None if self.keys_on else body.tenant, caller.key_id, caller.principals)
        return FeedbackResponse(collection=name, query_id=record["query_id"], doc_id=doc_id, label=body.label)

    async def qrels(self, name: str | None, caller: Caller) -> tuple[str, int]:
        """(a collection's judgments as a BEIR qrels file, the lines of the store skipped as torn or malformed). A
        caller reads only its tenant's judgments (those made with keys of the same principals); an admin key (or
        keys off) reads them all."""
        _, store = self._store(name)
        _, qrels = await asyncio.to_thread(store.qrels, None if caller.admin else caller.principals)
        lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{g}" for q, docs in qrels.items() for d, g in docs.items()]
        return "\n".join(lines) + "\n", store.skipped
