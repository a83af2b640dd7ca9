"""Document ACLs enforced inside the shards: a caller never receives a chunk it may not see (property
test over random callers, queries and filters), and what it may see ranks as if the rest did not exist."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployments.edge.schemas import SearchRequest
from deployments.search.inprocess import LocalIndex, inprocess_pipeline
from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import TOPICS, make_corpus, write_jsonl

PRINCIPALS = ["t1", "t2", "t3", "staff"]
WORDS = " ".join(TOPICS.values()).split()


@pytest.fixture(scope="module")
def acl_index(ray_local, tmp_path_factory):
    rng = random.Random(5)
    docs = make_corpus(50, seed=3)
    for d in docs:
        roll = rng.random()
        if roll < 0.15:
            continue  # no ACL at all: seen by nobody
        d["metadata"]["acl"] = rng.sample(PRINCIPALS + ["public"], rng.randint(0, 2)) if roll < 0.9 else "t1"
    corpus = write_jsonl(tmp_path_factory.mktemp("acl") / "corpus.jsonl", docs)
    cfg = BuildConfig(corpus=corpus, out=tmp_path_factory.mktemp("acl-index"), shards=2, encoder="hashing:32",
                      chunk_size=40, chunk_overlap=8, progress=False)
    return build_index(cfg).version_dir


@pytest.fixture(scope="module")
def pipeline(acl_index):
    return inprocess_pipeline({"main": acl_index}, acl_field="acl")


def visible(metadata: dict, principals: set[str]) -> bool:
    acl = metadata.get("acl")
    if acl is None:
        return False
    acl = {acl} if isinstance(acl, str) else set(acl)
    return bool(acl & (principals | {"public"}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(principals=st.sets(st.sampled_from(PRINCIPALS + ["intruder"]), max_size=3),
       query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join),
       method=st.sampled_from(["keyword", "vector", "hybrid"]),
       topic=st.none() | st.sampled_from(sorted(TOPICS)),
       limit=st.integers(1, 30))
def test_no_caller_ever_receives_a_chunk_it_may_not_see(pipeline, principals, query, method, topic, limit):
    req = SearchRequest(query=query, method=method, limit=limit, filters={"topic": topic} if topic else None,
                        include_context=True)
    resp = asyncio.run(pipeline.search(req, principals=sorted(principals)))
    for r in resp.results:
        assert visible(r.metadata, principals), (r.chunk_id, r.metadata, principals)
        assert topic is None or r.metadata["topic"] == topic
    for passage in resp.context or []:
        assert all(cid in {r.chunk_id for r in resp.results} for cid in passage["chunk_ids"])


def test_visible_chunks_rank_as_if_alone(pipeline, acl_index):
    local = LocalIndex(acl_index)
    for principals in ({"t1"}, {"t2", "staff"}, set()):
        for q in ("telescope galaxy", "bread oven", "lucene shard"):
            everything = local.bm25(q, 10_000)
            rows = {row["chunk_id"]: json.loads(row["metadata_json"]) for row in local.fetch(everything)}
            expected = [h for h in everything if visible(rows.get(h.chunk_id, {}), principals)][:5]
            resp = asyncio.run(pipeline.search(SearchRequest(query=q, method="keyword", limit=5),
                                               principals=sorted(principals)))
            assert [r.score for r in resp.results] == pytest.approx([h.score for h in expected])
            assert all(r.score > 0 for r in resp.results)  # only chunks that hold a query term


def test_callers_do_not_share_cached_answers(pipeline):
    req = SearchRequest(query="star bread boat piano index", method="keyword", limit=30)
    everyone = asyncio.run(pipeline.search(req, principals=PRINCIPALS))
    nobody = asyncio.run(pipeline.search(req, principals=[]))  # public chunks only
    assert not nobody.cached and len(nobody.results) < len(everyone.results)


def test_spelling_suggests_only_words_of_chunks_the_caller_may_see(pipeline, acl_index):
    import pyarrow.parquet as pq

    from deployments.shard.vocabulary import document_frequencies

    rows = [r for shard in sorted((acl_index / "shards").iterdir())
            for r in pq.read_table(shard / "chunks.parquet").to_pylist()]
    shards = pipeline.collections["main"].shards
    for principals in ({"t1"}, {"t2", "staff"}, set()):
        acl = ("acl", sorted(principals | {"public"}))
        merged: dict[str, int] = {}
        for shard in shards:
            for word, n in asyncio.run(shard.vocabulary(acl)).items():
                merged[word] = merged.get(word, 0) + n
        seen = [r for r in rows if visible(json.loads(r["metadata_json"]), principals)]
        assert merged == dict(document_frequencies(f"{r['title']} {r['text']}" for r in seen))
        assert len(seen) < len(rows)
