"""A query with more distinct terms than Lucene's clause limit, over three shards: searched with its rarest 1,024
(by corpus document frequency: the same on every shard), equal to the unsharded BM25 of those terms alone, and the
response says how many were left out. Short queries are searched whole and say nothing."""

from __future__ import annotations

import asyncio
import random

import pytest

from deployments.config import RouterSettings
from deployments.edge.schemas import SearchRequest
from deployments.errors import InvalidField
from deployments.search.inprocess import LocalIndex, inprocess_pipeline
from deployments.shard.query import MAX_QUERY_CLAUSES
from deployments.shard.service import open_version
from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import write_jsonl
from tests.integration.conftest import ENCODER

VOCABULARY = [f"w{i:04d}" for i in range(1500)]


@pytest.fixture(scope="module")
def wide(ray_local, tmp_path_factory):
    """80 documents of 60 words drawn unevenly from 1,500 (so their document frequencies differ), in 3 shards."""
    rng = random.Random(5)
    weights = [1 / (1 + i % 50) for i in range(len(VOCABULARY))]
    docs = [{"_id": f"d{i:03d}", "title": "", "text": " ".join(rng.choices(VOCABULARY, weights, k=60))}
            for i in range(80)]
    path = write_jsonl(tmp_path_factory.mktemp("wide") / "corpus.jsonl", docs)
    return build_index(BuildConfig(corpus=path, out=tmp_path_factory.mktemp("wide-idx"), shards=3, encoder=ENCODER,
                                   chunk_size=200, chunk_overlap=0, progress=False)).version_dir


def test_the_rarest_terms_are_searched_and_the_cut_is_said(wide):
    pipeline = inprocess_pipeline({"default": wide}, RouterSettings(cache_size=0))
    _, _, _, df, _ = open_version(wide)
    present = [t for t in VOCABULARY if df.get(t, 0) > 0]
    assert len(present) > MAX_QUERY_CLAUSES
    query = " ".join(present)
    answer = asyncio.run(pipeline.search(SearchRequest(query=query, method="keyword", limit=10)))
    left = len(present) - MAX_QUERY_CLAUSES
    assert answer.warnings == [f"keyword leg: the query's {MAX_QUERY_CLAUSES:,} rarest distinct terms searched, "
                               f"{left:,} of its {len(present):,} left out (Lucene's limit of {MAX_QUERY_CLAUSES:,} "
                               "clauses)"]
    # The oracle: the terms ranked by corpus df by hand, the rarest 1,024 searched alone, unsharded.
    kept = sorted(present, key=lambda t: (df[t], present.index(t)))[:MAX_QUERY_CLAUSES]
    oracle = LocalIndex(wide).bm25(" ".join(t for t in present if t in set(kept)), k=10)
    assert [r.chunk_id for r in answer.results] == [h.chunk_id for h in oracle]
    assert [r.score for r in answer.results] == pytest.approx([h.score for h in oracle], rel=1e-5)
    short = asyncio.run(pipeline.search(SearchRequest(query=" ".join(present[:20]), method="keyword", limit=10)))
    assert short.warnings == []


def test_the_query_limit_is_a_setting(wide):
    pipeline = inprocess_pipeline({"default": wide}, RouterSettings(cache_size=0, max_query_chars=40))
    assert asyncio.run(pipeline.search(SearchRequest(query="w0001 " * 6, limit=3))).results
    with pytest.raises(InvalidField, match=r"query is 42 characters; this service takes at most 40 "
                                           r"\(router.max_query_chars\)"):
        asyncio.run(pipeline.search(SearchRequest(query="w0001 " * 7, limit=3)))
