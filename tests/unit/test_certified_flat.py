"""A flat index's top-k from a half-precision scan first (``deployments.shard.certified``) against the flat index's own
full scan, bit for bit: wherever the bound proves an answer it is the full scan's, and where the vectors are too close
for float16 to tell apart it proves nothing (the full scan answers)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from deployments.shard.certified import MIN_VECTORS, CertifiedFlat, candidates
from deployments.shard.dense import DenseShard


def _unit(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)


def _flat(vectors: np.ndarray) -> faiss.IndexFlatIP:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    return index


def _spread(rng: np.random.Generator, n: int = 6000, d: int = 48) -> np.ndarray:
    """Random unit vectors, some repeated exactly (tied scores, as identical chunks give) and some nearly."""
    vectors = rng.standard_normal((n, d))
    vectors[100:160] = vectors[0:60]
    vectors[200:260] = vectors[0:60] + 1e-4 * rng.standard_normal((60, d))
    return _unit(vectors)


@pytest.mark.parametrize("k", [1, 10, 200])
def test_every_proven_answer_is_the_full_scan_s_bit_for_bit(k):
    rng = np.random.default_rng(k)
    vectors = _spread(rng)
    index = _flat(vectors)
    certified = CertifiedFlat.of(index)
    near = vectors[rng.choice(len(vectors), 40)] + 0.3 * rng.standard_normal((40, vectors.shape[1]))
    queries = np.vstack([_unit(near), _unit(rng.standard_normal((40, vectors.shape[1]))), vectors[:5]])
    for q in queries:
        found = certified.search(q[None], k)
        if found is not None:
            scores, ids = index.search(q[None], k)
            assert np.array_equal(found[0], scores) and np.array_equal(found[1], ids)
    assert certified.proven >= 0.9 * len(queries), (certified.proven, certified.scanned)


def test_scores_closer_than_float16_can_tell_prove_nothing_and_the_shard_still_answers_exactly():
    """400 vectors scoring within 1e-6 of each other around the 200th place: float16's ranking of them is noise, so
    the vectors that truly belong may be outside its candidates, and no answer may be proven."""
    rng = np.random.default_rng(7)
    d, q = 48, np.zeros((1, 48), dtype=np.float32)
    q[0, 0] = 1.0
    along = np.concatenate([rng.uniform(0.9, 0.95, 100), 0.5 + 1e-6 * rng.random(400), rng.uniform(-0.5, 0.3, 3000)])
    side = _unit(np.hstack([np.zeros((len(along), 1)), rng.standard_normal((len(along), d - 1))]))
    vectors = np.ascontiguousarray(along[:, None] * q + np.sqrt(1 - along[:, None] ** 2) * side, dtype=np.float32)
    index = _flat(vectors)
    certified = CertifiedFlat.of(index)
    assert certified.search(q, 200) is None and certified.scanned == 1
    shard = DenseShard(index, [f"c{i}" for i in range(len(vectors))])
    rows, scores = shard.search_rows(q[0], 200)
    want_scores, want_rows = index.search(q, 200)
    assert np.array_equal(rows, want_rows[0]) and np.array_equal(scores, want_scores[0])


def test_a_small_index_or_another_kind_keeps_no_copy_and_a_deep_k_scans_in_full():
    rng = np.random.default_rng(0)
    assert CertifiedFlat.of(_flat(_spread(rng, n=MIN_VECTORS - 1))) is None
    vectors = _spread(rng)
    assert CertifiedFlat.of(faiss.IndexHNSWFlat(vectors.shape[1], 8, faiss.METRIC_INNER_PRODUCT)) is None
    l2 = faiss.IndexFlatL2(vectors.shape[1])
    l2.add(vectors)
    assert CertifiedFlat.of(l2) is None
    certified = CertifiedFlat.of(_flat(vectors))
    assert certified.search(vectors[:1], len(vectors) // 4) is None  # the candidates would be too many
    assert certified.proven == certified.scanned == 0
    assert candidates(200) > 200


def test_the_dense_shard_answers_as_the_full_scan_does_through_the_half_precision_scan():
    rng = np.random.default_rng(3)
    vectors = _spread(rng)
    index = _flat(vectors)
    shard = DenseShard(index, [f"c{i}" for i in range(len(vectors))])
    assert shard.certified is not None
    for q in _unit(rng.standard_normal((20, vectors.shape[1]))):
        rows, scores = shard.search_rows(q, 200)
        want_scores, want_rows = index.search(q[None], 200)
        assert np.array_equal(rows, want_rows[0]) and np.array_equal(scores, want_scores[0])
    assert shard.certified.proven == 20


def test_the_copy_built_a_block_at_a_time_is_the_copy_built_at_once(monkeypatch):
    import deployments.shard.certified as certified_module

    rng = np.random.default_rng(5)
    vectors = _spread(rng)
    index = _flat(vectors)
    whole = CertifiedFlat.of(index)
    monkeypatch.setattr(certified_module, "BLOCK", 999)
    blocks = CertifiedFlat.of(index)
    assert blocks.bound == whole.bound and blocks.codes.ntotal == whole.codes.ntotal == len(vectors)
    q = vectors[:3]
    assert np.array_equal(blocks.codes.search(q, 50)[1], whole.codes.search(q, 50)[1])
