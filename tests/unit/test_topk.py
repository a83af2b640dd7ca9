"""The one top-k: score descending, then the tie keys ascending, cut at k; checked by hand and against sorting."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.shard.topk import PARTITION_FACTOR, top_k


def test_ties_go_to_the_smaller_key_then_the_next_key():
    scores = np.array([0.5, 0.9, 0.5, 0.9, 0.1])
    ids = np.array(["d", "b", "a", "c", "e"])
    assert top_k(scores, 3, ids).tolist() == [1, 3, 2]  # 0.9 b, 0.9 c, then 0.5 a before 0.5 d
    collections = np.array(["y", "y", "x", "x", "x"])
    same_ids = np.array(["a", "a", "a", "a", "a"])
    assert top_k(scores, 5, same_ids, collections).tolist() == [3, 1, 2, 0, 4]  # the same id: the collection decides


@pytest.mark.parametrize("k", [0, -1])
def test_nothing_asked_or_nothing_given_is_empty(k):
    assert top_k(np.array([1.0, 2.0]), k).tolist() == []
    assert top_k(np.zeros(0), 5, np.zeros(0, dtype=np.int64)).tolist() == []


def test_fewer_than_k_and_nan_last():
    assert top_k(np.array([np.nan, 2.0, 3.0]), 10, np.array([0, 1, 2])).tolist() == [2, 1, 0]


@pytest.mark.parametrize("n", [5, 40, PARTITION_FACTOR * 10 + 7, 2000])
def test_equals_sorting_everything_with_many_ties(n):
    """The partition's cut (taken past PARTITION_FACTOR * k candidates) keeps every tie of the k-th score."""
    rng = np.random.default_rng(n)
    scores = rng.integers(0, 6, size=n).astype(np.float32)  # few distinct scores: ties everywhere
    ids = np.array([f"c{i:05d}" for i in rng.permutation(n)])
    for k in (1, 3, 10, n):
        expected = sorted(range(n), key=lambda i: (-scores[i], ids[i]))[:k]
        assert top_k(scores, k, ids).tolist() == expected
