"""The fresh segment: documents written through the API since the served version, searchable at once.

A collection's writes land in its change log (``index_format.change_log``); each router replica reads the log
and keeps what it holds here, in memory: every live document chunked as the build chunks it
(``index_format.chunking``, with the version's chunk size, overlap and title rule), its chunks embedded by the
collection's query encoder (the build's model) and by that of each named encoder the version holds, and their
terms analyzed by Lucene's own analyzer. The pipeline
searches it as one more shard, exactly (every chunk scored on both legs), with the request's filters and ACL,
and drops from the version's answers every document the segment replaces or deletes (``masked``).

Scores. Dense: the same cosine as the version's shards. BM25: Lucene 9's formula (``idf * tf / (tf + k1 *
(1 - b + b * dl / avgdl))``, times the query term's count) with the version's corpus statistics (N, avgdl, df)
plus the segment's own documents and document frequencies, so a fresh chunk scores about as it will once
folded into a version (Lucene stores lengths lossily, so not to the last digit). Each Lucene field of the version
(``contents``, and e.g. ``title``: ``deployments.shard.lucene``) is scored so, with that field's statistics; a
query's ``field_weights`` sum them as the shards do.

Points in time. A replaced or deleted document's rows stay, dead, for at least ``HISTORY_S``: each row knows the
write that added it and the one that ended it, so ``at(seq)`` is the segment as it was just after write ``seq``
(what a cursor's next page searches, ``deployments.search.paging``), the same on every replica, which apply the
same log. Compaction drops only rows dead for longer; ``floor_seq`` is the earliest write whose point in time the
segment still holds.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from deployments.shard.features import (
    FeatureQuery,
    coverage,
    empty_features,
    held_by_rows,
    position_of,
    words,
)
from deployments.shard.filters import FilterError, MetadataTable
from deployments.shard.query import DocumentsAnswer, DocumentsQuery, ShardAnswer, ShardQuery, bounded_terms
from deployments.shard.topk import contenders, top_k
from index_format.bm25_stats import length_norm, lucene_idf, term_score
from index_format.change_log import Change
from index_format.chunking import Chunking, chunk_document
from index_format.lucene import CONTENTS_FIELD as CONTENTS
from index_format.records import Document, written_document

HISTORY_S = 600.0  # a dead row is kept at least this long: a cursor's keep-alive is at most this
NEVER = np.iinfo(np.int64).max  # the write that ends a live row


@dataclass
class Corpus:
    """The version's BM25 statistics the segment scores with: N, avgdl, k1, b and df by term."""

    doc_count: int
    avgdl: float
    k1: float
    b: float
    df: Callable[[str], int] = field(default=lambda term: 0)


@dataclass
class _Doc:
    seq: int
    document: Document | None  # None: deleted
    rows: list[dict] = field(default_factory=list)
    vectors: np.ndarray | None = None
    terms: dict[str, list[Counter]] = field(default_factory=dict)  # Lucene field -> each row's analyzed terms
    named: dict[str, np.ndarray] = field(default_factory=dict)  # named encoder -> its vectors of the rows
    at: list[int] = field(default_factory=list)  # its rows' positions in the segment's arrays


@dataclass
class _Visible:
    """The rows a read sees: now (the segment's own arrays) or at a point in time (``FreshSegment.visible_at``).
    At a point in time the chunk-id map is made only for a read that looks rows up by id (a search needs none)."""

    alive: np.ndarray  # bool, by row
    live: int
    rows: list[dict]
    _row_of: dict[str, int] | None = None

    @property
    def row_of(self) -> dict[str, int]:
        """Chunk id -> its row."""
        if self._row_of is None:
            self._row_of = {self.rows[r]["chunk_id"]: r for r in np.flatnonzero(self.alive).tolist()}
        return self._row_of


class _Postings:
    """One Lucene field over the segment's rows (dead ones included, masked by the caller): each row's length, and
    term -> (rows holding it, its count in each), so a query scores only the rows its terms are in; kept as lists
    (appended to) and made arrays when a query first needs them after a change."""

    def __init__(self):
        self.lengths = np.zeros(0, dtype=np.float64)
        self.lists: dict[str, tuple[list[int], list[float]]] = {}
        self.arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, at: list[int], terms: list[Counter]) -> None:
        self.lengths = np.concatenate([self.lengths, [float(sum(t.values())) for t in terms]])
        for row, counts in zip(at, terms, strict=True):
            for term, n in counts.items():
                rows, tfs = self.lists.setdefault(term, ([], []))
                rows.append(row)
                tfs.append(float(n))
                self.arrays.pop(term, None)

    def __contains__(self, term: str) -> bool:
        return term in self.lists

    def posting(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        if term not in self.arrays:
            rows, tfs = self.lists[term]
            self.arrays[term] = (np.array(rows, dtype=np.int64), np.array(tfs, dtype=np.float64))
        return self.arrays[term]

    def bm25(self, terms: list[str], corpus: Corpus, alive: np.ndarray) -> np.ndarray:
        """Every row's BM25 of this field (0 where it holds no query term; dead rows count for nothing), with the
        version's statistics plus the live rows': N counts the rows with a term in the field, as Lucene's docCount."""
        held = alive & (self.lengths > 0)
        n = corpus.doc_count + int(held.sum())
        avgdl = ((corpus.avgdl * corpus.doc_count + float(self.lengths[held].sum())) / n) if n else 1.0
        norm = length_norm(corpus.k1, corpus.b, self.lengths, avgdl)
        scores = np.zeros(len(self.lengths))
        for term, count in Counter(terms).items():
            if term not in self.lists:
                continue  # no fresh chunk holds it: it adds nothing here
            rows, tf = self.posting(term)
            live = alive[rows]
            rows, tf = rows[live], tf[live]
            if not len(rows):
                continue
            scores[rows] += term_score(tf, norm[rows], lucene_idf(n, corpus.df(term) + len(rows)), boost=count)
        return scores


class FreshSegment:
    """What the change log holds past the version, searchable; meets the pipeline's shard client protocol."""

    remote = False  # in this process: the final page's rows are fetched once, after fusion
    size = 0  # not a shard of the version: coverage counts the version's shards

    def __init__(self, name: str, chunking: Chunking, corpus: Corpus, analyze: Callable[[str], list[str]],
                 dimension: int, log_seq: int = 0, fields: Mapping[str, Corpus] | None = None,
                 named: Mapping[str, int] | None = None):
        """``corpus``: the version's statistics of ``contents``; ``fields``: those of its Lucene fields beside it
        (chunk-row keys, e.g. ``title``; none in a version built before fields); ``named``: the dimension of each
        named encoder the version holds."""
        self.name, self.chunking, self.corpus, self.analyze, self.dimension = name, chunking, corpus, analyze, dimension
        self.named_dimensions: dict[str, int] = dict(named or {})
        self.corpora: dict[str, Corpus] = {CONTENTS: corpus} | dict(fields or {})
        self.docs: dict[str, _Doc] = {}
        # Each document's first write the segment holds: the version's copy is hidden from then on.
        self.first_write: dict[str, int] = {}
        # Documents replaced or deleted: (what it was, the write that ended it, when), kept HISTORY_S.
        self.retired: list[tuple[_Doc, int, float]] = []
        self.in_version: set[str] = set()  # masked documents the version was seen to answer for (retrieval adds)
        # The version holds the log's writes through ``log_seq`` (``index_build.fold``): the segment, only later ones.
        self.log_seq = log_seq
        self.applied_seq = log_seq
        self.floor_seq = log_seq
        self.oldest_write: float | None = None  # when the oldest write it holds was made (what a fold is due by)
        self._index()

    def carry_to(self, other: FreshSegment) -> None:
        """Give ``other`` (a segment for the next version, empty) what this one holds that its version does not:
        each document's write past ``other.log_seq``, with its chunks and vectors as they are (nothing embedded
        again). This segment is left as it was, for the requests still running on the old version."""
        if other.log_seq < self.log_seq:
            raise ValueError("a segment carries writes forward only; an earlier version replays the log")
        for doc_id, held in sorted(self.docs.items(), key=lambda item: item[1].seq):
            if held.seq > other.log_seq:
                copy = _Doc(held.seq, held.document, held.rows, held.vectors, dict(held.terms), dict(held.named))
                if copy.document is not None:
                    other._add(copy)
                other.docs[doc_id] = copy
                other.first_write[doc_id] = held.seq
        other.applied_seq = max(self.applied_seq, other.log_seq)
        other.floor_seq = other.applied_seq  # the writes before are carried as they ended, not as they went
        other.masked = frozenset(other.docs)
        other.oldest_write = self.oldest_write if other.docs else None  # (an upper bound on its age)

    # ------------------------------------------------------------------ writes

    def chunk(self, change: Change) -> list[tuple[str, list[dict], list[str]]]:
        """Each upserted document of a change as (doc id, its chunk rows, the texts to embed)."""
        out = []
        for record in change.upserts:
            doc = written_document(change.seq, record)
            rows, texts = [], []
            for c in chunk_document(doc, self.chunking.chunk_size, self.chunking.chunk_overlap):
                rows.append({**c.row(), "metadata": c.metadata})
                texts.append(c.contents(self.chunking.prepend_title))
            out.append((doc.doc_id, rows, texts))
        return out

    def apply(self, change: Change, embedded: dict[str, np.ndarray],
              named: Mapping[str, dict[str, np.ndarray]] | None = None) -> bool:
        """Apply one change (its documents' chunks embedded already: doc id -> vectors, from ``chunk``; ``named``:
        the same under each named encoder), once:
        a change at or before the last applied sequence number is skipped (False). Costs what the change holds:
        new rows are appended, a replaced or deleted document's rows are marked dead (and compacted away once
        they outnumber the live ones)."""
        if change.seq <= self.applied_seq:
            return False
        if self.oldest_write is None:
            self.oldest_write = change.time or time.time()
        for doc_id in change.deletes:
            self._drop(doc_id, change.seq)
            self.docs[doc_id] = _Doc(change.seq, None)
            self.first_write.setdefault(doc_id, change.seq)
        for doc_id, rows, texts in self.chunk(change):
            record = next(r for r in change.upserts if r["id"] == doc_id)
            document = Document(doc_id, record.get("title") or "", record.get("text") or "",
                                dict(record.get("metadata") or {}))
            self._drop(doc_id, change.seq)
            self.first_write.setdefault(doc_id, change.seq)
            terms = {CONTENTS: [Counter(self.analyze(t)) for t in texts]}
            terms |= {f: [Counter(self.analyze(r.get(f) or "")) for r in rows] for f in self.corpora if f != CONTENTS}
            held = _Doc(change.seq, document, rows, embedded[doc_id], terms,
                        {n: vectors[doc_id] for n, vectors in (named or {}).items()})
            self._add(held)
            self.docs[doc_id] = held
        self.applied_seq = change.seq
        self.masked = frozenset(self.docs)  # the version answers for none of these documents any more
        if len(self.rows) - self.live - self.kept_dead > max(1000, self.live):
            self._index()
        return True

    def _index(self) -> None:
        """Every array made again from the live documents and those that died within ``HISTORY_S`` (at start, and
        to drop older dead rows)."""
        now = time.monotonic()
        dropped = [died for _, died, when in self.retired if now - when >= HISTORY_S]
        if dropped:
            self.floor_seq = max(self.floor_seq, *dropped)  # a point in time before these is no longer whole
        self.retired = [r for r in self.retired if now - r[2] < HISTORY_S]
        self.rows: list[dict] = []  # every row added since the last compaction, dead ones included
        self.alive = np.zeros(0, dtype=bool)
        self.born = np.zeros(0, dtype=np.int64)  # the write that added each row
        self.died = np.zeros(0, dtype=np.int64)  # the write that ended it (NEVER: alive)
        self.live = 0
        self.row_of: dict[str, int] = {}  # chunk id -> its live row
        self.matrix = np.zeros((0, self.dimension), dtype=np.float32)
        self.named = {n: np.zeros((0, d), dtype=np.float32) for n, d in self.named_dimensions.items()}
        self.postings = {f: _Postings() for f in self.corpora}  # Lucene field -> its lengths and postings
        self._metadata: MetadataTable | None = None
        for held in self.docs.values():
            if held.document is not None:
                self._add(held)
        for held, died, _ in self.retired:
            self._add(held, died)
        self.kept_dead = len(self.rows) - self.live
        self.masked = frozenset(self.docs)

    def _add(self, held: _Doc, died: int = NEVER) -> None:
        """Append a document's rows: live, or (``died``: the write that ended them) dead, kept for points in time."""
        start, n = len(self.rows), len(held.rows)
        held.at = list(range(start, start + n))
        self.rows += held.rows
        self.born = np.concatenate([self.born, np.full(n, held.seq, dtype=np.int64)])
        self.died = np.concatenate([self.died, np.full(n, died, dtype=np.int64)])
        self.alive = np.concatenate([self.alive, np.full(n, died == NEVER, dtype=bool)])
        if died == NEVER:
            self.row_of.update((r["chunk_id"], i) for r, i in zip(held.rows, held.at, strict=True))
            self.live += n
        if held.vectors is not None and len(held.vectors):
            self.matrix = np.concatenate([self.matrix, np.asarray(held.vectors, dtype=np.float32)])
        for name, matrix in self.named.items():
            # NaN rows for a document embedded before its segment's version held this encoder (carried over from the
            # segment of a version without it): no cosine, so neither found by that leg nor given the feature.
            vectors = held.named.get(name)
            if vectors is None or len(vectors) != len(held.rows):
                vectors = np.full((len(held.rows), matrix.shape[1]), np.nan, dtype=np.float32)
            self.named[name] = np.concatenate([matrix, np.asarray(vectors, dtype=np.float32)])
        for name, postings in self.postings.items():
            if name not in held.terms:  # carried over from a segment of a version without this field
                held.terms[name] = [Counter(self.analyze(r.get(name) or "")) for r in held.rows]
            postings.add(held.at, held.terms[name])
        self._metadata = None

    def _drop(self, doc_id: str, seq: int) -> None:
        """End a document's live rows at write ``seq``; they stay, dead, for points in time before it."""
        held = self.docs.get(doc_id)
        if held is not None and held.document is not None:
            self.alive[held.at] = False
            self.died[held.at] = seq
            self.retired.append((held, seq, time.monotonic()))
            self.live -= len(held.at)
            for r in held.rows:
                self.row_of.pop(r["chunk_id"], None)
            self._metadata = None

    @property
    def metadata(self) -> MetadataTable:
        """The rows' metadata (dead rows included, masked by ``alive``), made when a filter first needs it."""
        if self._metadata is None:
            self._metadata = MetadataTable([r["metadata"] for r in self.rows])
        return self._metadata

    def _posting(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        return self.postings[CONTENTS].posting(term)

    # ------------------------------------------------------------------ points in time

    def holds(self, seq: int) -> bool:
        """Whether ``at(seq)`` can be searched: no row alive then has been compacted away, nor is it to come."""
        return self.floor_seq <= seq <= self.applied_seq

    def at(self, seq: int) -> FreshSegment | PointInTime:
        """The segment as it was just after write ``seq`` (itself at its last write); ``holds(seq)`` first."""
        return self if seq == self.applied_seq else PointInTime(self, seq)

    def visible_at(self, seq: int | None) -> _Visible:
        """The rows alive just after write ``seq`` (None: now), from each row's first and last write."""
        if seq is None or seq >= self.applied_seq:
            return _Visible(self.alive, self.live, self.rows, self.row_of)
        alive = (self.born <= seq) & (self.died > seq)
        return _Visible(alive, int(np.count_nonzero(alive)), self.rows)

    # ------------------------------------------------------------------ reads (the shard client protocol)

    def document(self, doc_id: str) -> tuple[bool, Document | None, list[str]]:
        """(whether the segment decides this id, the document or None when deleted, its chunk ids)."""
        held = self.docs.get(doc_id)
        if held is None:
            return False, None, []
        return True, held.document, [r["chunk_id"] for r in held.rows]

    def list_documents(self, query: DocumentsQuery) -> DocumentsAnswer:
        """A page of the documents written through the API and alive now, in id order, as a shard lists its own
        (``DocumentsQuery``; its ``exclude`` is for the version's shards). A filter this segment cannot apply is the
        answer's ``filter_error``."""
        try:
            allowed = self._allowed(query.filters, query.acl)
        except FilterError as e:
            return DocumentsAnswer(filter_error=str(e))
        let_through = None
        if allowed is not None:
            let_through = np.zeros(len(self.rows), dtype=bool)
            let_through[allowed] = True
        wanted = set(query.ids) if query.ids is not None else None
        found = sorted((doc_id, len(held.rows)) for doc_id, held in self.docs.items()
                       if held.document is not None and (wanted is None or doc_id in wanted)
                       and (let_through is None or (held.at and let_through[held.at[0]])))
        start = bisect.bisect_right(found, (query.after, float("inf"))) if query.after is not None else 0
        page = found[start:start + query.limit]
        return DocumentsAnswer([i for i, _ in page], [c for _, c in page], len(found), len(found) - start)

    def _allowed(self, filters, acl) -> np.ndarray | None:
        # As in a shard: a field no fresh chunk has is missing from each of them (eq matches none, ne all).
        return self.metadata.searchable_rows(filters, acl)

    def _bm25(self, text: str, weights: Mapping[str, float] | None, alive: np.ndarray) -> np.ndarray:
        """Every row's BM25 score for the query (0 where it holds no query term; dead rows count for nothing):
        the weighted sum over the fields of ``weights`` (None: ``contents`` alone), as a shard scores it."""
        weights = weights or {CONTENTS: 1.0}
        terms = bounded_terms(self.analyze(text), self.corpus.df, len(weights))[0]  # a long query's, as a shard's
        scores = np.zeros(len(self.rows))
        for name, weight in weights.items():
            if weight and name in self.corpora:  # the router checked the names against the version
                scores += weight * self.postings[name].bm25(terms, self.corpora[name], alive)
        return scores

    def field_scores(self, terms: list[str], chunk_ids: Sequence[str], seq: int | None = None) -> dict[str, np.ndarray]:
        """Each Lucene field's BM25 (as ``search`` scores it) of the chunks ``chunk_ids`` for the query's analyzed
        ``terms``, float32 in the order of ``chunk_ids``: 0 where no term matches and for a chunk the segment does
        not hold (alive after write ``seq``; None: now). The fresh side of the field scores
        ``LuceneShard.candidate_facts`` reads, asked by chunk id: the segment has no chunk table whose rows a
        caller could know."""
        seen = self.visible_at(seq)
        at, rows = held_by_rows(chunk_ids, seen.row_of)
        out = {}
        for name, postings in self.postings.items():
            scores = np.zeros(len(chunk_ids), dtype=np.float32)
            if at:
                scores[at] = postings.bm25(terms, self.corpora[name], seen.alive)[rows]
            out[name] = scores
        return out

    async def search(self, query: ShardQuery, seq: int | None = None) -> ShardAnswer:
        t0 = time.perf_counter()
        answer = ShardAnswer(self.name, shards=0)
        seen = self.visible_at(seq)
        if not seen.live:
            return answer
        try:
            allowed = self._allowed(query.filters, query.acl)
        except FilterError as e:
            answer.filter_error = str(e)
            return answer
        rows = np.flatnonzero(seen.alive) if allowed is None else allowed[seen.alive[allowed]]
        if query.dense and len(rows) and (query.encoder is None or query.encoder in self.named):
            matrix = self.matrix if query.encoder is None else self.named[query.encoder]
            scores = matrix[rows] @ np.asarray(query.vector, dtype=np.float32)
            embedded = ~np.isnan(scores)
            answer.dense = self._top(rows[embedded], scores[embedded], query.k_dense)
        if query.keyword and len(rows):
            keyword = self._bm25(query.text, query.field_weights, seen.alive)[rows]
            held = keyword > 0
            answer.keyword = self._top(rows[held], keyword[held], query.k_keyword)
        answer.took_ms = (time.perf_counter() - t0) * 1000
        return answer

    async def fetch(self, chunk_ids: Sequence[str], seq: int | None = None) -> list[dict]:
        row_of = self.visible_at(seq).row_of
        return [self.rows[row_of[c]] for c in chunk_ids if c in row_of]

    async def vectors(self, chunk_ids: Sequence[str], seq: int | None = None) -> np.ndarray:
        row_of = self.visible_at(seq).row_of
        return self.matrix[[row_of[c] for c in chunk_ids]]

    async def features(self, query: FeatureQuery, seq: int | None = None) -> dict[str, np.ndarray]:
        """A ranking model's features of the candidates the segment holds (``deployments.shard.features``), scored
        as ``search`` scores them: BM25 with the version's statistics plus the segment's."""
        n = len(query.chunk_ids)
        out = empty_features(n)
        seen = self.visible_at(seq)
        at, rows = held_by_rows(query.chunk_ids, seen.row_of)
        if not at:
            return out
        if query.wants("bm25_"):
            for name, scores in self.field_scores(self.analyze(query.text), query.chunk_ids, seq).items():
                out.setdefault(f"bm25_{name}", np.full(n, np.nan, dtype=np.float32))[at] = scores[at]
        if query.wants("term_coverage", "idf_coverage"):
            distinct = sorted(set(self.analyze(query.text)))
            held = np.zeros((len(distinct), len(rows)), dtype=bool)
            for i, t in enumerate(distinct):
                if t in self.postings[CONTENTS]:
                    held[i] = np.isin(rows, self._posting(t)[0])
            n_docs = self.corpus.doc_count + seen.live
            held_by = {t: int(seen.alive[self._posting(t)[0]].sum()) if t in self.postings[CONTENTS] else 0
                       for t in distinct}
            idf = [lucene_idf(n_docs, self.corpus.df(t) + held_by[t]) for t in distinct]
            out["term_coverage"][at], out["idf_coverage"][at] = coverage(held.T, idf)
        if query.vector is not None and query.wants("dense"):
            out["dense"][at] = self.matrix[rows] @ np.asarray(query.vector, dtype=np.float32)
        for name, vector in query.vectors.items():
            if name in self.named and query.wants(f"dense_{name}"):
                column = out.setdefault(f"dense_{name}", np.full(n, np.nan, dtype=np.float32))
                column[at] = self.named[name][rows] @ np.asarray(vector, dtype=np.float32)
        held = [self.rows[r] for r in rows]
        out["length"][at] = words([r["text"] for r in held])
        out["title_length"][at] = words([r["title"] for r in held])
        out["position"][at] = [position_of(query.chunk_ids[i]) for i in at]
        return out

    async def vocabulary(self, acl=None) -> dict[str, int]:
        return {}  # spelling suggests from the version's words

    async def info(self) -> dict:
        return {"fields": self.metadata.fields()}

    def _top(self, rows: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The k best (chunk id, score) of these rows, score descending then chunk id ascending (``topk.top_k``)."""
        kept = contenders(scores, k)  # chunk ids are read for these only
        rows, scores = rows[kept], scores[kept]
        ids = [self.rows[r]["chunk_id"] for r in rows.tolist()]
        order = top_k(scores, k, np.array(ids, dtype=str)) if ids else np.zeros(0, dtype=np.int64)
        return [(ids[i], float(scores[i])) for i in order.tolist()]


class PointInTime:
    """A fresh segment as it was just after write ``applied_seq``: what a cursor's next page searches beside the
    version, with the documents the first page saw (those written since are not there; those deleted or replaced
    since are, as they were). Meets the shard client protocol as the segment does, reading its arrays at that write
    on each call (a compaction between two calls moves rows, never the rows alive then)."""

    remote = False
    size = 0

    def __init__(self, segment: FreshSegment, seq: int):
        self.segment, self.applied_seq = segment, seq
        self.name, self.in_version = segment.name, segment.in_version
        self.live = segment.visible_at(seq).live
        self.masked = frozenset(doc for doc, first in segment.first_write.items() if first <= seq)

    @property
    def metadata(self) -> MetadataTable:
        return self.segment.metadata

    async def search(self, query: ShardQuery) -> ShardAnswer:
        return await self.segment.search(query, self.applied_seq)

    async def fetch(self, chunk_ids: Sequence[str]) -> list[dict]:
        return await self.segment.fetch(chunk_ids, self.applied_seq)

    async def vectors(self, chunk_ids: Sequence[str]) -> np.ndarray:
        return await self.segment.vectors(chunk_ids, self.applied_seq)

    async def features(self, query: FeatureQuery) -> dict[str, np.ndarray]:
        return await self.segment.features(query, self.applied_seq)

    async def vocabulary(self, acl=None) -> dict[str, int]:
        return {}

    async def info(self) -> dict:
        return await self.segment.info()
