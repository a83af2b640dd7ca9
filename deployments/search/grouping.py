"""Results shaped for a RAG context: a ranking grouped (one entry per document, or per value of a metadata field),
and near-duplicates dropped. Ray-free, over the one hit type (``Hit``).

Why: chunks of 128 words overlapping by 24 put several neighbours of one document into one page; a caller that
fills a context or a result list wants distinct documents first. Grouping runs after fusion, reranking, the
ranking model and the threshold, over the whole candidate window, so a group sits at the rank of its best chunk
and pages count groups (``SearchRequest.group_by``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import numpy as np

from deployments.search.hits import Hit


class Group(NamedTuple):
    """A group's kept hits, best first: ``hits[0]`` is the group's best and gives the group its rank;
    ``found``: how many of the ranking's hits fell in the group (kept or not)."""

    hits: list[Hit]
    found: int


def group_hits(hits: Sequence[Hit], keys: Sequence[Hashable | None], size: int) -> list[Group]:
    """``hits`` (best first) grouped by ``keys`` (one per hit), each group keeping its ``size`` best hits.

    Groups are in the order of their best hit: grouping never reorders what ranked first, it only folds later
    hits of a group into it. A key of None (a chunk without the grouping field) is a group of its own. An empty
    input returns []. Ties need no rule of their own: the input's order already broke them."""
    if len(keys) != len(hits):
        raise ValueError(f"{len(hits)} hits but {len(keys)} keys: pass one key per hit")
    if size < 1:
        raise ValueError(f"group size {size}: keep at least 1 hit per group")
    groups: list[Group] = []
    at: dict[Hashable, int] = {}
    for hit, key in zip(hits, keys, strict=True):
        i = at.get(key) if key is not None else None
        if i is None:
            if key is not None:
                at[key] = len(groups)
            groups.append(Group([hit], 1))
            continue
        kept, found = groups[i]
        if len(kept) < size:
            kept.append(hit)
        groups[i] = Group(kept, found + 1)
    return groups


def without_near_duplicates(hits: Sequence[Hit], vectors: np.ndarray, threshold: float) -> list[Hit]:
    """``hits`` (best first) without each hit whose vector is within ``threshold`` cosine similarity of a
    better-ranked hit already kept: ``cos(v_i, v_j) >= threshold`` drops ``i`` for a kept ``j`` ranked above it.

    Greedy in rank order (a dropped hit never drops another), so the best of a cluster of near-copies stays.
    Vectors are normalized here, so encoders that do not emit unit vectors are compared by cosine too. An empty
    input returns []; ``threshold`` 1 drops exact copies only."""
    if len(vectors) != len(hits):
        raise ValueError(f"{len(hits)} hits but {len(vectors)} vectors: pass one vector per hit, in the same order")
    if not hits:
        return []
    unit = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(unit, axis=1, keepdims=True)
    unit = unit / np.where(norms == 0, 1.0, norms)
    kept: list[int] = []
    for i in range(len(hits)):
        # 1e-9: an exact copy's cosine computes as 1 - 1e-16, and threshold 1 must still drop it.
        if not kept or float(np.max(unit[kept] @ unit[i])) < threshold - 1e-9:
            kept.append(i)
    return [hits[i] for i in kept]
