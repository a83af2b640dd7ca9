"""Spell correction through the request pipeline over real shards: per collection, off by default."""

from __future__ import annotations

import asyncio

import pytest

from deployments.edge.schemas import SearchRequest
from deployments.search.inprocess import inprocess_pipeline
from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import write_jsonl
from tests.integration.conftest import ENCODER


@pytest.fixture(scope="module")
def pipeline(built, ray_local, tmp_path_factory):
    docs = [{"_id": f"z{i}", "title": "airships", "text": f"the zeppelin hangar number {i} and its mooring mast"}
            for i in range(6)]
    corpus = write_jsonl(tmp_path_factory.mktemp("airships") / "corpus.jsonl", docs)
    other = build_index(BuildConfig(corpus=corpus, out=tmp_path_factory.mktemp("idx-air"), encoder=ENCODER,
                                    progress=False))
    return inprocess_pipeline({"main": built[3][1].version_dir, "air": other.version_dir}, default="main")


def search(pipeline, **kw):
    return asyncio.run(pipeline.search(SearchRequest(**kw)))


def test_a_typo_is_corrected_and_searched_as_the_right_word(pipeline):
    fixed = search(pipeline, query="telescop galaxi", spell_correct=True, debug=True, limit=5)
    assert fixed.corrected_query == "telescope galaxy" and fixed.query == "telescop galaxi"
    right = search(pipeline, query="telescope galaxy", limit=5)
    assert [r.chunk_id for r in fixed.results] == [r.chunk_id for r in right.results]
    trace = fixed.debug["spelling"]["corrections"]
    assert [(c["original"], c["corrected"]) for c in trace] == [("telescop", "telescope"), ("galaxi", "galaxy")]
    assert "spell" in fixed.timings_ms


def test_known_words_are_left_alone_and_correction_is_off_by_default(pipeline):
    same = search(pipeline, query="telescope galaxy", spell_correct=True, limit=5)
    plain = search(pipeline, query="telescope galaxy", limit=5)
    assert same.corrected_query is None
    assert [r.chunk_id for r in same.results] == [r.chunk_id for r in plain.results]
    assert search(pipeline, query="telescop", limit=5).corrected_query is None  # not asked


def test_each_collection_corrects_against_its_own_words(pipeline):
    assert search(pipeline, query="zepelin", collections=["air"], spell_correct=True).corrected_query == "zeppelin"
    main = search(pipeline, query="zepelin", collections=["main"], spell_correct=True)
    assert main.corrected_query is None  # "main" has no word within two edits
    assert search(pipeline, query="zepelin galaxi", collections=["main", "air"],
                  spell_correct=True).corrected_query == "zeppelin galaxy"
