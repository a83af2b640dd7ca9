"""Several shards of one index version searched in one process: one call per request, not one per shard.

On one machine every shard process costs a JVM, a Serve replica and a round trip per request, for
about a millisecond of work each; a group puts the shards a node holds behind one replica, so a router
makes one call per node. The query is analyzed once for all shards, each shard is searched with its own
corpus-exact BM25 parameters and its own filter, and each leg is merged to its top-k here, so the
router receives exactly what it would have merged from the shards one by one. Ray-free: the shard
deployment wraps it, tests and the in-process pipeline call it directly.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from deployments.bounded import BoundedCache
from deployments.shard.chunk_ids import ids_at
from deployments.shard.features import FeatureQuery, candidates_features
from deployments.shard.filters import FilterError
from deployments.shard.lucene import FactsReader
from deployments.shard.query import (
    DocumentsAnswer,
    DocumentsQuery,
    ShardAnswer,
    ShardQuery,
    bounded_terms,
    merged_pages,
)
from deployments.shard.service import ShardService
from deployments.shard.shares import Share, shard_depth, short_shares
from deployments.shard.topk import top_k


@dataclass
class LegPart:
    """One shard's top-k of one leg: rows of its chunk table and float32 scores, best first, and the time it took."""

    rows: np.ndarray
    scores: np.ndarray
    ms: float


def _timed(fn, *args) -> LegPart:
    t0 = time.perf_counter()
    rows, scores = fn(*args)
    return LegPart(rows, scores, (time.perf_counter() - t0) * 1000)


def _best(rows: list[np.ndarray], scores: list[np.ndarray], ranks: list[np.ndarray], ids: list[Sequence[str]],
          k: int) -> list[tuple[str, float]]:
    """Top-k of per-shard top-k arrays (chunk-table rows and scores): score descending, then chunk id
    ascending (``topk.top_k``). Ties are broken by each row's rank in the group's sorted chunk ids, so
    the sort compares integers, not strings (about 0.5 ms a query less than sorting the ids themselves); only the
    k kept are read as ids, each shard's in one read."""
    all_scores = np.concatenate(scores) if len(scores) > 1 else scores[0]
    if len(all_scores) == 0 or k <= 0:
        return []
    if len(rows) == 1:  # one shard: its rows are the positions, its ids read in one call
        order = top_k(all_scores, k, ranks[0][rows[0]])
        picked = ids_at(ids[0], rows[0][order])
    else:
        all_ranks = np.concatenate([rank[r] for rank, r in zip(ranks, rows, strict=True)])
        order = top_k(all_scores, k, all_ranks)
        bounds = np.cumsum([0] + [len(r) for r in rows])
        shard = np.searchsorted(bounds, order, side="right") - 1
        all_rows = np.concatenate(rows)
        placed = np.empty(len(order), dtype=object)  # each shard's ids put in place at once, not one by one
        for s in np.unique(shard).tolist():
            at = np.flatnonzero(shard == s)
            placed[at] = ids_at(ids[s], all_rows[order[at]])
        picked = placed.tolist()
    return list(zip(picked, all_scores[order].tolist(), strict=True))


def complete_legs(parts: list[LegPart], k: int, depth: int, again: Callable[[int], LegPart]) -> int:
    """Asks again (``again(i)``: shard i's leg for all k) each shard whose share of the top k may have been short
    (``shares.short_shares``); replaces those parts in place and returns how many shards were asked again."""
    asked = short_shares([Share(p.scores, depth, k) for p in parts], k)
    for i in asked:
        deeper = again(i)
        parts[i] = LegPart(deeper.rows, deeper.scores, parts[i].ms + deeper.ms)
    return len(asked)


def id_ranks(services: Sequence[ShardService]) -> list[np.ndarray]:
    """Per shard, each row's position among all the group's chunk ids in sorted order (the ids read once, then
    dropped: 4 bytes a chunk kept)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = [s.table.column("chunk_id") for s in services]
    total = sum(len(c) for c in columns)
    rank = np.empty(total, dtype=np.int32 if total < 2**31 else np.int64)
    if total:
        order = pc.sort_indices(pa.chunked_array([chunk for c in columns for chunk in c.chunks], pa.string()))
        rank[order.to_numpy()] = np.arange(total, dtype=rank.dtype)
    bounds = np.cumsum([0] + [len(c) for c in columns])
    return [rank[bounds[i]:bounds[i + 1]] for i in range(len(services))]


ANALYZED_TEXTS = 256  # recent queries' analyzed terms a group keeps (``ShardGroup.terms``)
ROWS = 1 << 40  # more rows than a shard holds: ``ShardGroup.where`` packs (shard, row) as shard * ROWS + row
WARMUP_SECONDS = 10.0  # the most a replica spends warming the JVM when it opens a version (``warm_up``)


class ShardGroup:
    def __init__(self, services: Sequence[ShardService]):
        if not services:
            raise ValueError("a shard group needs at least one shard")
        self.services = list(services)
        self.name = ",".join(s.name for s in self.services)
        self.shard_ids = [s.ids for s in self.services]
        self.ranks = id_ranks(self.services)
        # Shards asked again for a leg's whole k (``complete_legs``) since opened, per leg (the legs may run on two
        # threads at once, each counting its own).
        self.deepened = {"dense": 0, "keyword": 0}
        self.analyzed: BoundedCache[str, tuple[str, ...]] = BoundedCache(ANALYZED_TEXTS)
        # The keyword leg's terms of each recent text (``keyword_terms``), by (text, fields searched).
        self.bounded: BoundedCache[tuple[str, int], tuple[list[str], int, int]] = BoundedCache(ANALYZED_TEXTS)

    @functools.cached_property
    def facts_reader(self) -> FactsReader:
        """The group's shards as a ranking model's features read them (one call into the JVM a query)."""
        return FactsReader([s.lucene for s in self.services])

    @property
    def size(self) -> int:
        return len(self.services)

    def where(self, chunk_ids: Sequence[str]) -> np.ndarray:
        """Each id as shard * ROWS + row of the shard that holds it (-1 where none of the group's does)."""
        code = np.full(len(chunk_ids), -1, dtype=np.int64)
        for i, s in enumerate(self.services):
            if not (code < 0).any():
                break
            rows = s.ids.rows_of(chunk_ids)
            found = (rows >= 0) & (code < 0)
            code[found] = i * ROWS + rows[found]
        return code

    def locate(self, chunk_id: str) -> tuple[int, int]:
        """(the shard that holds the chunk, its row there); KeyError when none of the group's does."""
        code = int(self.where([chunk_id])[0])
        if code < 0:
            raise KeyError(chunk_id)
        return divmod(code, ROWS)

    def terms(self, text: str) -> list[str]:
        """The text as the group's shards analyze it (one analyzer for all), kept for the most recent texts: a
        search's ranking features are asked of the text its keyword leg analyzed a moment before."""
        terms = self.analyzed.get(text)
        if terms is None:
            terms = tuple(self.services[0].analyze(text))
            self.analyzed.put(text, terms)
        return list(terms)

    def keyword_terms(self, query: ShardQuery) -> tuple[list[str], int, int]:
        """The terms the keyword leg searches (``bounded_terms``: a long query's rarest), with (kept, distinct)."""
        key = (query.text, len(query.field_weights or (1,)))
        found = self.bounded.get(key)
        if found is None:  # asked twice a search (the leg, then its answer): bounded once
            df = self.services[0].lucene.corpus_df
            found = bounded_terms(self.terms(query.text), lambda t: df.get(t, 0), key[1])
            self.bounded.put(key, found)
        return found

    def check(self) -> None:
        for s in self.services:
            s.check()

    def close(self) -> None:
        for s in self.services:
            s.close()

    @property
    def chunks(self) -> int:
        return sum(s.chunks for s in self.services)

    def info(self, version: str) -> dict:
        """What a shard slot reports (health, the fields filters may name, activation's warm-up answer)."""
        return {"shard": self.name, "shards": {s.name: s.chunks for s in self.services}, "chunks": self.chunks,
                "fields": self.fields(), "version": version}

    def fields(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for s in self.services:
            out.update(s.fields())
        return out

    def search(self, query: ShardQuery) -> ShardAnswer:
        """Each leg's top hits over the group's shards, as one shard holding them all would answer. The steps
        run here one after another; ``ShardHost.search`` runs the two legs side by side on two threads."""
        t0 = time.perf_counter()
        allowed = self.allowed(query)
        if isinstance(allowed, str):
            return ShardAnswer(self.name, shards=self.size, filter_error=allowed)
        return self.answer(query, self.dense_legs(query, allowed), self.keyword_legs(query, allowed), allowed, t0)

    def allowed(self, query: ShardQuery) -> list[np.ndarray | None] | str:
        """Per shard, the rows a search may return (``ShardService.allowed_rows``), or why the filter is refused."""
        if not query.restricted:
            return [None] * self.size
        try:
            return [s.allowed_rows(query.filters, query.acl) for s in self.services]
        except FilterError as e:
            return str(e)

    def dense_legs(self, query: ShardQuery, allowed: list[np.ndarray | None]) -> list[LegPart]:
        """Each shard's dense candidates for the group's top k (none when the leg is not asked for): each shard
        is asked for its likely share (``shard_depth``), and again for k where that might not be enough. For
        HNSW this is also what lets each shard explore less (efSearch is never below the depth asked)."""
        if not query.dense:
            return []
        vector, k, ann, encoder = query.vector, query.k_dense, query.ann, query.encoder
        depth = shard_depth(k, self.size)
        parts = [_timed(s.dense_leg, vector, depth, rows, ann, encoder)
                 for s, rows in zip(self.services, allowed, strict=True)]
        self.deepened["dense"] += complete_legs(
            parts, k, depth, lambda i: _timed(self.services[i].dense_leg, vector, k, allowed[i], ann, encoder))
        return parts

    def keyword_legs(self, query: ShardQuery, allowed: list[np.ndarray | None]) -> list[LegPart]:
        """Each shard's BM25 candidates for the group's top k (none when the leg is not asked for), asked as
        ``dense_legs`` asks; the query is analyzed once. (Asked for k, the shards would instead share one top-k
        collector, each skipping what cannot reach the k best so far: measured at a million chunks in 4 shards,
        asking each for 70 alone cost less, 7.4 against 8.6 ms of CPU a query.)"""
        if not query.keyword:
            return []
        k = query.k_keyword
        terms = self.keyword_terms(query)[0]
        depth = shard_depth(k, self.size)
        shared = self.services[0].lucene.shared_top_k(k) if self.size > 1 and depth == k else None
        weights = query.field_weights
        parts = [_timed(s.keyword_leg, terms, depth, rows, shared, weights)
                 for s, rows in zip(self.services, allowed, strict=True)]
        self.deepened["keyword"] += complete_legs(
            parts, k, depth, lambda i: _timed(self.services[i].keyword_leg, terms, k, allowed[i], None, weights))
        return parts

    def answer(self, query: ShardQuery, dense: list[LegPart], keyword: list[LegPart],
               allowed: list[np.ndarray | None], t0: float) -> ShardAnswer:
        """The group's answer from its shards' legs: each leg merged to its top-k, and the rows of the best
        hits sent along."""
        answer = ShardAnswer(self.name, shards=self.size)
        if dense:
            answer.dense = _best([d.rows for d in dense], [d.scores for d in dense], self.ranks, self.shard_ids,
                                 query.k_dense)
        if keyword:
            answer.keyword = _best([d.rows for d in keyword], [d.scores for d in keyword], self.ranks,
                                   self.shard_ids, query.k_keyword)
            _, kept, distinct = self.keyword_terms(query)
            if kept < distinct:
                answer.terms = (kept, distinct)
        if any(rows is not None for rows in allowed):
            answer.allowed = sum(len(rows) for rows in allowed if rows is not None)
        if (top := query.rows_for_top) > 0:
            best = dict.fromkeys(cid for cid, _ in answer.dense[:top] + answer.keyword[:top])
            answer.rows = self.fetch(list(best))
        answer.shard_ms = {s.name: (dense[i].ms if dense else 0.0) + (keyword[i].ms if keyword else 0.0)
                           for i, s in enumerate(self.services)}
        answer.took_ms = (time.perf_counter() - t0) * 1000
        return answer

    def warm_up(self, searches: int, seed: int = 0, seconds: float = WARMUP_SECONDS) -> None:
        """BM25 searches of random corpus terms, so the JVM compiles Lucene's hot paths before real queries
        come (the first few thousand searches of a JVM cost several times the later ones); for ``seconds`` at most,
        so a replica of large shards (whose searches cost more) is not kept from serving for long."""
        if searches <= 0:
            return
        import random
        import time

        rng = random.Random(seed)
        lucene = self.services[0].lucene
        vocabulary = [t for t, _ in zip(lucene.corpus_df, range(50_000), strict=False)]
        if not vocabulary:
            return
        until = time.monotonic() + seconds
        for _ in range(max(1, searches // len(self.services))):
            terms = rng.choices(vocabulary, k=rng.randint(2, 12))
            for s in self.services:
                s.lucene.search_rows(terms, 200)
            if time.monotonic() > until:
                break

    def fetch(self, chunk_ids: list[str]) -> list[dict]:
        """Chunk rows for the ids this group holds, in the order asked."""
        if len(self.services) == 1:
            return self.services[0].fetch(chunk_ids)
        located = [divmod(int(code), ROWS) for code in self.where(chunk_ids) if code >= 0]
        per_shard: list[list[int]] = [[] for _ in self.services]
        for shard, row in located:
            per_shard[shard].append(row)
        rows = [iter(s.rows_at(r)) if r else iter(()) for s, r in zip(self.services, per_shard, strict=True)]
        return [next(rows[shard]) for shard, _ in located]

    def vectors(self, chunk_ids: list[str]) -> np.ndarray:
        """The stored vectors of these chunks, in the order asked (one read per shard)."""
        out: list[np.ndarray | None] = [None] * len(chunk_ids)
        for s in self.services:
            rows = s.ids.rows_of(chunk_ids)  # found once: the shard's own ``vectors`` would look them up again
            mine = np.flatnonzero(rows >= 0)
            if len(mine):
                for i, v in zip(mine.tolist(), s.vectors_at(rows[mine]), strict=True):
                    out[i] = v
        missing = [c for c, v in zip(chunk_ids, out, strict=True) if v is None]
        if missing:
            raise KeyError(f"chunk {missing[0]!r} is not in shards {self.name}")
        return np.stack(out) if out else np.zeros((0, 0), dtype=np.float32)

    def features(self, query: FeatureQuery) -> dict[str, np.ndarray]:
        """Each shard's features of the candidates it holds, as one table in the order asked (each candidate found
        in one lookup, ``where``)."""
        code = self.where(query.chunk_ids)
        shard, rows = np.divmod(code, ROWS)
        located = [(at, rows[at]) for at in (np.flatnonzero((code >= 0) & (shard == i)) for i in range(self.size))]
        postings = query.reads_postings and bool((code >= 0).any())
        return candidates_features(self.services, self.facts_reader if postings else None, query, located,
                                   self.terms(query.text) if postings else [])

    def features_in_memory(self, query: FeatureQuery) -> bool:
        """Whether ``features(query)`` is array reads only: no Lucene call (the query wants nothing from the postings)
        and no chunk table to read (each shard's lengths were read by an earlier call)."""
        return not query.reads_postings and all(s.row_facts_read for s in self.services)

    def list_documents(self, query: DocumentsQuery) -> DocumentsAnswer:
        """A page of the group's documents in id order, as one shard holding them all would list them."""
        try:
            return merged_pages([s.list_documents(query) for s in self.services], query.limit)
        except FilterError as e:
            return DocumentsAnswer(filter_error=str(e))

    def vocabulary(self, acl: tuple[str, list[str]] | None = None) -> dict[str, int]:
        df: dict[str, int] = {}
        for s in self.services:
            for word, n in s.vocabulary(acl).items():
                df[word] = df.get(word, 0) + n
        return df
