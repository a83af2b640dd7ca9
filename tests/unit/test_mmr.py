import math

import numpy as np
import pytest

from deployments.search.hits import Hit
from deployments.search.mmr import mmr


def unit(degrees):
    return [math.cos(math.radians(degrees)), math.sin(math.radians(degrees))]


QUERY = np.array(unit(0))
# a and b point almost the same way (10 degrees apart); c is off on the other side of the query.
CANDIDATES = [Hit("a", 0.9), Hit("b", 0.8), Hit("c", 0.7)]
VECTORS = np.array([unit(10), unit(20), unit(-40)])


def ids(hits):
    return [h.chunk_id for h in hits]


def test_diverse_pick_beats_near_duplicate():
    # Step 1: a (relevance cos 10 > cos 20 > cos 40).
    # Step 2: b: 0.5 cos 20 - 0.5 cos 10 = -0.022; c: 0.5 cos 40 - 0.5 cos 50 = +0.062 -> c.
    assert 0.5 * math.cos(math.radians(40)) - 0.5 * math.cos(math.radians(50)) > (
        0.5 * math.cos(math.radians(20)) - 0.5 * math.cos(math.radians(10))
    )
    picked = mmr(CANDIDATES, QUERY, VECTORS, k=3, lambda_=0.5)
    assert ids(picked) == ["a", "c", "b"]
    assert picked == [CANDIDATES[0], CANDIDATES[2], CANDIDATES[1]]  # original (fused) scores kept


def test_lambda_one_is_relevance_order():
    assert ids(mmr(CANDIDATES, QUERY, VECTORS, k=3, lambda_=1.0)) == ["a", "b", "c"]


def test_lambda_one_equals_relevance_order_with_ties():
    rng = np.random.default_rng(3)
    vecs = rng.normal(size=(40, 8))
    vecs[5] = vecs[17]  # exact ties in sim(q, d): broken by chunk id
    vecs[30] = vecs[2]
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    query = vecs[9] + 0.5 * vecs[11]
    hits = [Hit(f"c{(i * 7) % 40:02d}", float(i)) for i in range(40)]
    relevance = vecs @ query
    expected = sorted(range(40), key=lambda i: (-relevance[i], hits[i].chunk_id))
    assert mmr(hits, query, vecs, k=40, lambda_=1.0) == [hits[i] for i in expected]


def reference_mmr(ids_, query, vecs, k, lambda_):
    """The paper's loop, written plainly: scan every unselected candidate, max over every selected one."""
    selected = []
    while len(selected) < min(k, len(ids_)):
        def objective(i):
            redundancy = max((float(vecs[i] @ vecs[j]) for j in selected), default=0.0)
            return lambda_ * float(vecs[i] @ query) - (1 - lambda_) * redundancy

        rest = [i for i in range(len(ids_)) if i not in selected]
        selected.append(min(rest, key=lambda i: (-objective(i), ids_[i])))
    return [ids_[i] for i in selected]


@pytest.mark.parametrize(("seed", "lambda_"), [(0, 0.5), (1, 0.7), (2, 0.3), (3, 0.0)])
def test_matches_the_plain_loop(seed, lambda_):
    rng = np.random.default_rng(seed)
    vecs = rng.normal(size=(30, 4))
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    query = vecs[0] + vecs[1]
    hits = [Hit(f"c{i:02d}", 0.0) for i in rng.permutation(30)]
    expected = reference_mmr([h.chunk_id for h in hits], query, vecs, 12, lambda_)
    assert ids(mmr(hits, query, vecs, k=12, lambda_=lambda_)) == expected


def test_objective_ties_break_by_chunk_id():
    same = np.array([unit(30), unit(30)])
    assert ids(mmr([Hit("y", 1.0), Hit("x", 0.0)], QUERY, same, k=2)) == ["x", "y"]
    # lambda 0: every first pick scores 0, so the smallest chunk id goes first; then the least similar.
    assert ids(mmr(CANDIDATES[::-1], QUERY, VECTORS[::-1], k=3, lambda_=0.0)) == ["a", "c", "b"]


def test_k_bounds():
    assert ids(mmr(CANDIDATES, QUERY, VECTORS, k=10)) == ["a", "c", "b"]
    assert ids(mmr(CANDIDATES, QUERY, VECTORS, k=1)) == ["a"]
    assert mmr(CANDIDATES, QUERY, VECTORS, k=0) == []
    assert mmr([], QUERY, np.zeros((0, 2)), k=5) == []


@pytest.mark.parametrize(
    ("query", "vectors"),
    [
        (QUERY, VECTORS[:2]),  # one row short
        (QUERY, np.ones((3, 3))),  # wrong dimension
        (np.ones((1, 2)), VECTORS),  # query not 1-d
        (QUERY, np.ones(6)),  # vectors not 2-d
    ],
)
def test_shape_errors(query, vectors):
    with pytest.raises(ValueError):
        mmr(CANDIDATES, query, vectors, k=2)


@pytest.mark.parametrize("kwargs", [{"k": -1}, {"k": 2, "lambda_": 1.5}, {"k": 2, "lambda_": -0.1}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        mmr(CANDIDATES, QUERY, VECTORS, **kwargs)


def test_given_relevance_replaces_query_similarity():
    # b is most similar to the query, but the caller's relevance ranks c first: lambda 1 follows the caller.
    hits = [Hit("a", 0.1), Hit("b", 0.2), Hit("c", 0.9)]
    q = np.array([1.0, 0.0])
    vecs = np.array([[0.6, 0.8], [1.0, 0.0], [0.0, 1.0]])
    assert [h.chunk_id for h in mmr(hits, q, vecs, 3, 1.0, relevance=[0.0, 0.5, 1.0])] == ["c", "b", "a"]
    with pytest.raises(ValueError, match="relevance has 2 values"):
        mmr(hits, q, vecs, 3, 1.0, relevance=[0.0, 1.0])
