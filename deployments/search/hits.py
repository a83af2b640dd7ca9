"""The one small result type that flows shard -> fusion -> MMR -> rerank -> assembly.

Between deployments only ids and scores travel (Ray Serve's cost grows with payload); texts are
fetched for the final top-n only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import compress, repeat
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from deployments.shard.topk import top_k_by


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


def hits_from(chunk_ids: Iterable[str], scores: Iterable[float], shards: Iterable[int],
              collections: Iterable[str]) -> list[Hit]:
    """Hits from their fields' columns, in order, each made by ``tuple.__new__``: a named tuple's own constructor is
    a Python call, twice the cost, and a request makes a few hundred hits."""
    new = tuple.__new__
    # not strict: ``shards`` and ``collections`` may be endless (``hits_of``'s repeat)
    return [new(Hit, fields) for fields in zip(chunk_ids, scores, shards, collections, strict=False)]


def hits_of(chunk_ids: Iterable[str], scores: Iterable[float], shard: int = -1, collection: str = "") -> list[Hit]:
    """Hits of one shard and collection (``hits_from``)."""
    return hits_from(chunk_ids, scores, repeat(shard), repeat(collection))


def best(hits: Sequence[Hit], k: int | None = None) -> list[Hit]:
    """The ``k`` best hits (all when None): score descending, then chunk id, then collection ascending (the order of
    every ranking, ``topk.top_k``'s)."""
    n = len(hits)
    order = ranked(np.fromiter(map(score_of, hits), dtype=np.float64, count=n), n if k is None else k, hits)
    return list(map(hits.__getitem__, order))


def rescored(hits: Sequence[Hit], scores: np.ndarray) -> list[Hit]:
    """``hits`` with new ``scores`` (in the hits' order), ranked by them as ``best`` ranks."""
    order = ranked(scores, len(hits), hits)
    chosen = list(map(hits.__getitem__, order))
    return hits_from(map(chunk_id_of, chosen), scores[order].tolist(), map(shard_of, chosen),
                     map(collection_of, chosen))


def ranked(scores: np.ndarray, k: int, hits: Sequence[Hit]) -> list[int]:
    """Positions of the ``k`` best ``scores`` (fewer when there are fewer), best first, ties broken by each one's hit's
    (chunk id, collection) ascending (``topk.top_k_by``): no string array is made."""
    return top_k_by(scores, k, lambda i: (hits[i][0], hits[i][3]))


# A hit's fields read as a tuple's items (the named fields and ``Hit.key`` cost a Python call a hit).
chunk_id_of, score_of, shard_of, collection_of = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3)
key_of = itemgetter(0, 3)


def keys_of(hits: Iterable[Hit]) -> list[tuple[str, str]]:
    """Each hit's ``key``, in order (read as a tuple's items: the property costs a Python call a hit)."""
    return list(map(key_of, hits))


def scores_by_key(hits: Iterable[Hit], wanted: set[tuple[str, str]] | None = None
                  ) -> dict[tuple[str, str], float]:
    """Each hit's score by its ``key`` (a later hit of the same key wins, as a dict's update); with ``wanted``, only
    theirs: a page's few among a ranking's hundreds, found by chunk id in C before a key is made."""
    hits = list(hits)
    if wanted is not None:
        ids = {chunk_id for chunk_id, _ in wanted}
        hits = [h for h in compress(hits, map(ids.__contains__, map(chunk_id_of, hits))) if key_of(h) in wanted]
    return dict(zip(map(key_of, hits), map(score_of, hits), strict=True))



def merge_top_k(per_shard: Iterable[list[Hit]], k: int) -> list[Hit]:
    """The global top-k of per-shard top-k lists (each shard's top-k holds every global top-k member it has)."""
    return best([h for hits in per_shard for h in hits], k)
