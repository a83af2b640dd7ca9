"""Tuning core: the replay recovers a planted best weight, the bootstrap and the split behave."""

from __future__ import annotations

import random

import pytest

from deployments.search.fusion import rrf
from deployments.search.hits import Hit
from relevance.tuning import (
    FusionSetting,
    Legs,
    doc_ranking,
    fuse,
    grid,
    paired_bootstrap,
    replay,
    search,
    split_queries,
)


def planted(true_weight: float, queries: int = 40, docs: int = 30, seed: int = 3):
    """Legs whose min-max normalized scores make exactly one dense weight put the relevant document
    first for every query: it is the argmax of ``w * dense + (1 - w) * keyword`` at ``true_weight``."""
    rng = random.Random(seed)
    legs, qrels = {}, {}
    for q in range(queries):
        dense = {f"q{q}d{j}#0": rng.random() for j in range(docs)}
        keyword = {c: rng.random() for c in dense}
        for scores in (dense, keyword):  # pin the ends so min-max normalization is the identity
            lo, hi = min(scores, key=scores.get), max(scores, key=scores.get)
            scores[lo], scores[hi] = 0.0, 1.0
        best = max(dense, key=lambda c: true_weight * dense[c] + (1 - true_weight) * keyword[c])
        legs[f"q{q}"] = Legs(tuple(sorted(dense.items(), key=lambda kv: -kv[1])),
                             tuple(sorted(keyword.items(), key=lambda kv: -kv[1])))
        qrels[f"q{q}"] = {best.split("#")[0]: 1}
    return legs, qrels


@pytest.mark.parametrize("true_weight", [0.3, 0.6])
def test_tuning_recovers_the_planted_weight(true_weight):
    legs, qrels = planted(true_weight)
    ranked = search(legs, qrels, grid(candidates=(30,)))
    assert ranked[0].setting.fusion == "weighted"
    assert ranked[0].setting.dense_weight == true_weight
    assert ranked[0].score == pytest.approx(1.0)
    # ... and clearly: every other weight, and RRF, loses some queries.
    assert all(r.score < 0.97 for r in ranked[1:])


def test_fuse_equals_the_router_functions_and_truncates_legs():
    legs = Legs((("a#0", 0.9), ("b#0", 0.8), ("c#0", 0.1)), (("c#0", 7.0), ("a#0", 3.0), ("d#0", 1.0)))
    got = fuse(legs, FusionSetting("rrf", rrf_k=60, candidates=2))
    want = rrf([[Hit("a#0", 0.9), Hit("b#0", 0.8)], [Hit("c#0", 7.0), Hit("a#0", 3.0)]], rrf_k=60)
    assert got == want
    weighted = fuse(legs, FusionSetting("weighted", dense_weight=0.5, candidates=3))
    scores = {h.chunk_id: round(h.score, 6) for h in weighted}
    # dense min-max: a 1, b 0.875, c 0; keyword: c 1, a 1/3, d 0 (hand-computed)
    assert scores == {"a#0": round(0.5 + 0.5 / 3, 6), "b#0": 0.4375, "c#0": 0.5, "d#0": 0.0}
    cut = fuse(legs, FusionSetting("weighted", dense_weight=0.5, candidates=3, min_relevance_score=0.45))
    assert [h.chunk_id for h in cut] == ["a#0", "c#0"]


def test_documents_rank_at_their_best_chunk_or_by_the_sum():
    hits = [("x#0", 0.9), ("y#0", 0.8), ("y#1", 0.7), ("x#1", 0.1)]
    assert doc_ranking(hits, "max") == ["x", "y"]
    assert doc_ranking(hits, "sum") == ["y", "x"]


def test_the_fast_replay_is_the_router_fusion_to_the_last_tie():
    legs, _ = planted(0.4, queries=15)
    ties = Legs((("a#0", 1.0), ("b#0", 1.0), ("c#0", 0.5)), (("b#0", 2.0), ("d#0", 2.0)))  # equal scores
    flat = Legs((("a#0", 0.3), ("b#0", 0.3)), ())  # no spread, and an empty leg
    cases = list(legs.values()) + [ties, flat]
    settings = grid(candidates=(2, 10, 30)) + [FusionSetting("weighted", dense_weight=0.5, candidates=30,
                                                             min_relevance_score=0.5),
                                                FusionSetting("rrf", candidates=30, min_relevance_score=0.5)]
    for setting in settings:
        for q in cases:
            assert replay(q, setting) == [(h.chunk_id, h.score) for h in fuse(q, setting)], setting


def test_paired_bootstrap_brackets_the_mean_difference():
    before = {f"q{i}": 0.5 for i in range(50)}
    after = {f"q{i}": 0.5 + (0.2 if i % 2 else 0.0) for i in range(50)}
    c = paired_bootstrap(before, after, resamples=2000)
    assert c.diff == pytest.approx(0.1)
    assert 0 < c.low < 0.1 < c.high < 0.2
    assert c.p_not_better == 0.0
    same = paired_bootstrap(before, before, resamples=500)
    assert same.low == same.high == 0.0 and same.p_not_better == 1.0
    with pytest.raises(ValueError, match="same queries"):
        paired_bootstrap(before, {"other": 1.0})


def test_split_is_stable_and_disjoint():
    qids = [f"q{i}" for i in range(200)]
    train, test = split_queries(qids, 0.3)
    assert set(train).isdisjoint(test) and set(train) | set(test) == set(qids)
    assert 40 <= len(test) <= 80
    # Adding queries never moves one that was already placed.
    train2, test2 = split_queries(qids + [f"new{i}" for i in range(50)], 0.3)
    assert set(test) <= set(test2) and set(train) <= set(train2)


def test_a_setting_is_the_same_as_a_request_and_as_router_settings():
    from deployments.config import RouterSettings
    from deployments.edge.schemas import SearchRequest

    s = FusionSetting("weighted", dense_weight=0.4, candidates=200, min_relevance_score=0.3)
    req = SearchRequest(query="x", **s.request())
    assert req.weights.dense == 0.4 and req.weights.keyword == pytest.approx(0.6) and req.candidates == 200
    settings = RouterSettings(**s.router_settings())
    assert settings.fusion == "weighted" and settings.candidate_base == 200 and settings.min_relevance_score == 0.3
