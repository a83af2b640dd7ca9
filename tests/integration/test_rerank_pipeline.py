"""Reranking inside the request pipeline, over a real 3-shard index and a real (tiny, random) CrossEncoder."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from deployments.config import RouterSettings
from deployments.edge.errors import status_of
from deployments.edge.schemas import SearchRequest
from deployments.errors import ServiceError
from deployments.search.inprocess import InProcessReranker, inprocess_pipeline
from deployments.search.reranking import CrossEncoderScorer, passage_text
from tests.integration.conftest import as_sent

QUERY = "lucene shard replica"


class FailingReranker:
    async def score(self, query, passages):
        raise ConnectionError("replica gone")


class SlowReranker:
    async def score(self, query, passages):
        await asyncio.sleep(5)
        return [0.5] * len(passages)


def search(pipeline, **kw):
    return asyncio.run(pipeline.search(SearchRequest(**kw)))


@pytest.fixture(scope="module")
def scorer(tiny_cross_encoder):
    return CrossEncoderScorer(str(tiny_cross_encoder), device="cpu", max_length=256)


@pytest.fixture(scope="module")
def pipeline(built, scorer):
    p = inprocess_pipeline({"main": built[3][1].version_dir, "other": built[1][1].version_dir}, default="main",
                           settings=RouterSettings(rerank_timeout_s=2.0, cache_size=0),
                           reranker=InProcessReranker(scorer))
    p.collections["other"].rerank = False  # a collection where reranking is off by default
    return p


def test_reranked_results_are_the_fused_pool_rescored_by_the_cross_encoder(pipeline, scorer):
    fused = search(pipeline, query=QUERY, limit=20, rerank=False)  # the first 20 fused candidates
    expected = scorer.encoder.predict(
        [(QUERY, passage_text(r.title, r.content)) for r in fused.results], batch_size=1)
    order = np.argsort(-expected, kind="stable")

    resp = search(pipeline, query=QUERY, limit=20, rerank=True, rerank_depth=20)
    assert resp.reranked and not resp.warnings
    assert [r.chunk_id for r in resp.results] == [fused.results[i].chunk_id for i in order]
    assert [r.score for r in resp.results] == pytest.approx(expected[order].tolist(), abs=1e-5)
    assert all(0 <= r.score <= 1 and r.scores.reranked == r.score for r in resp.results)
    assert [r.scores.fused for r in resp.results] == pytest.approx([fused.results[i].score for i in order])
    assert resp.total == 20 and "rerank" in resp.timings_ms


def test_rerank_is_on_by_default_where_the_collection_wants_it(pipeline):
    assert search(pipeline, query=QUERY, limit=3).reranked
    assert not search(pipeline, query=QUERY, limit=3, collections=["other"]).reranked
    assert search(pipeline, query=QUERY, limit=3, collections=["other"], rerank=True).reranked
    assert not search(pipeline, query=QUERY, limit=3, rerank=False).reranked


def test_threshold_applies_to_reranked_scores(pipeline):
    full = search(pipeline, query=QUERY, limit=20, rerank_depth=20)
    assert [r.relevance_score for r in full.results] == [r.score for r in full.results]  # the probability
    cut = float(np.median([r.relevance_score for r in full.results]))
    resp = search(pipeline, query=QUERY, limit=20, rerank_depth=20, min_relevance_score=cut)
    assert [r.chunk_id for r in resp.results] == [r.chunk_id for r in full.results if r.relevance_score >= cut]


def test_depth_is_never_below_limit(pipeline):
    resp = search(pipeline, query=QUERY, limit=12, rerank_depth=3, debug=True)
    assert resp.reranked and len(resp.results) == 12 and resp.debug["rerank"]["depth"] == 12


@pytest.mark.parametrize("broken, reason", [(FailingReranker(), "failed (ConnectionError)"), (SlowReranker(), "timed out")])
def test_a_failing_or_slow_reranker_falls_back_to_the_fused_order(built, broken, reason):
    p = inprocess_pipeline({"main": built[3][1].version_dir}, reranker=broken,
                           settings=RouterSettings(rerank_timeout_s=0.5))
    fused = search(p, query=QUERY, limit=5, rerank=False)
    resp = search(p, query=QUERY, limit=5)
    assert not resp.reranked and resp.warnings == [f"reranking {reason}: results are in fused order"]
    assert [(r.chunk_id, r.score) for r in resp.results] == [(r.chunk_id, r.score) for r in fused.results]
    assert all(r.scores.reranked is None for r in resp.results)
    again = search(p, query=QUERY, limit=5)
    assert not again.cached  # a degraded answer is not cached


class SlowEncoder:
    async def embed(self, text):
        await asyncio.sleep(5)


class FailingEncoder:
    async def embed(self, text):
        raise ConnectionError("replica gone")


@pytest.mark.parametrize("broken, reason", [(FailingEncoder(), "failed (ConnectionError)"), (SlowEncoder(), "timed out")])
def test_without_the_query_encoder_hybrid_answers_from_bm25_and_vector_gets_503(built, broken, reason):
    p = inprocess_pipeline({"main": built[3][1].version_dir}, settings=RouterSettings(encoder_timeout_s=0.5))
    keyword = search(p, query=QUERY, limit=5, method="keyword")
    p.collections["main"].encoder = broken
    resp = search(p, query=QUERY, limit=5)
    assert resp.warnings == [f"query encoder {reason}: keyword results only"]
    assert [r.chunk_id for r in resp.results] == [r.chunk_id for r in keyword.results]
    assert all(r.scores.dense is None for r in resp.results)
    with pytest.raises(ServiceError, match="query encoder") as e:
        search(p, query=QUERY, limit=5, method="vector")
    assert status_of(e.value) == 503


def test_stages_that_are_not_deployed_are_refused_with_400(built):
    p = inprocess_pipeline({"main": built[3][1].version_dir})
    assert not search(p, query=QUERY, limit=3).reranked  # default: no reranker, no reranking, no error
    for kw, needle in [({"rerank": True}, "deploys no reranker"), ({"synthesize": True}, "synthesis is not enabled"),
                       ({"rerank_with": "llm"}, "rerank_with: llm is not enabled")]:
        with pytest.raises(ServiceError, match=needle) as e:
            search(p, query=QUERY, **kw)
        assert status_of(e.value) == 400


def test_reranked_results_written_as_json_are_what_the_models_write(pipeline):
    req = SearchRequest(query=QUERY, limit=10, rerank=True, rerank_depth=20)
    models, rendered = asyncio.run(pipeline.search(req)), asyncio.run(pipeline.search(req, rendered=True))
    assert models.reranked and rendered.reranked and rendered.results == []
    sent = [as_sent(r) for r in (models, rendered)]
    assert sent[0] == sent[1] and '"reranked":' in sent[1]


def test_groups_are_made_after_reranking_and_the_threshold(pipeline):
    """group_by folds the reranked ranking, cut at min_relevance_score, by hand: each document at the rank of its best
    reranked chunk, its next one with it."""
    full = search(pipeline, query=QUERY, limit=20, rerank_depth=20)
    cut = float(np.median([r.relevance_score for r in full.results]))
    want: dict[str, list[str]] = {}
    for r in full.results:
        if r.relevance_score >= cut and len(want.setdefault(r.doc_id, [])) < 2:
            want[r.doc_id].append(r.chunk_id)
    grouped = search(pipeline, query=QUERY, limit=20, rerank_depth=20, min_relevance_score=cut, group_by="doc_id",
                     group_size=2)
    assert grouped.reranked and len(want) < sum(r.relevance_score >= cut for r in full.results)
    assert [[r.chunk_id, *(c.chunk_id for c in r.group.chunks)] for r in grouped.results] == list(want.values())
    assert [r.score for r in grouped.results] == pytest.approx(
        [next(x.score for x in full.results if x.chunk_id == ids[0]) for ids in want.values()])
