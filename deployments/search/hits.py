"""The one small result type that flows shard -> fusion -> MMR -> rerank -> assembly.

Between deployments only ids and scores travel (Ray Serve's cost grows with payload); texts are
fetched for the final top-n only.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import NamedTuple


class Hit(NamedTuple):
    """Immutable; a named tuple rather than a frozen dataclass because a request makes about a thousand
    of them and a frozen dataclass's ``__init__`` costs several times a tuple's."""

    chunk_id: str
    score: float
    shard: int = -1


def rank_key(hit: Hit) -> tuple[float, str]:
    """Deterministic order: score descending, then chunk id ascending."""
    return (-hit.score, hit.chunk_id)


def merge_top_k(per_shard: Iterable[list[Hit]], k: int) -> list[Hit]:
    """The global top-k of per-shard top-k lists (each shard's top-k holds every global top-k member it has)."""
    return heapq.nsmallest(k, (h for hits in per_shard for h in hits), key=rank_key)
