"""A shard group's merge of its shards' legs (``group._best``) against sorting every candidate by hand."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.shard.group import _best


def ranks_of(ids: list[list[str]]) -> list[np.ndarray]:
    """Each row's position among all the group's ids in sorted order (``group.id_ranks``'s)."""
    flat = sorted(i for shard in ids for i in shard)
    position = {chunk_id: i for i, chunk_id in enumerate(flat)}
    return [np.array([position[i] for i in shard], dtype=np.int32) for shard in ids]


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_the_k_best_of_every_shard_s_candidates_score_then_id(shards):
    rng = np.random.default_rng(shards)
    for _ in range(200):
        ids = [[f"d{rng.integers(10**6)}-{s}-{r}" for r in range(rng.integers(0, 40))] for s in range(shards)]
        ranks = ranks_of(ids)
        rows, scores = [], []
        for shard in ids:
            n = rng.integers(0, len(shard) + 1)
            rows.append(rng.permutation(len(shard))[:n].astype(np.int64))
            scores.append(rng.integers(0, 5, size=n).astype(np.float32))  # few distinct scores: ties everywhere
        every = [(ids[s][r], float(sc)) for s in range(shards) for r, sc in zip(rows[s], scores[s], strict=True)]
        for k in (1, 7, 200):
            expected = sorted(every, key=lambda pair: (-pair[1], pair[0]))[:k]
            got = _best(rows, scores, ranks, ids, k)
            assert got == expected
            assert all(type(chunk_id) is str and type(score) is float for chunk_id, score in got)
