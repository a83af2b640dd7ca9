"""A collection's documents API inside one router replica: writes to the change log, the fresh segment kept in
step with the log (its own writes at once, other replicas' within ``POLL_S``), and reads by id.

Order is the log's: changes are applied one at a time in sequence order, under one lock per collection, so a
change is applied once and never before the changes written ahead of it. A change that is durable but could not
be embedded yet (the encoder away) stays pending and is applied on the next write or poll: acknowledged writes
are never lost, only late.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from deployments.documents.segment import FreshSegment
from deployments.search.clients import EncoderClient
from index_format.change_log import Change
from index_format.collection_log import open_change_log

__all__ = ["POLL_S", "CollectionDocuments", "new_segment", "open_documents"]

POLL_S = 0.2  # how often a replica reads the log for other replicas' writes
GROUP_MAX = 64  # writes stored and embedded together at most (group commit)
GROUP_DOCUMENTS = 1000  # ... and documents they upsert, at most (one write of more goes alone)

log = logging.getLogger(__name__)


class CollectionDocuments:
    def __init__(self, name: str, root: str | Path, segment: FreshSegment, encoder: EncoderClient,
                 named: dict[str, EncoderClient] | None = None):
        """``named``: the query encoders of the named encoders deployed for the collection; a segment is embedded
        with those its version holds."""
        self.name, self.root, self.segment, self.encoder = name, root, segment, encoder
        self.named = dict(named or {})
        # Beside the versions of a folder root; in the store for a root in object storage (any node writes it).
        self.log = open_change_log(root, after=segment.log_seq)  # the version holds the rest
        self.pending: list[Change] = []
        self._lock = asyncio.Lock()
        self._queue: list[tuple] = []  # writes waiting for the group being stored (group commit)
        self._committing = False
        self._committer: asyncio.Task | None = None

    async def _apply(self, changes: Sequence[Change]) -> None:
        """Apply the pending changes and these, in order; a failure (the encoder away) leaves them all pending
        (and raises): nothing is applied before every text is embedded."""
        self.pending.extend(changes)
        if self.pending:
            await self._apply_all(self.segment, self.pending)
            self.pending.clear()

    async def _apply_all(self, segment: FreshSegment, changes: Sequence[Change]) -> None:
        """Chunk the changes the segment lacks, embed all their texts in one call, apply them in order."""
        todo = [c for c in changes if c.seq > segment.applied_seq]  # the version or the segment holds the rest
        pieces = [(change, segment.chunk(change)) for change in todo]
        texts = [t for _, parts in pieces for _, _, ts in parts for t in ts]
        names = [n for n in segment.named_dimensions if n in self.named]
        encoders = [self.encoder, *(self.named[n] for n in names)]
        every = await asyncio.gather(*(e.embed_documents(texts) for e in encoders)) if texts else [[]] * len(encoders)
        dimensions = [segment.dimension, *(segment.named_dimensions[n] for n in names)]
        at = 0
        for change, parts in pieces:
            embedded: list[dict[str, np.ndarray]] = [{} for _ in encoders]
            for doc_id, _, ts in parts:
                for out, vectors, dimension in zip(embedded, every, dimensions, strict=True):
                    out[doc_id] = (np.stack(list(vectors[at:at + len(ts)])).astype(np.float32) if ts
                                   else np.zeros((0, dimension), dtype=np.float32))
                at += len(ts)
            segment.apply(change, embedded[0], dict(zip(names, embedded[1:], strict=True)))

    async def rebase(self, version_dir: Path) -> FreshSegment:
        """The segment to search beside another version (a switch, a fold's activation, a rollback): the writes
        that version does not hold. Moving forward (a fold), what the current segment holds past the version's
        ``log_seq`` is carried over and the rest let go; moving back (a rollback to a version holding fewer
        writes), the log is read again past that version's ``log_seq`` (its segments from there on) and what the
        version lacks applied anew. Every later write goes to the returned segment; the current one stays as it was
        for the requests still running on it."""
        async with self._lock:
            segment = await asyncio.to_thread(new_segment, self.name, version_dir, self.segment.dimension)
            if segment.log_seq >= self.segment.log_seq:
                self.segment.carry_to(segment)
            else:
                changes = await asyncio.to_thread(open_change_log(self.root, after=segment.log_seq).read_new)
                # up to what the current segment applied; past it, the usual reads apply the rest
                await self._apply_all(segment, [c for c in changes if c.seq <= self.segment.applied_seq])
                segment.applied_seq = max(segment.applied_seq, self.segment.applied_seq)
            self.segment = segment
            return segment

    async def warm(self) -> None:
        """Apply and search one document in a scratch segment, so what the first change loads (the encoder, Lucene's
        analyzer, the version's term table: a second or more) is loaded at the replica's start, not on the first
        write another replica makes, which would then be late to be searchable here."""
        from deployments.shard.query import ShardQuery

        held = self.segment
        scratch = FreshSegment(held.name, held.chunking, held.corpus, held.analyze, held.dimension)
        change = Change(1, [{"id": "warm-up", "title": "", "text": "warm up the fresh segment", "metadata": {}}])
        await self._apply_all(scratch, [change])
        vector = (await self.encoder.embed_many(["warm up"]))[0]
        await scratch.search(ShardQuery(vector=np.asarray(vector, dtype=np.float32), text="warm up", k_dense=1,
                                        k_keyword=1, rows_for_top=1))

    async def catch_up(self) -> int:
        """Read what other replicas (or this one before a restart) wrote, and apply it; the last applied seq."""
        async with self._lock:
            changes = await asyncio.to_thread(self.log.read_new)
            try:
                await self._apply(changes)
            except Exception:  # noqa: BLE001 - pending; retried on the next poll
                log.exception("collection %s: changes up to seq %s are stored but not searchable yet", self.name,
                              self.pending[-1].seq if self.pending else "?")
            return self.segment.applied_seq

    async def write(self, upserts: Sequence[dict[str, Any]], deletes: Sequence[str], by: str | None
                    ) -> tuple[Change, bool]:
        """(the change as stored, whether it is searchable on this replica already). Durable before it returns.

        Group commit: writes that arrive while another group is being stored wait for it, then go together, one
        ``fsync`` and one embedding call for all of them (each still a change of its own, with its own seq)."""
        done = asyncio.get_running_loop().create_future()
        self._queue.append((upserts, deletes, by, done))
        if not self._committing:  # a task stores the groups, so no write waits for the groups after its own
            self._committing = True
            self._committer = asyncio.get_running_loop().create_task(self._commit_queued())
        return await done

    async def _commit_queued(self) -> None:
        try:
            while self._queue:
                group, held = [], 0  # at most GROUP_MAX writes and GROUP_DOCUMENTS upserts (or one write)
                while self._queue and (not group or (len(group) < GROUP_MAX and
                                                     held + len(self._queue[0][0]) <= GROUP_DOCUMENTS)):
                    group.append(self._queue.pop(0))
                    held += len(group[-1][0])
                await self._commit(group)
        finally:
            self._committing = False

    async def _commit(self, group: list) -> None:
        async with self._lock:
            try:
                changes, seen = await asyncio.to_thread(self.log.append_many, [(u, d, b) for u, d, b, _ in group])
            except Exception as e:  # noqa: BLE001 - not stored: every write of the group is told so
                for *_, done in group:
                    if not done.done():  # (a caller that went away cancelled its own)
                        done.set_exception(e)
                return
            live = True
            try:
                await self._apply([*seen, *changes])
            except Exception:  # noqa: BLE001 - durable: applied on the next write or poll
                log.exception("collection %s: changes %d-%d are stored but not searchable yet", self.name,
                              changes[0].seq, changes[-1].seq)
                live = False
            for (*_, done), change in zip(group, changes, strict=True):
                if not done.done():
                    done.set_result((change, live))


def open_documents(name: str, root: str | Path, version_dir: Path, encoder: EncoderClient, dimension: int,
                   named: dict[str, EncoderClient] | None = None) -> CollectionDocuments:
    """A collection's documents API over the index root ``root``, its segment searched beside the version at
    ``version_dir`` (``new_segment``); ``named``: the query encoders of its named encoders."""
    return CollectionDocuments(name, root, new_segment(name, version_dir, dimension), encoder, named)


def new_segment(name: str, version_dir: Path, dimension: int) -> FreshSegment:
    """An empty segment for the version at ``version_dir``: chunking as it was built, scoring with its statistics,
    holding only the log's writes past its ``log_seq``. Lucene's analyzer and the version's term table are loaded
    at first use (a collection never written to costs nothing)."""
    from deployments.documents.segment import Corpus
    from index_format.bm25_stats import extra_fields, field_folder, read_collection_stats, read_stats
    from index_format.chunking import Chunking
    from index_format.lucene import CONTENTS_FIELD
    from index_format.versions import read_version_manifest

    manifest = read_version_manifest(version_dir)

    def corpus(field: str) -> Corpus:
        """One Lucene field's statistics; its term table is read at the first write."""
        folder = field_folder(version_dir / "bm25", field)
        stats = read_collection_stats(folder)
        terms: dict[str, int] = {}

        def df(term: str) -> int:
            if not terms:
                _, table = read_stats(folder)
                terms.update(zip(table["term"].to_pylist(), table["df"].to_pylist(), strict=True))
                terms.setdefault("", 0)  # loaded, even for an empty table
            return terms.get(term, 0)

        return Corpus(stats.doc_count, stats.avgdl, stats.k1, stats.b, df)

    analyzer = []

    def analyze(text: str) -> list[str]:
        if not analyzer:
            from deployments.shard.lucene import QueryAnalyzer

            analyzer.append(QueryAnalyzer())
        return analyzer[0].analyze(text)

    fields = {name: corpus(name) for name in extra_fields(version_dir / "bm25")}
    return FreshSegment(name, Chunking.of(manifest.build_config), corpus(CONTENTS_FIELD), analyze, dimension,
                        manifest.log_seq, fields, {n: e.dimension for n, e in manifest.encoders.items()})
