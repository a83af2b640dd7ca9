"""Fusing ranked runs (BM25, dense, per shard) into one ranking, and the small knobs around it.

Every function is pure and returns a new list. Ties are always broken the same way: score descending,
then chunk id ascending (then collection: ``hits.best``), so a fused ranking does not depend on dict or set
order. A chunk is one candidate per collection (``Hit.key``): the same chunk id in two collections is two.
"""

from __future__ import annotations

from collections.abc import Sequence

from deployments.search.hits import Hit, best


def _first_occurrences(run: Sequence[Hit]) -> list[Hit]:
    """The run with later duplicates of a chunk removed (a run is sorted best first, so the first is the best)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for hit in run:
        if hit.key not in seen:
            seen.add(hit.key)
            out.append(hit)
    return out


def _check_weights(runs: Sequence[Sequence[Hit]], weights: Sequence[float]) -> None:
    if len(weights) != len(runs):
        raise ValueError(
            f"got {len(weights)} weights for {len(runs)} runs; give exactly one weight per run "
            "(or none, for equal weights)"
        )


def _ranked(scores: dict[tuple[str, str], float], shard_of: dict[tuple[str, str], int]) -> list[Hit]:
    return best([Hit(key[0], s, shard_of[key], key[1]) for key, s in scores.items()])


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
    scores: dict[tuple[str, str], float] = {}
    shard_of: dict[tuple[str, str], int] = {}
    for run, w in zip(runs, weights, strict=True):
        for rank, hit in enumerate(_first_occurrences(run), start=1):
            key = hit.key
            scores[key] = scores.get(key, 0.0) + w / (rrf_k + rank)
            shard_of.setdefault(key, hit.shard)
    return _ranked(scores, shard_of)


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
    scores: dict[tuple[str, str], float] = {}
    shard_of: dict[tuple[str, str], int] = {}
    for run, w in zip(runs, weights, strict=True):
        run = _first_occurrences(run)
        if not run:
            continue
        # min_max inlined (the same arithmetic): this runs on every hybrid request over hundreds of hits.
        lo = min(h.score for h in run)
        span = max(h.score for h in run) - lo
        for hit in run:
            key = hit.key
            scores[key] = scores.get(key, 0.0) + w * ((hit.score - lo) / span if span else 1.0)
            if key not in shard_of:
                shard_of[key] = hit.shard
    return _ranked(scores, shard_of)


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
