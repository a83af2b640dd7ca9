"""The request pipeline in-process over a real 3-shard index (real FAISS and Lucene, no Ray Serve)."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from deployments.bounded import BoundedCache
from deployments.config import RouterSettings
from deployments.edge.errors import status_of
from deployments.edge.schemas import SearchRequest
from deployments.errors import ServiceError
from deployments.search.inprocess import LocalIndex, inprocess_pipeline
from deployments.search.pipeline import SearchPipeline
from deployments.search.plan import plan_search
from deployments.search.stages import SearchContext, Work
from tests.integration.conftest import as_sent, shard_dirs


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def pipeline(built):
    (_, one), (_, three) = built[1], built[3]
    return inprocess_pipeline({"main": three.version_dir, "single": one.version_dir}, default="main")


@pytest.fixture(scope="module")
def local(built):
    return LocalIndex(built[3][1].version_dir)


def search(pipeline, **kw):
    return run(pipeline.search(SearchRequest(**kw)))


def test_keyword_and_vector_equal_the_sharded_cores(pipeline, local):
    for q in ("telescope galaxy", "bread oven"):
        kw = search(pipeline, query=q, method="keyword", limit=5)
        assert [r.chunk_id for r in kw.results] == [h.chunk_id for h in local.bm25(q, 5)]
        assert [r.score for r in kw.results] == pytest.approx([h.score for h in local.bm25(q, 5)])
        vec = search(pipeline, query=q, method="vector", limit=5)
        assert [r.score for r in vec.results] == pytest.approx([h.score for h in local.dense(q, 5)], abs=1e-6)
        assert kw.index_version == {"main": pipeline.collections["main"].version}
        assert kw.coverage.shards_answered == kw.coverage.shards_asked == 3 and not kw.coverage.degraded


def test_field_weights_reach_the_shards_and_unknown_fields_are_refused(pipeline, local):
    weights = {"contents": 1.0, "title": 0.5}
    for q in ("sailing boat", "astronomy note telescope"):
        kw = search(pipeline, query=q, method="keyword", limit=5, field_weights=weights)
        want = local.bm25(q, 5, weights=weights)
        assert [r.chunk_id for r in kw.results] == [h.chunk_id for h in want]
        assert [r.score for r in kw.results] == pytest.approx([h.score for h in want])
        assert [r.score for r in kw.results] != pytest.approx([h.score for h in local.bm25(q, 5)])
    with pytest.raises(ServiceError, match=r"\['body'\].*BM25 fields: \['contents', 'title'\]") as refused:
        search(pipeline, query="boat", method="hybrid", field_weights={"body": 1.0})
    assert status_of(refused.value) == 400
    # the vector leg alone scores no field: nothing to refuse
    assert search(pipeline, query="boat", method="vector", limit=3, field_weights={"body": 1.0}).results


def test_hybrid_rrf_scores_are_the_rrf_formula(pipeline, local):
    q = "lucene shard replica"
    depth = 50
    dense = [h.chunk_id for h in local.dense(q, depth)]
    bm25 = [h.chunk_id for h in local.bm25(q, depth)]
    expected = {}
    for run_ in (dense, bm25):
        for rank, cid in enumerate(run_, start=1):
            expected[cid] = expected.get(cid, 0.0) + 1 / (60 + rank)
    resp = search(pipeline, query=q, limit=10, fusion="rrf", candidates=depth)
    assert resp.method.value == "hybrid"
    for r in resp.results:
        assert r.score == pytest.approx(expected[r.chunk_id])
        assert r.scores.fused == r.score
    assert [r.score for r in resp.results] == sorted(expected.values(), reverse=True)[:10]
    top = resp.results[0]
    assert top.content and top.doc_id == top.chunk_id.rsplit("#", 1)[0] and set(top.metadata) == {"topic", "year"}


def test_weighted_fusion_with_request_weights(pipeline):
    a = search(pipeline, query="piano chord", fusion="weighted", weights={"dense": 1.0, "keyword": 0.0}, limit=5)
    b = search(pipeline, query="piano chord", method="vector", limit=5)
    assert [r.chunk_id for r in a.results] == [r.chunk_id for r in b.results]
    assert a.results[0].score == pytest.approx(1.0)  # min-max normalized best dense hit, weight 1


def test_default_hybrid_is_weighted_min_max_at_half_over_200_candidates(pipeline, local):
    q = "galaxy oven"
    expected: dict[str, float] = {}
    for hits in (local.dense(q, 200), local.bm25(q, 200)):  # the oracle: one unsharded index
        lo, hi = min(h.score for h in hits), max(h.score for h in hits)
        for h in hits:
            expected[h.chunk_id] = expected.get(h.chunk_id, 0.0) + 0.5 * (h.score - lo) / (hi - lo)
    resp = search(pipeline, query=q, limit=10, debug=True)
    assert resp.debug["fusion"] == {"method": "weighted", "weights": {"dense": 0.5, "keyword": 0.5}}
    assert resp.debug["candidate_depth"] == 200
    assert [r.score for r in resp.results] == pytest.approx(sorted(expected.values(), reverse=True)[:10])
    for r in resp.results:
        assert r.score == pytest.approx(expected[r.chunk_id])


def test_filters_are_complete_and_validated(pipeline, built):
    _, summary = built[3]
    sailing = set()
    for folder in shard_dirs(summary):
        t = pq.read_table(folder / "chunks.parquet")
        for cid, meta in zip(t["chunk_id"].to_pylist(), t["metadata_json"].to_pylist(), strict=True):
            m = json.loads(meta)
            if m["topic"] == "sailing" and m["year"] >= 2010:
                sailing.add(cid)
    resp = search(pipeline, query="telescope galaxy", method="keyword", limit=100,
                  filters={"topic": "sailing", "year": {"gte": 2010}})
    assert {r.chunk_id for r in resp.results} <= sailing
    resp = search(pipeline, query="telescope galaxy sail wind boat the", method="vector", limit=100,
                  filters={"topic": ["sailing"], "year": {"gte": 2010}})
    assert {r.chunk_id for r in resp.results} == sailing  # every allowed chunk, not a post-filtered slice
    with pytest.raises(ServiceError, match="unknown filter field 'colour'; known fields: topic, year") as e:
        search(pipeline, query="x", filters={"colour": "red"})
    assert status_of(e.value) == 422
    with pytest.raises(ServiceError) as e:
        search(pipeline, query="x", filters={"year": {"gte": "not a number"}})
    assert status_of(e.value) == 422


def test_threshold_mmr_context_and_citations(pipeline):
    base = search(pipeline, query="bread oven butter", method="keyword", limit=10)
    cut = base.results[3].relevance_score
    kept = search(pipeline, query="bread oven butter", method="keyword", limit=10, min_relevance_score=cut, debug=True)
    assert all(r.relevance_score >= cut for r in kept.results) and len(kept.results) == 4
    assert kept.debug["dropped_below_min_relevance_score"]
    assert sorted(kept.debug["shard_search_ms"]) == ["main/shard-000", "main/shard-001", "main/shard-002"]
    same = search(pipeline, query="bread oven butter", limit=5, mmr_lambda=1.0)
    plain = search(pipeline, query="bread oven butter", limit=5)
    assert [r.chunk_id for r in same.results] == [r.chunk_id for r in plain.results]
    diverse = search(pipeline, query="bread oven butter", limit=5, mmr_lambda=0.1)
    assert len({r.chunk_id for r in diverse.results}) == 5
    ctx = search(pipeline, query="bread oven butter", limit=5, include_context=True, token_budget=60)
    assert sum(len(p["text"].split()) for p in ctx.context) <= 60
    assert [c["id"] for c in ctx.passage_citations] == list(range(1, len(ctx.passage_citations) + 1))
    assert {c["doc_id"] for c in ctx.passage_citations} <= {r.doc_id for r in ctx.results}


@pytest.mark.parametrize("fields", [{"method": "keyword"}, {"method": "vector"}, {"fusion": "rrf"}, {},
                                    {"weights": {"dense": 1.0, "keyword": 1.0}}, {"collections": ["main", "single"]}])
def test_the_seed_contract_relevance_score_in_0_1_and_its_threshold(pipeline, fields):
    """relevance_score on the minmax scale is on [0, 1] for every method, in the results' order, computed as
    documented (hand-computed from ``score`` here); min_relevance_score cuts on it; the seed's fields are there."""
    q = "bread oven butter"
    fields = fields | {"relevance_scale": "minmax"}
    resp = search(pipeline, query=q, limit=100, candidates=100, debug=True, **fields)
    rel = [r.relevance_score for r in resp.results]
    raw = [r.score for r in resp.results]
    assert all(0.0 <= x <= 1.0 for x in rel) and rel == sorted(rel, reverse=True)
    if fields.get("weights"):  # weighted over weights summing to 2: the fused score over 2
        assert rel == pytest.approx([s / 2 for s in raw])
    elif len(fields) == 1:
        assert rel == pytest.approx(raw)  # default weighted 0.5 / 0.5: the fused score itself
    elif "collections" in fields:  # collections fused by RRF: min-max over a ranking longer than the page
        assert rel[0] == 1.0
    else:  # min-max over the whole ranking: one leg is the page itself; RRF's recomputed from the legs
        lo = min(raw)
        if fields.get("fusion") == "rrf":
            legs = resp.debug["legs"]["main"]
            rrf_scores: dict[str, float] = {}
            for leg in (legs["dense"], legs["keyword"]):
                for rank, hit in enumerate(leg, start=1):
                    rrf_scores[hit["chunk_id"]] = rrf_scores.get(hit["chunk_id"], 0.0) + 1 / (60 + rank)
            lo = min(rrf_scores.values())
        assert rel[0] == 1.0 and rel == pytest.approx([(s - lo) / (raw[0] - lo) for s in raw])
    assert resp.total_results == len(resp.results) and resp.method_used == resp.method
    assert resp.citations == [r.source for r in resp.results] and resp.synthesis is None
    assert all(r.source == r.doc_id for r in resp.results)  # the fixture corpus names no url or source
    cut = rel[len(rel) // 2]
    kept = search(pipeline, query=q, limit=100, candidates=100, min_relevance_score=cut, **fields)
    assert [r.chunk_id for r in kept.results] == [r.chunk_id for r in resp.results if r.relevance_score >= cut]
    assert kept.total_results == len(kept.results) < len(resp.results)


@pytest.mark.parametrize("fields", [{"method": "keyword"}, {"method": "vector"}, {"fusion": "rrf"}, {},
                                    {"collections": ["main", "single"]}])
def test_the_absolute_scale_is_each_result_s_own_cosine_and_its_threshold(pipeline, fields):
    """Uncalibrated, relevance_score is a result's dense cosine clipped to [0, 1] (a hit the dense leg did not return:
    that leg's lowest returned cosine), whatever the fusion ranked it: not in the results' order; a keyword search
    has no absolute score, so min-max. min_relevance_score cuts on it and keeps the ranking's order."""
    q = "bread oven butter"
    resp = search(pipeline, query=q, limit=100, candidates=100, debug=True, **fields)
    rel = [r.relevance_score for r in resp.results]
    names = fields.get("collections", ["main"])
    if fields.get("method") == "keyword":
        assert resp.relevance_scales == {"main": "minmax"} and rel[0] == 1.0
    else:
        assert resp.relevance_scales == dict.fromkeys(names, "cosine")
        for r in resp.results:
            floor = min(h["score"] for h in resp.debug["legs"][r.collection]["dense"])
            own = r.scores.dense if r.scores.dense is not None else floor
            assert r.relevance_score == pytest.approx(min(1.0, max(0.0, own))), r.chunk_id
        if fields.get("method") != "vector":
            assert rel != sorted(rel, reverse=True)  # the fused order is not the cosine's
    cut = sorted(rel)[len(rel) // 2]
    kept = search(pipeline, query=q, limit=100, candidates=100, min_relevance_score=cut, **fields)
    assert [r.chunk_id for r in kept.results] == [r.chunk_id for r in resp.results if r.relevance_score >= cut]


def test_min_relevance_score_outside_0_1_is_refused():
    from pydantic import ValidationError

    for bad in (-0.1, 1.5, 8.0):
        with pytest.raises(ValidationError, match="min_relevance_score"):
            SearchRequest(query="x", min_relevance_score=bad)
    with pytest.raises(ValidationError, match="min_relevance_score"):
        RouterSettings(min_relevance_score=2.0)


def test_collections_fuse_and_unknown_ones_are_refused(pipeline):
    both = search(pipeline, query="violin concert", collections=["main", "single"], limit=6)
    assert {r.collection for r in both.results} == {"main", "single"}
    assert set(both.index_version) == {"main", "single"} and both.coverage.shards_asked == 4
    with pytest.raises(ServiceError, match="unknown collection 'nope'"):
        search(pipeline, query="x", collections=["nope"])


def test_a_failing_or_slow_shard_degrades_instead_of_failing(built):
    pipe = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(shard_timeout_s=0.2, cache_size=0),
                              group_size=1)
    shards = pipe.collections["main"].shards

    async def boom(*args):
        raise RuntimeError("replica died")

    async def slow(*args):
        await asyncio.sleep(5)

    shards[0].search, shards[1].search = boom, slow
    resp = search(pipe, query="telescope galaxy", limit=5)
    assert resp.coverage.degraded and resp.coverage.shards_answered == 1 and resp.coverage.ratio == pytest.approx(1 / 3)
    assert sorted(f.split(": ")[1] for f in resp.coverage.failed) == ["RuntimeError", "timeout"]
    assert resp.results and all(r.chunk_id in shards[2].service.services[0].ids for r in resp.results)


def test_a_failing_group_counts_all_its_shards(built):
    pipe = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(shard_timeout_s=0.2, cache_size=0),
                              group_size=2)
    shards = pipe.collections["main"].shards
    assert [s.size for s in shards] == [2, 1]

    async def boom(*args):
        raise RuntimeError("replica died")

    shards[0].search = boom
    resp = search(pipe, query="telescope galaxy", limit=5)
    assert resp.coverage.shards_asked == 3 and resp.coverage.shards_answered == 1
    assert resp.results and all(r.chunk_id in shards[1].service.services[0].ids for r in resp.results)


@pytest.mark.parametrize("group_size", [1, 2])
def test_shard_groups_answer_like_one_group(built, pipeline, group_size):
    """Groups of 1, 2 or all shards: the same results, scores and coverage for every method."""
    split = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(cache_size=0), group_size=group_size)
    for q in ("telescope galaxy", "bread oven butter", "lucene shard replica commit"):
        for method in ("keyword", "vector", "hybrid"):
            a = search(split, query=q, method=method, limit=12, filters={"topic": {"in": ["music", "databases"]}})
            b = search(pipeline, query=q, method=method, limit=12, filters={"topic": {"in": ["music", "databases"]}})
            assert [r.model_dump() for r in a.results] == [r.model_dump() for r in b.results]
            assert a.coverage.shards_asked == b.coverage.shards_asked == 3


def _legs(pipe, query: str, k: int, filters=None) -> tuple[list, list]:
    """A collection's merged dense and keyword legs, as (chunk id, score), from the pipeline's own fan-out."""
    from deployments.search.retrieval import Retrieval

    c = pipe.collections["main"]
    req = SearchRequest(query=query, filters=filters)
    ctx = SearchContext(req=req, plan=plan_search(req, pipe.settings, 1, False), targets=[c], settings=pipe.settings,
                        work=Work(), started=0.0, asked_query=query, text=query,
                        vectors={"main": run(c.encoder.embed(query))})
    per, failed, _, _ = run(pipe.retrieval.fan_out(ctx, k, k))
    assert not failed
    dense, keyword = Retrieval.legs("main", per["main"], k)
    return [(h.chunk_id, h.score) for h in dense], [(h.chunk_id, h.score) for h in keyword]


def test_shard_slots_asked_for_their_share_merge_to_the_same_legs(built, pipeline, monkeypatch):
    """Shard slots (one deployment a shard, or a group a node) are each asked for their likely share of a leg's
    top k, and again for k where their last hit could still belong: the same merged legs as one group asked for
    k, even when the share is far too small (then slots are asked again, in both legs)."""
    from deployments.search import retrieval as retrieval_module

    split = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(cache_size=0), group_size=1)
    asks = []
    for slot in split.collections["main"].shards:  # what each slot is asked: (dense depth, keyword depth)
        def recording(query, _search=slot.search):
            asks.append((query.k_dense, query.k_keyword))
            return _search(query)
        slot.search = recording
    cases = [(q, f) for q in ("telescope galaxy", "bread oven butter flour", "sail wind tide harbor captain rope",
                              "lucene shard replica commit") for f in (None, {"topic": {"in": ["music", "sailing"]}})]
    expected = [_legs(pipeline, q, 40, f) for q, f in cases]  # one group of the 3 shards: the oracle
    assert any(d for d, _ in expected) and any(kw for _, kw in expected)
    assert [_legs(split, q, 40, f) for q, f in cases] == expected  # the real share: 40 over 3 slots
    first = {a for a in asks if 40 not in a}  # (the rest: slots asked again for all 40 of a leg)
    assert first == {(26, 26)}  # Binomial(40, 1/3): mean 13.3 + 3.5 sd of 2.98, + 2
    monkeypatch.setattr(retrieval_module, "share_depth", lambda k, share: max(1, k // 10))
    before = dict(split.retrieval.asked_again)
    assert [_legs(split, q, 40, f) for q, f in cases] == expected
    assert all(split.retrieval.asked_again[leg] > before[leg] for leg in ("dense", "keyword"))


def test_identical_requests_are_cached_per_version(pipeline):
    first = search(pipeline, query="anchor mast keel", limit=3)
    second = search(pipeline, query="anchor mast keel", limit=3)
    assert not first.cached and second.cached and second.results == first.results
    other = search(pipeline, query="anchor mast keel", limit=4)
    assert not other.cached


def test_history_and_synonyms_change_the_effective_query(built):
    pipe = inprocess_pipeline({"main": built[3][1].version_dir},
                              RouterSettings(synonyms={"boat": ["keel", "mast"]}, cache_size=0))
    resp = search(pipe, query="boat", method="keyword", expand_synonyms=True, debug=True,
                  conversation_history=[{"role": "user", "content": "tell me about telescopes"}])
    assert resp.debug["synonyms_added"] == ["keel", "mast"]
    assert "telescopes" in resp.debug["effective_query"] and "keel" in resp.debug["effective_query"]


def test_vectors_for_mmr_come_from_the_index(pipeline, local):
    group = pipeline.collections["main"].shards[0]
    for service in group.service.services:
        ids = service.table["chunk_id"].to_pylist()[:3]
        got = run(group.vectors(ids))
        assert np.allclose(got, np.load(service.folder / "embeddings.npy")[:3])


def test_fetched_rows_are_the_chunk_tables_rows_in_the_order_asked(built, monkeypatch):
    """The oracle is each shard's chunk table read afresh: rows kept between calls, rows spread over the
    group's shards, an id no shard holds, and a bound on kept rows smaller than one call's rows. Shards
    opened for this test alone, so no other test's reads are kept in them."""
    import deployments.shard.service as service_module

    fresh = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(cache_size=0))
    group = fresh.collections["main"].shards[0].service
    table = {}
    for service in group.services:
        for row in pq.read_table(service.folder / "chunks.parquet").to_pylist():
            table[row["chunk_id"]] = row | {"metadata": json.loads(row["metadata_json"])}
    ids = sorted(table)
    asked = ids[::-3][:12] + ["no-such-chunk#0"] + ids[:5]
    assert len({group.locate(c)[0] for c in asked if c in table}) == 3  # rows of every shard, interleaved
    for bound in (service_module.ROWS_KEPT, 4):
        for s in group.services:
            s._rows = BoundedCache(bound)
        for _ in range(2):  # read, then kept (or dropped and read again under the small bound)
            assert group.fetch(asked) == [table[c] for c in asked if c in table]
    per_shard = [sum(group.locate(c)[0] == i for c in asked if c in table) for i in range(3)]
    assert all(len(s._rows) <= max(4, n) for s, n in zip(group.services, per_shard, strict=True))



def test_rows_kept_cleared_by_another_call_meanwhile_lose_no_row(built, monkeypatch):
    """A shard's rows are read on two threads (a large group's answer on its dense thread, a page's fetch on the
    event loop): another call dropping the kept rows between this call's lookup and its read costs it nothing."""
    import deployments.shard.service as service_module

    fresh = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(cache_size=0))
    service = fresh.collections["main"].shards[0].service.services[0]
    service._rows = BoundedCache(4)
    expected = service.rows_at([0, 1, 2, 3])  # all four kept now

    class ClearedMeanwhile:  # the table, whose read lets "another thread" drop every kept row first
        def __init__(self, table):
            self.table = table

        def take(self, indices):
            service._rows.clear()
            return self.table.take(indices)

    monkeypatch.setattr(service, "table", ClearedMeanwhile(service.table))
    assert service.rows_at([0, 1, 4, 2, 3]) == expected[:2] + service_module.ShardService.rows_at(
        service, [4]) + expected[2:]

def test_rows_sent_with_answers_equal_rows_fetched_afterwards(built):
    fetched = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(rows_with_answers=0, cache_size=0))
    along = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(rows_with_answers=20, cache_size=0))
    sent = []
    for shard in along.collections["main"].shards:
        shard.remote = True  # as a shard deployment's handle: rows come along only across processes
        search_group = shard.service.search

        def spy(*args, _search=search_group):
            answer = _search(*args)
            sent.append(len(answer.rows))
            return answer
        shard.service.search = spy
    for q in ("telescope galaxy", "bread oven", "violin"):
        a = search(fetched, query=q, limit=15).results
        b = search(along, query=q, limit=15).results
        assert [r.model_dump() for r in a] == [r.model_dump() for r in b]
    assert sent and all(n > 0 for n in sent)


def test_shards_in_this_process_send_no_rows_with_their_answers(built):
    """No hop to spare: the final page's rows are fetched once, after fusion."""
    pipe = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(rows_with_answers=20, cache_size=0))
    group = pipe.collections["main"].shards[0].service
    asked = []
    search_group = group.search
    group.search = lambda query: asked.append(query.rows_for_top) or search_group(query)
    assert search(pipe, query="telescope galaxy", limit=5).results
    assert asked == [0]


def test_jvm_warm_up_runs_searches_and_changes_no_answer(pipeline):
    group = pipeline.collections["main"].shards[0].service
    before = search(pipeline, query="lucene shard replica", method="keyword", limit=8, debug=True)
    calls = []
    lucene = group.services[0].lucene
    original = lucene.search_rows
    lucene.search_rows = lambda terms, k, allowed=None: calls.append(terms) or original(terms, k, allowed)
    try:
        group.warm_up(30)
    finally:
        del lucene.search_rows
    assert len(calls) == 10 and all(2 <= len(t) <= 12 for t in calls)  # 30 searches over 3 shards
    calls.clear()
    lucene.search_rows = lambda terms, k, allowed=None: calls.append(terms) or time.sleep(0.05)
    try:
        group.warm_up(10**9, seconds=0.2)  # a shard this slow to search is warmed for the time given, not for ever
    finally:
        del lucene.search_rows
    assert 1 <= len(calls) <= 20
    after = search(pipeline, query="lucene shard replica", method="keyword", limit=8, debug=True)
    assert [r.model_dump() for r in after.results] == [r.model_dump() for r in before.results]


def test_every_stage_and_the_request_have_a_deadline(built):
    """Late fetches are a 503, late vectors skip MMR, a request past request_timeout_s is a 504 with its
    stages cancelled, and a stream whose model never writes ends at the synthesis deadline."""
    pipe = inprocess_pipeline({"main": built[3][1].version_dir},
                              RouterSettings(shard_timeout_s=0.2, cache_size=0, rows_with_answers=0,
                                             request_timeout_s=1.0, synthesis_timeout_s=0.3))
    group = pipe.collections["main"].shards[0]
    cancelled = []

    async def stuck(*args):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    real_fetch, real_vectors, real_search = group.fetch, group.vectors, group.search
    group.fetch = stuck
    with pytest.raises(ServiceError, match="texts") as e:
        search(pipe, query="telescope galaxy", limit=5)
    assert status_of(e.value) == 503
    group.fetch, group.vectors = real_fetch, stuck
    resp = search(pipe, query="telescope galaxy", limit=5, mmr_lambda=0.5)
    assert len(resp.results) == 5 and any("MMR skipped" in w for w in resp.warnings)
    group.vectors = real_vectors

    class NeverAnswers:
        async def answer(self, *args):
            await stuck()

        async def stream(self, *args):
            await asyncio.sleep(30)
            yield {"type": "token", "text": "late"}

    pipe = SearchPipeline(pipe.collections, "main", pipe.settings.model_copy(update={"synthesis_timeout_s": 60.0}),
                          synthesizer=NeverAnswers())
    cancelled.clear()
    with pytest.raises(ServiceError, match="request_timeout_s") as e:
        search(pipe, query="telescope galaxy", limit=5, synthesize=True)
    assert status_of(e.value) == 504 and cancelled == [True]  # the answer still at work was stopped
    pipe.reconfigure(pipe.settings.model_copy(update={"synthesis_timeout_s": 0.3}))
    req = SearchRequest(query="telescope galaxy", limit=5, synthesize=True, stream=True)

    async def stream_all():
        response = await pipe.search(req)
        return [e async for e in pipe.stream_answer(req, response)]

    events = run(asyncio.wait_for(stream_all(), 5))
    assert events[0]["type"] == "results" and events[-1]["type"] == "error" and "timed out" in events[-1]["error"]
    group.search = real_search


def test_operator_caps_bind_clients(pipeline):
    s = pipeline.settings
    pipeline.settings = s.model_copy(update={"candidate_cap": 50})
    try:
        resp = search(pipeline, query="bread oven", limit=5, candidates=400, debug=True)
    finally:
        pipeline.settings = s
    assert resp.debug["candidate_depth"] == 50 and any("capped at 50" in w for w in resp.warnings)


def test_extractive_answers_cite_the_returned_results_that_hold_each_sentence(built):
    """synthesize: true with the engine a CPU node gets by default (no model): every sentence is a sentence
    of a returned result, cited with that result's rank, and its support checked."""
    from deployments.config import SynthesisConfig
    from deployments.synthesis.service import LocalSynthesizer, SynthesisService

    pipe = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(cache_size=0),
                              synthesizer=LocalSynthesizer(SynthesisService(SynthesisConfig(enabled=True))))
    resp = search(pipe, query="telescope galaxy orbit", limit=5, synthesize=True)
    answer = resp.answer
    assert answer is not None and answer.model == "extractive" and answer.sentences
    by_rank = {r.rank: r for r in resp.results}
    for sentence in answer.sentences:
        assert sentence.supported and sentence.citations
        words = set(sentence.text.split()) - {f"[{n}]" for n in sentence.citations}
        for n in sentence.citations:
            assert {w.strip(".[]0123456789") for w in words} - {""} <= \
                {w.strip(".,") for w in by_rank[n].content.split()} | {w.strip(".,") for w in by_rank[n].title.split()}
    assert {c.n for c in answer.citations} == {n for s in answer.sentences for n in s.citations}
    assert all(c.chunk_id == by_rank[c.n].chunk_id for c in answer.citations)
    assert resp.synthesis == answer.text


@pytest.mark.parametrize("fields", [{}, {"method": "keyword"}, {"method": "vector"}, {"fusion": "rrf"},
                                    {"include_context": True, "token_budget": 80}, {"include_citations": False},
                                    {"collections": ["main", "single"]}, {"mmr_lambda": 0.3},
                                    {"filters": {"topic": "sailing"}}, {"min_relevance_score": 0.4}, {"limit": 1}])
def test_results_written_as_json_are_what_the_models_write(built, fields):
    """The router's responses (results rendered from cached fragments) equal, byte for byte less the
    timings, the responses of the models the pipeline builds for other callers."""
    pipe = inprocess_pipeline({"main": built[3][1].version_dir, "single": built[1][1].version_dir}, default="main",
                              settings=RouterSettings(cache_size=0))
    for q in ("telescope galaxy", "bread oven butter", "lucene shard replica"):
        req = SearchRequest(query=q, **({"limit": 20} | fields))
        models = run(pipe.search(req))
        for _ in range(2):  # fragments rendered, then taken from the cache
            rendered = run(pipe.search(req, rendered=True))
            assert rendered.results == [] and rendered.total_results == len(models.results) > 0
            assert '"timings_ms"' not in as_sent(rendered) and as_sent(rendered) == as_sent(models)


def test_a_cached_rendered_response_is_not_served_to_callers_wanting_models(built):
    pipe = inprocess_pipeline({"main": built[3][1].version_dir})
    rendered = run(pipe.search(SearchRequest(query="anchor mast keel", limit=3), rendered=True))
    again = run(pipe.search(SearchRequest(query="anchor mast keel", limit=3), rendered=True))
    models = run(pipe.search(SearchRequest(query="anchor mast keel", limit=3)))
    assert again.cached and as_sent(again).replace('"cached":true', '"cached":false') == as_sent(rendered)
    assert not models.cached and len(models.results) == 3


def test_ann_options_reach_every_shard_the_request_over_the_collections(built):
    """A collection's ``ann`` and a request's, merged (the request's win), reach each shard with the dense leg;
    a keyword search sends none. The shard clients are the real in-process ones, each call recorded."""
    from deployments.edge.schemas import AnnParams

    _, three = built[3]
    pipe = inprocess_pipeline({"main": three.version_dir}, default="main")
    collection = pipe.collections["main"]
    collection.ann = AnnParams(ef_search=300, nprobe=9)
    seen = []
    for shard in collection.shards:
        real = shard.search

        async def recorded(query, _real=real):
            seen.append(query.ann)
            return await _real(query)

        shard.search = recorded
    exact = search(pipe, query="telescope galaxy", method="vector", limit=5, ann={"nprobe": 7, "exact": True})
    assert seen == [{"ef_search": 300, "nprobe": 7, "exact": True}] * len(collection.shards)
    default = search(pipe, query="telescope galaxy", method="vector", limit=5)
    assert [r.chunk_id for r in exact.results] == [r.chunk_id for r in default.results]  # flat: exact either way
    seen.clear()
    search(pipe, query="telescope galaxy", method="keyword", limit=5, ann={"nprobe": 7})
    assert seen == [None] * len(collection.shards)


@pytest.mark.parametrize("method", ["hybrid", "keyword", "vector"])
def test_pages_by_cursor_are_slices_of_one_ranking(pipeline, method):
    """Pages of 4 followed by their cursors, and by offset, give exactly the ranking one request of the same
    search returns at once (same candidates: depths follow the page size), ranks continuing across pages."""
    q = "telescope galaxy lucene"
    whole = search(pipeline, query=q, method=method, limit=4, offset=0, candidates=40)
    assert whole.next_cursor is not None
    pages, cursor = [], None
    while True:
        page = search(pipeline, query=q, method=method, limit=4, candidates=40,
                      **({"cursor": cursor} if cursor else {}))
        pages.append(page)
        cursor = page.next_cursor
        if cursor is None or len(pages) == 10:
            break
    paged = [(r.rank, r.chunk_id, r.score) for p in pages for r in p.results]
    assert [rank for rank, _, _ in paged] == list(range(1, len(paged) + 1))
    assert len(paged) > 8 and len({cid for _, cid, _ in paged}) == len(paged)
    by_offset = [(r.rank, r.chunk_id, r.score) for o in range(0, len(paged), 4)
                 for r in search(pipeline, query=q, method=method, limit=4, offset=o, candidates=40).results]
    assert by_offset == paged
    # The oracle: one page as big as all of them, over the same 40 candidates a leg (depth is max(candidates,
    # limit)); one leg's exact top-k is the same at any depth.
    assert len(paged) <= 40
    big = search(pipeline, query=q, method=method, limit=len(paged), candidates=40)
    assert [(r.rank, r.chunk_id) for r in big.results] == [(rank, cid) for rank, cid, _ in paged]
    assert [r.score for r in big.results] == pytest.approx([score for _, _, score in paged])


def test_a_cursor_is_refused_for_another_search_after_a_switch_and_with_mmr(pipeline):
    from deployments.search.paging import make_cursor, page_offset, read_cursor

    first = search(pipeline, query="telescope galaxy", limit=3)
    cursor = first.next_cursor
    again = SearchRequest(query="telescope galaxy", limit=3, cursor=cursor)
    assert page_offset(again, read_cursor(again), first.index_version, pipeline.settings) == 3
    with pytest.raises(ServiceError) as e:
        search(pipeline, query="bread oven", limit=3, cursor=cursor)
    assert status_of(e.value) == 400 and "another search" in str(e.value)
    with pytest.raises(ServiceError) as e:  # the version the cursor was made on is no longer the one served
        stale = make_cursor(SearchRequest(query="telescope galaxy", limit=3), {"main": "v0-gone"}, 3)
        search(pipeline, query="telescope galaxy", limit=3, cursor=stale)
    assert status_of(e.value) == 409 and "v0-gone ->" in str(e.value)
    original = pipeline.settings
    try:  # an operator's change of the ranking between two pages: refused; a timeout's change: not
        pipeline.reconfigure(original.model_copy(update={"shard_timeout_s": original.shard_timeout_s + 1}))
        assert search(pipeline, query="telescope galaxy", limit=3, cursor=cursor).offset == 3
        pipeline.reconfigure(original.model_copy(update={"dense_weight": 0.3, "keyword_weight": 0.7}))
        with pytest.raises(ServiceError) as e:
            search(pipeline, query="telescope galaxy", limit=3, cursor=cursor)
        assert status_of(e.value) == 409 and "ranking settings" in str(e.value)
    finally:
        pipeline.reconfigure(original)
    with pytest.raises(ServiceError) as e:
        search(pipeline, query="telescope galaxy", limit=3, cursor="not-a-cursor")
    assert status_of(e.value) == 400
    with pytest.raises(ServiceError) as e:
        search(pipeline, query="telescope galaxy", limit=3, offset=3, mmr_lambda=0.5)
    assert status_of(e.value) == 400 and "MMR" in str(e.value)
    assert search(pipeline, query="telescope galaxy", limit=3, mmr_lambda=0.5).next_cursor is None
    with pytest.raises(ServiceError) as e:
        search(pipeline, query="telescope galaxy", limit=10, offset=195)
    assert status_of(e.value) == 400 and "past the 200 results" in str(e.value)
    with pytest.raises(ValueError):
        SearchRequest(query="x", offset=3, cursor=cursor)


def test_a_batch_answers_each_search_as_alone_embedding_the_queries_once(built, monkeypatch):
    """A batch's responses equal the same searches sent one by one; the queries went to the encoder as one
    batch, never one by one; an invalid search fails alone."""
    pipeline = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(cache_size=0))  # no cache
    reqs = [SearchRequest(query=q, limit=5, method=m) for q in ("telescope galaxy", "bread oven", "sail tide")
            for m in ("hybrid", "vector", "keyword")]
    reqs.append(SearchRequest(query="telescope", collections=["nope"]))
    encoder = pipeline.collections["main"].encoder
    calls = {"one": 0, "many": []}
    one, many = encoder.embed, encoder.embed_many

    async def counted_one(text):
        calls["one"] += 1
        return await one(text)

    async def counted_many(texts):
        calls["many"].append(len(texts))
        return await many(texts)

    monkeypatch.setattr(encoder, "embed", counted_one)
    monkeypatch.setattr(encoder, "embed_many", counted_many)
    answers = run(pipeline.search_batch(reqs))
    assert calls == {"one": 0, "many": [3]}  # 3 distinct texts of the 6 searches that embed
    for req, got in zip(reqs[:-1], answers[:-1], strict=True):
        alone = run(pipeline.search(req))
        assert not alone.cached and not got.cached
        assert [(r.chunk_id, r.rank) for r in got.results] == [(r.chunk_id, r.rank) for r in alone.results]
        assert [r.score for r in got.results] == pytest.approx([r.score for r in alone.results], abs=1e-6)
    assert isinstance(answers[-1], ServiceError) and status_of(answers[-1]) == 404


def test_a_trace_per_search_with_its_stages_as_children(built):
    """The spans of a search: one root in the caller's trace (traceparent), a child per stage that ran (the
    response's timings), a child of retrieve per shard group, all inside the root; a cached answer: the root."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from deployments.search.tracing import SearchTracer

    pipeline = inprocess_pipeline({"main": built[3][1].version_dir}, RouterSettings(), group_size=1)
    exporter = InMemorySpanExporter()
    tracer = SearchTracer(exporter=exporter)
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    req = SearchRequest(query="telescope galaxy", limit=3, include_context=True)
    resp = run(pipeline.search(req))
    tracer.record(resp, {"traceparent": f"00-{trace_id}-{parent_id}-01"}, "rid-trace-1")
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "search"]
    assert f"{root.context.trace_id:032x}" == trace_id and f"{root.parent.span_id:016x}" == parent_id
    assert root.attributes["request.id"] == "rid-trace-1" and root.attributes["search.results"] == 3
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    children = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id}
    assert set(children) == set(resp.timings_ms) - {"total"}
    assert {"embed", "retrieve", "fuse", "fetch", "assemble"} <= set(children)
    groups = [s for s in spans if s.parent is not None and s.parent.span_id == children["retrieve"].context.span_id]
    assert sorted(s.name for s in groups) == [f"shards main/{g.name}" for g in
                                              sorted(pipeline.collections["main"].shards, key=lambda g: g.name)]
    assert all(root.start_time <= s.start_time <= s.end_time <= root.end_time for s in spans)
    exporter.clear()
    cached = run(pipeline.search(req))
    assert cached.cached
    tracer.record(cached, {}, None)
    assert [s.name for s in exporter.get_finished_spans()] == ["search"]
