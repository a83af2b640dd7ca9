"""The reranking core against ``CrossEncoder.predict`` itself: same scores, any batching, any order."""

from __future__ import annotations

import random

import numpy as np
import pytest

from deployments.search.reranking import CrossEncoderScorer, length_batches, passage_text, resolve_dtype
from tests.conftest import TOPICS


def _pairs(n: int, seed: int = 3) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = " ".join(TOPICS.values()).split()
    queries = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) for _ in range(5)]
    return [(rng.choice(queries), " ".join(rng.choice(words) for _ in range(rng.choice([1, 5, 30, 120, 700]))))
            for _ in range(n)]


@pytest.fixture(scope="module")
def scorer(tiny_cross_encoder):
    return CrossEncoderScorer(str(tiny_cross_encoder), device="cpu", max_length=256, forward_batch_size=8,
                              max_batch_tokens=1024)


def test_scores_equal_cross_encoder_predict(scorer):
    from sentence_transformers import CrossEncoder

    pairs = _pairs(57)
    reference = CrossEncoder(scorer.model_name, device="cpu", max_length=256).predict(pairs, batch_size=1)
    np.testing.assert_allclose(scorer.score(pairs), reference, atol=1e-5)


def test_batched_equals_one_at_a_time(scorer):
    pairs = _pairs(40, seed=9)
    together = scorer.score(pairs)
    alone = np.concatenate([scorer.score([p]) for p in pairs])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    scorer.forward_batch_size, scorer.max_batch_tokens = 64, 10**6
    try:
        np.testing.assert_allclose(scorer.score(pairs), alone, atol=1e-5)
    finally:
        scorer.forward_batch_size, scorer.max_batch_tokens = 8, 1024


def test_scores_are_probabilities_and_order_free(scorer):
    pairs = _pairs(30, seed=5)
    scores = scorer.score(pairs)
    assert scores.shape == (30,) and scores.dtype == np.float32
    assert ((scores >= 0) & (scores <= 1)).all()
    perm = np.random.default_rng(0).permutation(30)
    np.testing.assert_allclose(scorer.score([pairs[i] for i in perm]), scores[perm], atol=1e-5)
    assert scorer.score([]).shape == (0,)


def test_token_lengths_are_cut_at_max_length(scorer):
    lengths = scorer.token_lengths([("q", "word " * 2000), ("q", "word")])
    assert lengths[0] == 256 and lengths[1] == 5  # [CLS] q [SEP] word [SEP]


@pytest.mark.parametrize("max_pairs,max_tokens", [(4, 10**6), (100, 50), (3, 7), (1, 1)])
def test_length_batches_cover_every_pair_once_within_budget(max_pairs, max_tokens):
    lengths = [5, 1, 9, 9, 3, 20, 2, 2, 7, 1]
    order, passes = length_batches(lengths, max_pairs, max_tokens)
    covered = [int(i) for p in passes for i in order[p]]
    assert sorted(covered) == list(range(len(lengths)))
    assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
    for p in passes:
        idx = order[p]
        assert len(idx) <= max_pairs
        assert len(idx) == 1 or len(idx) * max(lengths[i] for i in idx) <= max_tokens


def test_passage_text_adds_a_title_once():
    assert passage_text("BM25", "BM25 is a ranking function") == "BM25 is a ranking function"
    assert passage_text("BM25", "a ranking function") == "BM25\na ranking function"
    assert passage_text("", "text") == "text"


def test_half_precision_is_refused_on_cpu():
    import torch

    assert resolve_dtype("auto", "cpu") is torch.float32
    with pytest.raises(ValueError, match="GPU"):
        resolve_dtype("float16", "cpu")


def test_cached_tokens_and_the_plain_predict_path_agree(scorer):
    pairs = _pairs(30, seed=11) + [("star " * 200, "moon " * 300), ("comet " * 300, "tide")]  # long queries too
    first = scorer.score(pairs)
    hits = scorer.cache.hits
    np.testing.assert_allclose(scorer.score(pairs), first, atol=1e-6)
    assert scorer.cache.hits >= hits + len(pairs)  # the second time every passage came from the cache
    backend, scorer._backend = scorer._backend, None  # the tokenizer-per-pair path through predict
    try:
        np.testing.assert_allclose(scorer.score(pairs), first, atol=1e-5)
    finally:
        scorer._backend = backend


def test_token_cache_drops_the_least_recently_used():
    from deployments.search.reranking import TokenCache

    calls = []

    def encode(texts):
        calls.append(list(texts))
        return [len(t) for t in texts]

    cache = TokenCache(2)
    assert cache.get_many(["a", "bb", "a"], encode) == [1, 2, 1] and calls == [["a", "bb"]]
    cache.get_many(["a"], encode)  # "a" is now the most recent
    cache.get_many(["ccc"], encode)  # evicts "bb"
    assert list(cache.items) == ["a", "ccc"] and cache.get_many(["bb"], encode) == [2] and calls[-1] == ["bb"]
