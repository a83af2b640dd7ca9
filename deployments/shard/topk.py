"""The one top-k of the service, over arrays: a shard's leg, a group's merge of its shards, the fresh segment, the
router's merge of shard slots and fusion all rank with it, so every ranking breaks ties the same way.

Order: score descending, then each tie key ascending (the chunk id, or its rank among the ids; then the collection),
as Pyserini's fusion does, so a ranking never depends on dict, set or shard order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

# Above this many candidates per k, the k best and their ties are cut out first (a partition, linear) before the
# exact sort; below it one sort of everything costs less.
PARTITION_FACTOR = 4


def top_k(scores: np.ndarray, k: int, *ties: np.ndarray) -> np.ndarray:
    """Positions of the ``k`` best of ``scores`` (fewer when there are fewer), best first: score descending, then
    ``ties[0]`` ascending, then ``ties[1]`` ... (each an array as long as ``scores``: integers or strings).
    NaN scores rank last. An empty input, or ``k <= 0``: an empty array."""
    scores = np.asarray(scores, dtype=np.float64)
    n = len(scores)
    if k <= 0 or n == 0:
        return np.zeros(0, dtype=np.int64)
    negated = _negated(scores)
    kept = contenders(scores, k)
    keys = [np.asarray(t)[kept] for t in reversed(ties)] + [negated[kept]]
    return kept[np.lexsort(keys)[:k]]


def top_k_by(scores: np.ndarray, k: int, tie: Callable[[int], Any]) -> list[int]:
    """``top_k``'s order where the tie keys cost something to make (a Python object's fields): the scores are sorted as
    an array and ``tie(position)`` is asked only of positions whose scores tie, which real scores seldom do. Positions,
    best first, as a list."""
    scores = np.asarray(scores, dtype=np.float64)
    if k <= 0 or not len(scores):
        return []
    kept = contenders(scores, k)
    negated = _negated(scores[kept])
    by_score = np.argsort(negated, kind="stable")
    order, sorted_scores = kept[by_score].tolist(), negated[by_score]
    ties = np.flatnonzero(sorted_scores[1:] == sorted_scores[:-1])
    if len(ties):
        for start, stop in _runs(ties):
            order[start:stop] = sorted(order[start:stop], key=tie)
    return order[:k]


_FINITE = np.finfo(np.float64).max


def _negated(scores: np.ndarray) -> np.ndarray:
    """``-np.nan_to_num(scores, nan=-inf)`` (what an ascending sort ranks by: NaN last, an infinite score as the
    largest finite one), in a few ufunc passes: ``nan_to_num`` costs more than the sort of a leg's few hundred."""
    negated = np.negative(scores)
    np.minimum(negated, _FINITE, out=negated)  # NaN stays NaN through both
    np.maximum(negated, -_FINITE, out=negated)
    np.copyto(negated, np.inf, where=np.isnan(negated))
    return negated


def _runs(ties: np.ndarray) -> Iterator[tuple[int, int]]:
    """(start, stop) of each run of equal neighbours, from the positions ``i`` where ``sorted[i + 1] == sorted[i]``."""
    start = prev = int(ties[0])
    for i in ties[1:].tolist():
        if i != prev + 1:
            yield start, prev + 2
            start = i
        prev = i
    yield start, prev + 2


def contenders(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions that may be among the ``k`` best: every one when they are few, else the k best and every score tied
    with the k-th (a partition, linear). A caller whose tie keys cost something to build (chunk ids read row by row)
    builds them for these only, then ranks them with ``top_k``."""
    scores = np.asarray(scores, dtype=np.float64)
    n = len(scores)
    if k <= 0 or n <= PARTITION_FACTOR * k:
        return np.arange(n)
    negated = _negated(scores)
    kth = np.partition(negated, k - 1)[k - 1]
    return np.flatnonzero(negated <= kth)
