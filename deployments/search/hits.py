"""The one small result type that flows shard -> fusion -> MMR -> rerank -> assembly.

Between deployments only ids and scores travel (Ray Serve's cost grows with payload); texts are
fetched for the final top-n only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from deployments.shard.topk import top_k


class Hit(NamedTuple):
    """A candidate: its chunk, its score at the stage that made it, the shard (client index) it came from and
    the collection it belongs to. The same form from the shard's answer to the response: two collections may
    hold the same chunk id, so a candidate is told apart by ``key`` (chunk id and collection), never by an id
    packed with its collection.

    Immutable; a named tuple rather than a frozen dataclass because a request makes about a thousand
    of them and a frozen dataclass's ``__init__`` costs several times a tuple's."""

    chunk_id: str
    score: float
    shard: int = -1
    collection: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """What identifies a candidate across collections: (chunk id, collection)."""
        return (self.chunk_id, self.collection)


def best(hits: Sequence[Hit], k: int | None = None) -> list[Hit]:
    """The ``k`` best hits (all when None): score descending, then chunk id, then collection ascending
    (``topk.top_k``, the order of every ranking)."""
    if not hits:
        return []
    order = top_k(np.fromiter((h.score for h in hits), dtype=np.float64, count=len(hits)),
                  len(hits) if k is None else k,
                  np.array([h.chunk_id for h in hits]), np.array([h.collection for h in hits]))
    return [hits[i] for i in order.tolist()]


def merge_top_k(per_shard: Iterable[list[Hit]], k: int) -> list[Hit]:
    """The global top-k of per-shard top-k lists (each shard's top-k holds every global top-k member it has)."""
    return best([h for hits in per_shard for h in hits], k)
