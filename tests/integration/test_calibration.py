"""relevance_score's scales over a real index: ``python -m relevance.calibrate`` fitted on judgments of the test
corpus (a query of a topic's words: that topic's documents relevant), then searched in-process. Checked against the
response's own leg scores (the probability computed by hand from the written coefficients), against minmax (a
nonsense query's best hit is 1.0 there, not here), and the tuned threshold still cut on the scale it was tuned on."""

from __future__ import annotations

import asyncio
import json
import math
import random
import shutil
from pathlib import Path

import pytest

from deployments.config import RouterSettings
from deployments.edge.schemas import SearchRequest
from deployments.search.inprocess import inprocess_pipeline
from deployments.search.models import RankingModels
from index_format.calibration import read_calibration
from relevance import calibrate
from tests.conftest import TOPICS, write_jsonl


@pytest.fixture(scope="module")
def judged_root(built, tmp_path_factory):
    """A copy of the 1-shard test root, and BEIR judgments of 60 queries of two or three words of one topic (its
    documents relevant) and one of another."""
    cfg, _ = built[1]
    root = tmp_path_factory.mktemp("calibrated") / "root"
    shutil.copytree(cfg.out, root)
    rng = random.Random(3)
    folder = root.parent / "judgments"
    queries, qrels = [], ["query-id\tcorpus-id\tscore"]
    topic_of = {}
    for line in Path(cfg.corpus).read_text().splitlines():
        try:
            doc = json.loads(line)
            topic_of[doc["_id"]] = doc["metadata"]["topic"]
        except (ValueError, KeyError, TypeError):
            continue  # the corpus's deliberately bad lines
    topics = sorted(TOPICS)
    for i in range(60):
        # Two or three words of the topic and one of another, whose documents the keyword leg finds too.
        topic, other = topics[i % len(topics)], topics[(i + 1) % len(topics)]
        words = rng.sample(TOPICS[topic].split(), rng.randint(2, 3)) + rng.sample(TOPICS[other].split(), 1)
        queries.append({"_id": f"q{i}", "text": " ".join(words)})
        qrels += [f"q{i}\t{d}\t1" for d, t in topic_of.items() if t == topic]
    write_jsonl(folder / "queries.jsonl", queries)
    (folder / "qrels").mkdir()
    (folder / "qrels" / "train.tsv").write_text("\n".join(qrels) + "\n")
    return root, folder


def search(pipeline, **body):
    return asyncio.run(pipeline.search(SearchRequest(**body)))


def test_calibrated_scores_are_the_written_regression_of_each_hit_s_own_scores(judged_root, capsys):
    root, folder = judged_root
    assert calibrate.main(["--index", str(root), "--data", str(folder), "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["written"] and set(summary["models"]) == {"hybrid", "vector", "keyword"}
    assert summary["fitted"]["queries"] == 60 and summary["fitted"]["held_out_queries"] > 0
    written = read_calibration(root)
    assert written["models"] == summary["models"]

    pipeline = inprocess_pipeline({"default": root}, RouterSettings(cache_size=0))
    answer = search(pipeline, query="telescope galaxy comet", limit=10)
    assert answer.relevance_scales == {"default": "calibrated"}
    model = written["models"]["hybrid"]
    both = [r for r in answer.results if r.scores.dense is not None and r.scores.keyword is not None]
    assert both
    for r in both:
        z = model["bias"] + model["weights"][0] * r.scores.dense + model["weights"][1] * math.log1p(r.scores.keyword)
        assert r.relevance_score == pytest.approx(1 / (1 + math.exp(-z)), rel=1e-9)
    # A topic query's best result is likelier relevant than a nonsense query's; on minmax (RRF's) both are 1.0.
    nonsense = search(pipeline, query="qwxz vbnmk plorf", limit=10)
    assert nonsense.results and nonsense.results[0].relevance_score < answer.results[0].relevance_score
    for body in ({"query": "telescope galaxy comet"}, {"query": "qwxz vbnmk plorf"}):
        relative = search(pipeline, **body, fusion="rrf", relevance_scale="minmax")
        assert relative.relevance_scales == {"default": "minmax"}
        assert relative.results[0].relevance_score == 1.0
    keyword = search(pipeline, query="bread oven", method="keyword", limit=5)
    assert keyword.relevance_scales == {"default": "calibrated"}
    m = written["models"]["keyword"]
    for r in keyword.results:
        assert r.relevance_score == pytest.approx(
            1 / (1 + math.exp(-(m["bias"] + m["weights"][0] * math.log1p(r.scores.keyword)))), rel=1e-9)


def test_uncalibrated_scales_and_the_tuned_threshold(judged_root):
    root, folder = judged_root
    assert calibrate.main(["--index", str(root), "--off"]) == 0
    assert read_calibration(root) is None
    pipeline = inprocess_pipeline({"default": root}, RouterSettings(cache_size=0))
    answer = search(pipeline, query="telescope galaxy comet", limit=10)
    assert answer.relevance_scales == {"default": "cosine"}
    dense_floor = min(r.scores.dense for r in answer.results if r.scores.dense is not None)
    for r in answer.results:  # its cosine; a hit the dense leg did not return: that leg's lowest
        cosine = r.scores.dense if r.scores.dense is not None else dense_floor
        assert r.relevance_score == pytest.approx(min(1.0, max(0.0, cosine)))
    keyword = search(pipeline, query="bread oven", method="keyword", limit=5)
    assert keyword.relevance_scales == {"default": "minmax"} and keyword.results[0].relevance_score == 1.0
    # A tuned threshold (relevance.tune, on the minmax scale) is cut on that scale, and says so.
    tuned = inprocess_pipeline({"default": root}, RouterSettings(cache_size=0, min_relevance_score=0.6))
    cut = search(tuned, query="telescope galaxy comet", limit=50)
    # (the default fusion is weighted: on the minmax scale its score is the fusion's own, "weighted")
    assert cut.relevance_scales == {"default": "weighted"} and all(r.relevance_score >= 0.6 for r in cut.results)
    relative = search(pipeline, query="telescope galaxy comet", limit=50, relevance_scale="minmax")
    assert [r.chunk_id for r in cut.results] == [r.chunk_id for r in relative.results if r.relevance_score >= 0.6]
    # Asking for the absolute scale leaves the tuned threshold off.
    assert search(tuned, query="telescope galaxy comet", limit=50,
                  relevance_scale="absolute").relevance_scales == {"default": "cosine"}


def test_a_router_follows_the_calibration_written_and_removed(judged_root):
    """The router's follower loads the calibration when it is written and drops it when removed; a cached answer
    made before is not served after (the calibration is part of the cache key)."""
    root, folder = judged_root
    calibrate.main(["--index", str(root), "--off"])  # whatever the tests before left
    pipeline = inprocess_pipeline({"default": root}, RouterSettings(cache_size=16))
    calibrations = pipeline.calibrations
    follower = RankingModels({}, {"default": str(root)}, calibrations)
    asyncio.run(follower.follow())
    assert calibrations == {}
    before = search(pipeline, query="telescope galaxy", limit=5)
    assert search(pipeline, query="telescope galaxy", limit=5).cached
    assert calibrate.main(["--index", str(root), "--data", str(folder), "--no-progress"]) == 0
    asyncio.run(follower.follow())
    assert calibrations["default"].fitted == read_calibration(root)["fitted"]
    assert follower.describe()["default"]["calibrated"] is True
    after = search(pipeline, query="telescope galaxy", limit=5)
    assert not after.cached and before.relevance_scales == {"default": "cosine"}
    assert after.relevance_scales == {"default": "calibrated"}
    calibrate.main(["--index", str(root), "--off"])
    asyncio.run(follower.follow())
    assert calibrations == {} and not follower.errors


@pytest.mark.parametrize("calibrated", [True, False])
def test_a_page_s_relevance_scores_equal_those_of_the_whole_ranking(judged_root, calibrated):
    """Without a cut the ranking stage scores only the hits a page can show; each must score as it does when the
    whole ranking is scored, which a cut of 0 (every hit kept) makes it do: on every scale, at every offset."""
    root, folder = judged_root
    calibrate.main(["--index", str(root), "--data", str(folder), "--no-progress"] if calibrated
                   else ["--index", str(root), "--off"])
    pipeline = inprocess_pipeline({"default": root}, RouterSettings(cache_size=0))
    scales = set()
    for query in ("telescope galaxy comet", "bread oven", "qwxz vbnmk plorf"):
        for body in ({"method": "hybrid"}, {"method": "vector"}, {"method": "keyword"}, {"fusion": "rrf"},
                     {"relevance_scale": "minmax"}, {"fusion": "rrf", "relevance_scale": "minmax"}):
            for offset in (0, 4):
                page = search(pipeline, query=query, limit=4, offset=offset, **body)
                whole = search(pipeline, query=query, limit=4, offset=offset, min_relevance_score=0.0, **body)
                assert [r.chunk_id for r in page.results] == [r.chunk_id for r in whole.results]
                assert [r.relevance_score for r in page.results] == [r.relevance_score for r in whole.results]
                assert page.relevance_scales == whole.relevance_scales
                scales |= set(page.relevance_scales.values())
    assert scales == ({"calibrated", "weighted", "minmax"} if calibrated else {"cosine", "weighted", "minmax"})
    calibrate.main(["--index", str(root), "--off"])
