"""The one top-k: score descending, then the tie keys ascending, cut at k; checked by hand and against sorting."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.shard.topk import PARTITION_FACTOR, top_k, top_k_by


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


@pytest.mark.parametrize("n", [5, 40, PARTITION_FACTOR * 10 + 7, 2000])
def test_the_order_with_tie_keys_made_on_demand_is_top_k_s(n):
    """``top_k_by`` asks a tie key only of tied scores: the same positions as ``top_k`` with every key given, with NaN
    scores and ties everywhere."""
    rng = np.random.default_rng(n + 1)
    scores = rng.integers(0, 6, size=n).astype(np.float64)
    scores[rng.random(n) < 0.1] = np.nan
    ids = [f"c{i:05d}" for i in rng.permutation(n)]
    asked = []
    for k in (0, 1, 3, 10, n):
        assert top_k_by(scores, k, lambda i: asked.append(i) or ids[i]) == top_k(scores, k, np.array(ids)).tolist()
    distinct = rng.permutation(n).astype(np.float64)  # no two scores equal: no key is asked
    asked.clear()
    assert top_k_by(distinct, n, lambda i: asked.append(i) or ids[i]) == top_k(distinct, n, np.array(ids)).tolist()
    assert asked == []


def test_infinities_rank_as_the_largest_finite_scores_and_nan_last():
    """``top_k`` ranks by ``nan_to_num(scores, nan=-inf)``: an infinite score ties with the largest finite one, and
    NaN comes after -inf; its own negation of the scores must rank exactly so."""
    big = np.finfo(np.float64).max
    scores = np.array([np.nan, -np.inf, big, np.inf, 0.0, -big, np.nan, 1.0])
    ids = np.arange(len(scores))
    # +inf ties the largest finite score (ids 2 and 3), -inf ties the most negative (1 and 5), NaN last.
    assert top_k(scores, 8, ids).tolist() == [2, 3, 7, 4, 1, 5, 0, 6]
    assert top_k_by(scores, 8, lambda i: i) == [2, 3, 7, 4, 1, 5, 0, 6]
    rng = np.random.default_rng(5)
    for _ in range(300):
        values = rng.choice([np.nan, np.inf, -np.inf, big, -big, 0.0, 1.0, -1.0], size=rng.integers(1, 30))
        ties = rng.permutation(len(values))
        expected = sorted(range(len(values)), key=lambda i: (-np.nan_to_num(values[i], nan=-np.inf), ties[i]))
        for k in (1, 5, len(values)):
            assert top_k(values, k, ties).tolist() == expected[:k]
