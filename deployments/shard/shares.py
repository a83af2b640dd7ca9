"""Asking each part of a partitioned index for its likely share of a merged top k, and again where that share may
have been short: the rule a shard group applies to its shards and the router to a collection's shard slots.

Documents are placed by a hash of their id, so a part holding a fraction ``p`` of them holds Binomial(k, p) of any
top k (Vespa's top-k-probability). Each part is first asked for that count's mean plus ``SHARD_DEPTH_Z`` standard
deviations (``share_depth``: 74 of 200 over 4 shards, not 200); a part whose share may have been too short is asked
again for all k (``short_shares``), so the merged top k is the same as if every part had been asked for k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Standard deviations above the mean share of a merged top k that each part is asked for.
SHARD_DEPTH_Z = 3.5


def share_depth(k: int, share: float) -> int:
    """Candidates to ask of a part holding ``share`` of the documents for a merged top ``k``: Binomial(k, share)'s
    mean plus ``SHARD_DEPTH_Z`` standard deviations, plus 2 (never more than k; all of it for the whole)."""
    if k <= 0 or share >= 1:
        return k
    return min(k, math.ceil(k * share + SHARD_DEPTH_Z * math.sqrt(k * share * (1 - share))) + 2)


def shard_depth(k: int, shards: int) -> int:
    """``share_depth`` of one of ``shards`` equal parts."""
    return share_depth(k, 1 / shards) if shards > 1 else k


@dataclass(frozen=True)
class Share:
    """One part's answer for one leg: its scores best first, the depth it was asked for, and the depth in full."""

    scores: Sequence[float] | np.ndarray
    asked: int
    full: int


def short_shares(shares: Sequence[Share], k: int, pool: Sequence[float] | np.ndarray | None = None) -> list[int]:
    """The parts to ask again for their full depth: those asked for less, that returned all they were asked for,
    and whose last score is not below the k-th best of the ``pool`` (every candidate of the merge; by default the
    shares' own). Only such a part can hold a hit of the merged top k that it did not return: its other hits all
    score at most its last."""
    if k <= 0:
        return []
    if pool is None:
        pool = np.concatenate([np.asarray(s.scores, dtype=np.float64) for s in shares]) if shares else np.zeros(0)
    pool = np.asarray(pool, dtype=np.float64)
    kth = np.partition(pool, len(pool) - k)[len(pool) - k] if len(pool) >= k else -np.inf
    return [i for i, s in enumerate(shares)
            if s.asked < s.full and s.asked > 0 and len(s.scores) >= s.asked and s.scores[s.asked - 1] >= kth]
