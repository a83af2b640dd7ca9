"""Maximal Marginal Relevance: re-order fused candidates so the top of the list is not one idea repeated."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from deployments.search.hits import Hit


def mmr(
    candidates: Sequence[Hit],
    query_vector: np.ndarray,
    candidate_vectors: np.ndarray,
    k: int,
    lambda_: float = 0.5,
    relevance: Sequence[float] | None = None,
) -> list[Hit]:
    """Greedy MMR selection of ``k`` candidates.

    Carbonell and Goldstein, "The Use of MMR, Diversity-Based Reranking for Reordering Documents and
    Producing Summaries", SIGIR 1998. At each step pick

        argmax_{d not in S}  lambda_ * sim(q, d) - (1 - lambda_) * max_{s in S} sim(d, s)

    with ``sim`` the dot product (cosine similarity, since encoder vectors are unit length); the
    redundancy term is 0 while ``S`` is empty. ``lambda_ = 1`` is exactly relevance order by ``sim(q, d)``
    and ``lambda_ = 0`` is pure diversity.

    ``relevance`` replaces ``sim(q, d)`` when the candidates already carry a better relevance estimate
    (the router passes min-max normalized fused scores, so that ``lambda_ = 1`` keeps the fused order
    of a hybrid search); it should be on the scale of cosine similarity, [0, 1].

    ``candidate_vectors[i]`` belongs to ``candidates[i]``. The returned Hits keep their own (fused) score
    and come in selection order. ``k`` larger than the pool returns every candidate; no candidates or
    ``k = 0``: ``[]``. Ties in the objective: chunk id ascending.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"lambda_ must be in [0, 1], got {lambda_}; 1 is relevance only, 0 diversity only")
    q = np.asarray(query_vector, dtype=np.float64)
    vecs = np.asarray(candidate_vectors, dtype=np.float64)
    if not candidates and vecs.size == 0:
        return []
    if q.ndim != 1:
        raise ValueError(f"query_vector must be 1-d, got shape {q.shape}")
    if vecs.ndim != 2 or vecs.shape != (len(candidates), q.shape[0]):
        raise ValueError(
            f"candidate_vectors must have shape ({len(candidates)}, {q.shape[0]}) (one row per candidate, "
            f"the query's dimension), got {vecs.shape}"
        )
    # Work in chunk-id order so that np.argmax, which returns the first maximum, breaks ties by chunk id.
    order = sorted(range(len(candidates)), key=lambda i: candidates[i].key)
    vecs = vecs[order]
    if relevance is None:
        rel = vecs @ q
    else:
        if len(relevance) != len(candidates):
            raise ValueError(f"relevance has {len(relevance)} values for {len(candidates)} candidates")
        rel = np.asarray(relevance, dtype=np.float64)[order]
    redundancy = np.zeros(len(order))  # max similarity to the selected set; 0 while it is empty
    taken = np.zeros(len(order), dtype=bool)
    picked: list[int] = []
    for _ in range(min(k, len(order))):
        objective = lambda_ * rel - (1.0 - lambda_) * redundancy
        objective[taken] = -np.inf
        j = int(np.argmax(objective))
        taken[j] = True
        sims = vecs @ vecs[j]
        redundancy = sims if not picked else np.maximum(redundancy, sims)
        picked.append(j)
    return [candidates[order[j]] for j in picked]
