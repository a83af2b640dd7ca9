"""The learned ranking stage end to end: trained by its command on planted judgments, published, activated only
when it wins, served by the in-process pipeline, rolled back, and never in the way when no model is active."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from pathlib import Path

import lightgbm
import numpy as np
import pytest

from deployments.edge.schemas import SearchRequest
from deployments.errors import Conflict, InvalidRequest
from deployments.search.inprocess import inprocess_pipeline
from index_format.chunk_ids import doc_of
from index_format.rankers import RankerError, activate_ranker, active_ranker, list_rankers, read_ranker
from relevance import rankers, train_ranker
from tests.conftest import TOPICS, write_jsonl

SHORT = 8  # words: the planted rule judges a document relevant when its text is this short or shorter


@pytest.fixture(scope="module")
def planted(built, corpus, tmp_path_factory):
    """A copy of the 3-shard root and BEIR judgments in which, for every query of a topic, exactly the topic's
    short documents are relevant: BM25 and the cosine barely see it, a chunk's length says it all."""
    cfg, summary = built[3]
    path, docs = corpus
    root = tmp_path_factory.mktemp("ranked") / "root"
    shutil.copytree(cfg.out, root)
    data = tmp_path_factory.mktemp("beir")
    shutil.copy(path, data / "corpus.jsonl")
    rng = random.Random(3)
    queries, lines = [], ["query-id\tcorpus-id\tscore"]
    for i in range(240):  # a quarter held out: over the guard's 50 queries (relevance.guard)
        topic = sorted(TOPICS)[i % len(TOPICS)]
        queries.append({"_id": f"q{i}", "text": " ".join(rng.sample(TOPICS[topic].split(), 3))})
        for d in docs:
            if d["metadata"]["topic"] == topic and len(d["text"].split()) <= SHORT:
                lines.append(f"q{i}\t{d['_id']}\t1")
    write_jsonl(data / "queries.jsonl", queries)
    (data / "qrels").mkdir()
    (data / "qrels" / "train.tsv").write_text("\n".join(lines) + "\n")
    return root, data


def train(root: Path, data: Path, out: Path, *extra: str) -> dict:
    code = train_ranker.main(["--index", str(root), "--data", str(data), "--out", str(out), "--folds", "3",
                              "--validation-share", "0.25", "--no-progress", *extra])
    assert code == 0
    return json.loads((out / "ranker.json").read_text())


def search(pipeline, text: str, **fields):
    return asyncio.run(pipeline.search(SearchRequest(query=text, **({"limit": 10} | fields))))


@pytest.fixture(scope="module")
def trained(planted, tmp_path_factory):
    root, data = planted
    out = tmp_path_factory.mktemp("model")
    return out, train(root, data, out, "--activate")


def test_a_planted_feature_is_learned(trained):
    out, description = trained
    cv, held = description["cross_validation"], description["validation"]
    # Oracle: the judgments were planted on a chunk's length; the order without a model cannot see it.
    assert cv["model_ndcg"] > cv["without_model_ndcg"] + 0.2, cv
    assert held["model_ndcg"] > held["without_model_ndcg"] + 0.2, held
    booster = lightgbm.Booster(model_file=str(out / "model.txt"))
    gain = dict(zip(booster.feature_name(), booster.feature_importance("gain"), strict=True))
    assert max(gain, key=gain.get) == "length", gain


def test_the_activated_model_orders_searches(planted, trained):
    root, data = planted
    _, description = trained
    assert active_ranker(root) == description["id"]
    pipeline = inprocess_pipeline({"default": root})
    assert pipeline.models["default"].id == description["id"]
    judged = {}
    for line in (data / "qrels" / "train.tsv").read_text().splitlines()[1:]:
        q, d, _ = line.split("\t")
        judged.setdefault(q, set()).add(d)
    queries = {q["_id"]: q["text"] for q in map(json.loads, (data / "queries.jsonl").read_text().splitlines())}
    held = list(description["validation"]["queries"])
    hits_with = hits_without = 0
    for qid in held:
        ranked = search(pipeline, queries[qid])
        plain = search(pipeline, queries[qid], ranking_model=False)
        assert ranked.ranking_model == description["id"] and plain.ranking_model is None
        hits_with += sum(r.doc_id in judged[qid] for r in ranked.results[:3])
        hits_without += sum(r.doc_id in judged[qid] for r in plain.results[:3])
    assert hits_with > hits_without + len(held) // 2, (hits_with, hits_without)
    # The model's scores come back in the order of the results, and the trace names the stage.
    debug = search(pipeline, queries[held[0]], debug=True)
    assert debug.debug["ranking_model"]["model"] == description["id"] and debug.debug["ranking_model"]["applied"]
    scores = [r.score for r in debug.results]
    assert scores == sorted(scores, reverse=True)
    # group_by folds the model's order (each document at its best chunk there), not the fused one.
    whole = search(pipeline, queries[held[0]], limit=20, candidates=20, debug=True)
    by_model, fused = ([h["chunk_id"] for h in whole.debug[stage]] for stage in ("reranked", "fused"))
    assert len(by_model) < 50  # the trace shows 50: all of them

    def firsts(chunk_ids):  # each document's first chunk, in order
        seen: dict[str, str] = {}
        for c in chunk_ids:
            seen.setdefault(doc_of(c), c)
        return list(seen.values())

    grouped = search(pipeline, queries[held[0]], limit=20, candidates=20, group_by="doc_id")
    assert grouped.ranking_model == description["id"]
    assert [r.chunk_id for r in grouped.results] == firsts(by_model)[:20] != firsts(fused)[:20]


def test_a_losing_model_is_refused(planted, trained, corpus, tmp_path):
    """A model trained on the opposite rule (long documents relevant) is compared on the active model's held-out
    judgments and loses: it is published but never activated."""
    root, data = planted
    out, description = trained
    inverted = tmp_path / "beir"
    shutil.copytree(data, inverted)
    _, docs = corpus
    lines = ["query-id\tcorpus-id\tscore"]
    for q in map(json.loads, (data / "queries.jsonl").read_text().splitlines()):
        topic = next(t for t, words in TOPICS.items() if q["text"].split()[0] in words.split())
        lines += [f"{q['_id']}\t{d['_id']}\t1" for d in docs
                  if d["metadata"]["topic"] == topic and len(d["text"].split()) > 100]
    (inverted / "qrels" / "train.tsv").write_text("\n".join(lines) + "\n")
    loser_dir = tmp_path / "loser"
    loser = train(root, inverted, loser_dir, "--name", "loser")
    # Judged where it counts: the served model's held-out queries and judgments.
    loser["validation"] = description["validation"]
    (loser_dir / "ranker.json").write_text(json.dumps(loser))
    from index_format.rankers import publish_ranker

    publish_ranker(root, loser_dir)
    assert loser["id"] in list_rankers(root)
    assert rankers.activate(root, loser["id"]) == 2
    assert active_ranker(root) == description["id"]
    comparison = rankers.compare(root, loser["id"])
    assert comparison["served"] == description["id"]
    assert comparison["model_ndcg"] < comparison["served_ndcg"]
    with pytest.raises(RankerError, match="not activating"):
        activate_ranker(root, loser["id"], comparison)
    stale = dict(comparison, served=None, model_ndcg=1.0)  # made against another served model: refused too
    with pytest.raises(RankerError, match="compare again"):
        activate_ranker(root, loser["id"], stale)


def test_a_gain_within_noise_is_refused(planted, trained, corpus, tmp_path):
    """Judgments drawn at random (each query's relevant documents a random fifth of the corpus): what a model learns
    from them is chance, and on its held-out queries (about 60) it is no better than what is served beyond chance. The
    guard refuses it, saying so; the planted model, a clear gain, was accepted (``trained``)."""
    root, data = planted
    _, description = trained
    assert description["validation"]["guard"]["accept"] and description["validation"]["guard"]["gain_low"] > 0
    _, docs = corpus
    rng = random.Random(11)
    noise = tmp_path / "beir"
    shutil.copytree(data, noise)
    lines = ["query-id\tcorpus-id\tscore"]
    for q in map(json.loads, (data / "queries.jsonl").read_text().splitlines()):
        lines += [f"{q['_id']}\t{d['_id']}\t1" for d in rng.sample(docs, len(docs) // 5)]
    (noise / "qrels" / "train.tsv").write_text("\n".join(lines) + "\n")
    chance = train(root, noise, tmp_path / "chance", "--name", "chance", "--publish")
    assert rankers.activate(root, chance["id"]) == 2
    comparison = rankers.compare(root, chance["id"])
    verdict = comparison["guard"]
    assert not verdict["accept"] and verdict["queries"] >= 50 and verdict["gain_low"] <= 0, verdict
    assert "within chance" in verdict["why"]
    assert active_ranker(root) == description["id"]


def test_no_active_model_never_reorders(planted, trained):
    """Rolled back to no model, a collection ranks exactly as it did before any model: the same results and
    scores as the stage turned off, and no trace of it."""
    root, data = planted
    _, description = trained
    queries = [q["text"] for q in map(json.loads, (data / "queries.jsonl").read_text().splitlines())][:15]
    assert rankers.main(["off", str(root)]) == 0
    assert active_ranker(root) is None
    plain = inprocess_pipeline({"default": root})
    assert plain.models == {}
    for text in queries:
        got = search(plain, text, debug=True)
        off = search(plain, text, ranking_model=False, debug=True)
        assert got.ranking_model is None and "ranking_model" not in got.debug
        assert [(r.chunk_id, r.score) for r in got.results] == [(r.chunk_id, r.score) for r in off.results]
        assert [doc_of(r.chunk_id) for r in got.results] == [r.doc_id for r in got.results]
    with pytest.raises(InvalidRequest, match="no active ranking model"):
        search(plain, queries[0], ranking_model=True)
    # A cursor names the model that ranked its first page: once the model changed, its next page is refused.
    ranked = inprocess_pipeline({"default": root})
    activate_ranker(root, description["id"], None, rollback=True)
    first = search(inprocess_pipeline({"default": root}), queries[0], limit=3)
    assert first.ranking_model == description["id"] and first.next_cursor
    with pytest.raises(Conflict, match="the index changed since the first page"):
        search(ranked, queries[0], limit=3, cursor=first.next_cursor)
    activate_ranker(root, None, None)
    # One call brings the model back (a rollback of the "off"), and it ranks again.
    assert rankers.main(["rollback", str(root)]) == 0
    assert active_ranker(root) == description["id"]
    assert search(inprocess_pipeline({"default": root}), queries[0]).ranking_model == description["id"]


def test_the_stage_costs_little(planted, trained):
    """The model's own work for 200 candidates, on one thread (the figure is in bench/README.md; this only
    guards against a model that could never meet it: far more trees than cross-validation may choose)."""
    root, _ = planted
    _, description = trained
    _, text = read_ranker(root, description["id"])
    booster = lightgbm.Booster(model_str=text)
    assert booster.num_trees() <= train_ranker.MAX_ROUNDS
    assert booster.predict(np.zeros((200, len(description["features"]))), num_threads=1).shape == (200,)


def test_the_compiled_trees_score_as_lightgbm(planted, trained, monkeypatch):
    """The served model scores with its trees compiled to native code: the same scores as LightGBM's ``predict`` on
    the candidates' real features and on rows with missing values (which the trees route on their own); where the
    trees cannot compile, the booster scores instead, the same."""
    import lleaves

    from deployments.search.learned import FeatureTable, RankingModel

    root, data = planted
    _, description = trained
    pipeline = inprocess_pipeline({"default": root})
    model = pipeline.models["default"]
    assert model.compiled is not None
    queries = [q["text"] for q in map(json.loads, (data / "queries.jsonl").read_text().splitlines())][:10]
    tables = [asyncio.run(pipeline.ranking_features(SearchRequest(query=t))) for t in queries]
    rng = np.random.default_rng(0)
    noisy = rng.normal(size=(300, len(model.features))) * 10
    noisy[rng.random(noisy.shape) < 0.3] = np.nan
    tables.append(FeatureTable([None] * 300, dict(zip(model.features, noisy.T, strict=True))))
    for table in tables:
        expect = model.booster.predict(table.matrix(model.features), num_threads=1)
        assert np.allclose(model.score(table), expect, rtol=0, atol=1e-9)
    _, text = read_ranker(root, description["id"])

    def broken(self, *args, **kwargs):
        raise RuntimeError("no LLVM here")

    monkeypatch.setattr(lleaves.Model, "compile", broken)
    fallback = RankingModel(description["id"], description["features"], text)
    assert fallback.compiled is None
    assert np.array_equal(fallback.score(tables[0]), model.booster.predict(tables[0].matrix(model.features),
                                                                            num_threads=1))


def test_a_model_trained_without_bm25_and_coverage_reads_no_postings(planted, tmp_path, monkeypatch):
    """``--without bm25 coverage`` trains on the other groups only, the planted rule is still learned, and served,
    the model's features are had without reading a posting: the shards' pass over the postings, made to fail, is
    never called, and the model still orders the search."""
    from deployments.search.learned import RankingModel
    from deployments.shard.lucene import FactsReader

    root, data = planted
    out = tmp_path / "no-postings"
    description = train(root, data, out, "--without", "bm25", "coverage", "--name", "no-postings")
    features = description["features"]
    assert "length" in features and not [f for f in features if f.startswith("bm25_") or f.endswith("_coverage")]
    assert description["validation"]["model_ndcg"] > description["validation"]["without_model_ndcg"] + 0.2
    with pytest.raises(SystemExit) as refused:
        train(root, data, tmp_path / "none", "--features", "length", "--without", "lengths")
    assert "leave no feature" in str(refused.value), refused.value
    pipeline = inprocess_pipeline({"default": root})
    pipeline.models["default"] = RankingModel(description["id"], features, (out / "model.txt").read_text())

    def read(self, *args, **kwargs):
        raise AssertionError("a model that reads no BM25 or coverage read the postings")

    monkeypatch.setattr(FactsReader, "read", read)
    text = json.loads((data / "queries.jsonl").read_text().splitlines()[0])["text"]
    response = search(pipeline, text)
    assert response.ranking_model == description["id"] and not response.warnings


def test_the_listing_says_what_each_model_reads_and_scored(planted, trained, capsys):
    root, _ = planted
    _, description = trained
    assert rankers.main(["list", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["MODEL", "FEATURES"] and lines[-1] == f"active: {active_ranker(root)}"
    line = next(line for line in lines if description["id"] in line)
    assert line.startswith("* ") == (active_ranker(root) == description["id"])
    row = line.removeprefix("* ").split()
    assert row[:4] == [description["id"], str(len(description["features"])), str(description["trees"]),
                       f"{description['cross_validation']['model_ndcg']:.4f}"]
    assert row[6] == "yes"  # it reads BM25 and coverage: the shards read postings for it
    from deployments.shard.features import reads_postings

    assert not reads_postings(["length", "dense", "dense_gap", "keyword_rank", "doc_chunks"])
    assert all(reads_postings(["length", f]) for f in ("bm25_title", "bm25_share", "term_coverage", "idf_coverage"))
