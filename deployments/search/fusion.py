"""Fusing ranked runs (BM25, dense, per shard) into one ranking, and the small knobs around it.

Every function is pure and returns a new list. Ties are always broken the same way: score descending,
then chunk id ascending (then collection: ``hits.best``), so a fused ranking does not depend on dict or set
order. A chunk is one candidate per collection (``Hit.key``): the same chunk id in two collections is two.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, count

import numpy as np

from deployments.search.hits import Hit, best, chunk_id_of, collection_of, key_of, rescored, score_of


def _check_weights(runs: Sequence[Sequence[Hit]], weights: Sequence[float]) -> None:
    if len(weights) != len(runs):
        raise ValueError(
            f"got {len(weights)} weights for {len(runs)} runs; give exactly one weight per run "
            "(or none, for equal weights)"
        )


class _Pool:
    """The candidates of several runs, each once: what each run gives each one is added up, and a candidate keeps the
    hit it first appears as (its shard). A candidate is told apart by its chunk id alone when every hit is of one
    collection (a collection's legs, the usual case), else by ``Hit.key``. Built with dict and map calls that run in
    C, not a Python step a hit: a request fuses a few hundred."""

    def __init__(self, runs: Sequence[Sequence[Hit]]):
        self.key = chunk_id_of if len(set(map(collection_of, chain.from_iterable(runs)))) <= 1 else key_of
        self.keys: list[list] = []
        self.hits: list[Sequence[Hit]] = []
        self.values: list[np.ndarray] = []

    def distinct(self, run: Sequence[Hit]) -> tuple[list, Sequence[Hit]]:
        """The run's distinct candidates in its order (keys, and the best hit of each: a run is sorted best first)."""
        keys = list(map(self.key, run))
        if len(set(keys)) == len(keys):
            return keys, run
        first: dict = {}
        for key, hit in zip(keys, run, strict=True):
            first.setdefault(key, hit)
        return list(first), list(first.values())

    def add(self, keys: list, hits: Sequence[Hit], values: np.ndarray) -> None:
        """``values[j]`` added to the candidate ``keys[j]`` (first seen as ``hits[j]``)."""
        self.keys.append(keys)
        self.hits.append(hits)
        self.values.append(values)

    def ranked(self) -> list[Hit]:
        """Every candidate with its summed score, best first (``hits.rescored``)."""
        every = list(chain.from_iterable(self.keys))
        position = dict(zip(dict.fromkeys(every), count()))
        at = np.fromiter(map(position.__getitem__, every), dtype=np.int64, count=len(every))
        scores = np.zeros(len(position))
        np.add.at(scores, at, np.concatenate(self.values) if self.values else np.zeros(0))
        # the hit each candidate first appears as: later runs' copies written first, so the first run's stay
        first = dict(zip(reversed(every), reversed(list(chain.from_iterable(self.hits))), strict=True))
        return rescored(list(map(first.__getitem__, position)), scores)


def rrf(runs: Sequence[Sequence[Hit]], rrf_k: int = 60, weights: Sequence[float] | None = None) -> list[Hit]:
    """Reciprocal Rank Fusion: ``score(d) = sum_i w_i / (rrf_k + rank_i(d))``.

    Cormack, Clarke and Buettcher, "Reciprocal Rank Fusion outperforms Condorcet and individual Rank
    Learning Methods", SIGIR 2009 (``rrf_k = 60`` there). ``rank_i`` is 1-based in run ``i``, which must
    already be sorted best first; a run's own scores are ignored. A document absent from a run gets
    nothing from it. Weights default to 1 for every run.

    Duplicates of a chunk within one run: only the first (best) occurrence counts, and ranks are taken
    after removing the later copies (a duplicate does not push the documents below it down).
    The output Hit's ``shard`` comes from the first run the chunk appears in.
    No runs, or only empty runs: ``[]``. Ties: score descending, then chunk id ascending.
    """
    if rrf_k < 0:
        raise ValueError(f"rrf_k must be >= 0, got {rrf_k}; the paper's value is 60")
    if weights is None:
        weights = [1.0] * len(runs)
    _check_weights(runs, weights)
    pool = _Pool(runs)
    for run, w in zip(runs, weights, strict=True):
        keys, hits = pool.distinct(run)
        pool.add(keys, hits, w / (rrf_k + np.arange(1, len(keys) + 1, dtype=np.float64)))
    return pool.ranked()


def min_max(hits: Sequence[Hit]) -> list[Hit]:
    """Scores mapped onto [0, 1]: ``(s - min) / (max - min)``, in the input order.

    When every score is equal (or there is one hit) there is no spread to normalize, and every score
    becomes 1.0 (each is the best the run has). Empty input: ``[]``.
    """
    if not hits:
        return []
    lo = min(h.score for h in hits)
    hi = max(h.score for h in hits)
    if hi == lo:
        return [Hit(h.chunk_id, 1.0, h.shard, h.collection) for h in hits]
    return [Hit(h.chunk_id, (h.score - lo) / (hi - lo), h.shard, h.collection) for h in hits]


def weighted(runs: Sequence[Sequence[Hit]], weights: Sequence[float]) -> list[Hit]:
    """Convex-combination fusion: ``score(d) = sum_i w_i * minmax_i(s_i(d))``, 0 where d is absent from run i.

    Fox and Shaw's CombSUM over min-max normalized scores (Lee, SIGIR 1997, "Analyses of multiple evidence
    combination"); with two runs and ``w = (alpha, 1 - alpha)`` it is the usual hybrid "alpha" blend.
    Each run is first reduced to the first occurrence of each chunk (as in ``rrf``) and then normalized,
    so a run whose scores are all equal gives every member its full weight.
    ``len(weights)`` must equal ``len(runs)`` (ValueError). The output ``shard`` comes from the first run
    the chunk appears in. No runs, or only empty runs: ``[]``. Ties: score descending, then chunk id
    ascending.
    """
    _check_weights(runs, weights)
    pool = _Pool(runs)
    for run, w in zip(runs, weights, strict=True):
        if not run:
            continue
        keys, hits = pool.distinct(run)
        scores = np.fromiter(map(score_of, hits), dtype=np.float64, count=len(hits))
        # min_max's arithmetic over the array: this runs on every hybrid request over hundreds of hits.
        lo = scores.min()
        span = scores.max() - lo
        pool.add(keys, hits, w * ((scores - lo) / span if span else np.ones(len(scores))))
    return pool.ranked()


def candidate_depth(limit: int, base: int = 50, factor: int = 4, cap: int = 1000) -> int:
    """How many candidates to ask each leg and shard for: ``min(cap, max(base, factor * limit))``.

    Fusion and MMR need a deeper pool than the page they return; ``base`` keeps small pages from starving
    fusion and ``cap`` bounds the cost of a large ``limit``.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return min(cap, max(base, factor * limit))


def is_flat(hits: Sequence[Hit], top: int = 10, rel_spread: float = 0.05) -> bool:
    """True when the best ``top`` scores lie within ``rel_spread * |best score|`` of each other.

    ``max - min <= rel_spread * |max|`` over the ``top`` best hits (ranked by score, then chunk id; the
    input need not be sorted). A flat head means the scores do not separate the candidates, so the router
    asks for deeper candidates. Fewer than 2 hits: False (nothing to compare).
    """
    head = best(hits, top)
    if len(head) < 2:
        return False
    highest, lowest = head[0].score, head[-1].score
    return highest - lowest <= rel_spread * abs(highest)


def relevance_scores(scores: Sequence[float], scale: str, weight_sum: float = 1.0) -> list[float]:
    """Each score of a ranking as a ``relevance_score`` in [0, 1], the one scale ``min_relevance_score``
    is judged on whatever the method (the seed's contract), in the input order.

    ``scale``:
    - ``probability``: already in [0, 1] (a reranker's sigmoid); clipped, so a model's rounding cannot leave it.
    - ``weighted``: a weighted fusion of min-max normalized legs, whose most is the sum of the weights; divided
      by ``weight_sum`` (with weights that sum to 1, as tuning uses, it is the fused score itself).
    - ``minmax``: scores with no fixed range (RRF, cosine, BM25): min-max over the ranking, so the best
      candidate is 1.0 and the worst 0.0; every score equal (or one): 1.0.
    Empty input: ``[]``.
    """
    if scale == "probability":
        return [min(1.0, max(0.0, s)) for s in scores]
    if scale == "weighted":
        if weight_sum <= 0:
            return [0.0 for _ in scores]
        return [min(1.0, max(0.0, s / weight_sum)) for s in scores]
    if scale != "minmax":
        raise ValueError(f"relevance scale {scale!r}: expected probability, weighted or minmax")
    if not scores:
        return []
    lo, hi = min(scores), max(scores)
    if hi == lo:
        return [1.0 for _ in scores]
    return [(s - lo) / (hi - lo) for s in scores]
