"""Training from judgments, end to end on a tiny BEIR folder: pairs with hard negatives mined from the index's
hybrid candidates, the held-out split kept out, a folder index_build and the service take as they are,
and a run that was stopped resumes from its checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest

from index_build.build import build_index
from index_build.config import BuildConfig
from relevance.training import beir_judgments, mine_negatives, positive_pairs, read_corpus
from tests.conftest import make_corpus, write_jsonl


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    """40 documents; train queries are words of a document's title topic, each judging that document; two
    train queries are judged in test as well (they must be dropped)."""
    folder = tmp_path_factory.mktemp("beir")
    docs = make_corpus(40, seed=5)
    write_jsonl(folder / "corpus.jsonl", docs)
    queries = [{"_id": f"q{i}", "text": " ".join(d["text"].split()[:6])} for i, d in enumerate(docs)]
    write_jsonl(folder / "queries.jsonl", queries)
    (folder / "qrels").mkdir()
    train = [f"q{i}\t{docs[i]['_id']}\t1" for i in range(24)]
    test = [f"q{i}\t{docs[i]['_id']}\t1" for i in (0, 1, *range(30, 36))]
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(train) + "\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(test) + "\n")
    return folder


@pytest.fixture(scope="module")
def index(beir, ray_local, tmp_path_factory):
    cfg = BuildConfig(corpus=beir / "corpus.jsonl", out=tmp_path_factory.mktemp("train-index"), shards=2,
                      encoder="hashing:32", progress=False)
    return build_index(cfg).version_dir


def test_pairs_hold_out_the_test_queries_and_negatives_are_not_relevant(beir, index):
    judged = beir_judgments(beir, "train", "test")
    assert judged.held_out_queries == 2 and not {"q0", "q1"} & set(judged.qrels) and len(judged.qrels) == 22
    corpus = read_corpus(beir / "corpus.jsonl")
    pairs = mine_negatives(positive_pairs(judged, corpus), index, corpus, judged, depth=10)
    assert len(pairs) == 22 and all(p.negative_id for p in pairs)
    for p in pairs:
        assert p.negative_id not in judged.qrels[p.query_id] and p.doc_text == corpus[p.doc_id]


def test_several_hard_negatives_are_the_next_best_misses_each_in_its_own_column(beir, index):
    from relevance.training import training_rows

    judged = beir_judgments(beir, "train", "test")
    corpus = read_corpus(beir / "corpus.jsonl")
    positives = positive_pairs(judged, corpus)
    one = mine_negatives(positives, index, corpus, judged, depth=10)
    three = mine_negatives(positives, index, corpus, judged, depth=10, count=3)
    for a, b in zip(one, three, strict=True):
        ids = [b.negative_id, *(d for d, _ in b.more_negatives)]
        assert ids[0] == a.negative_id and len(ids) == len(set(ids)) == 3  # the first is the one of count=1
        assert not set(ids) & set(judged.qrels[b.query_id])
        assert b.negatives == [corpus[d] for d in ids]
    rows = training_rows(three, 3)
    assert list(rows) == ["anchor", "positive", "negative_1", "negative_2", "negative_3"]
    assert rows["negative_3"] == [p.negatives[2] for p in three]
    assert list(training_rows(one, 1)) == ["anchor", "positive", "negative"]
    assert list(training_rows(one, 3)) == ["anchor", "positive"]  # too few negatives: in-batch ones only


# `make test-slow` (about 40 s): training on CPU; the suite keeps under its 20 minutes with the multi-node tests
@pytest.mark.slow
def test_train_encoder_writes_a_model_index_build_uses_and_resumes(beir, index, tmp_path):
    from sentence_transformers import SentenceTransformer

    from deployments.search.inprocess import LocalIndex
    from index_format.encoders import resolve_model_path
    from relevance import train_encoder

    out = tmp_path / "encoder"
    argv = ["--data", str(beir), "--train-split", "train", "--index", str(index), "--out", str(out), "--epochs", "2",
            "--batch-size", "8", "--save-steps", "2", "--no-progress", "--lr", "5e-5"]
    from transformers import TrainerCallback

    class Interrupt(TrainerCallback):  # Ctrl-C at step 3, after the step-2 checkpoint was written
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_encoder.main(argv, callbacks=[Interrupt()])
    assert train_encoder.last_checkpoint(out / "checkpoints").endswith("checkpoint-2")
    assert not (out / "training.json").exists()
    assert train_encoder.main(argv) == 0
    record = json.loads((out / "training.json").read_text())
    assert record["resumed_from"] and record["data"]["held_out"] == "qrels/test.tsv"
    assert record["data"]["held_out_queries_dropped"] == 2 and record["examples"] == 22 and record["hard_negatives"]
    assert not (out / "checkpoints").exists()
    trained, base = SentenceTransformer(str(out)), SentenceTransformer(resolve_model_path("all-MiniLM-L6-v2"))
    text = ["telescope galaxy orbit"]
    assert not np.allclose(trained.encode(text), base.encode(text), atol=1e-4)  # it learned something

    # The folder is an encoder like any other: a version built with it, queries embedded with it.
    version = build_index(BuildConfig(corpus=beir / "corpus.jsonl", out=tmp_path / "tuned-index", shards=1,
                                      encoder=str(out), progress=False)).version_dir
    local = LocalIndex(version)
    assert local.encoder.name == str(out)
    hits = local.dense("telescope galaxy orbit", 3)
    assert len(hits) == 3


def test_train_reranker_writes_a_cross_encoder_the_reranker_serves(beir, index, tmp_path):
    from deployments.search.reranking import CrossEncoderScorer
    from relevance import train_reranker

    out = tmp_path / "reranker"
    assert train_reranker.main(["--data", str(beir), "--train-split", "train", "--index", str(index), "--out", str(out),
                                "--batch-size", "8", "--no-progress", "--max-length", "64", "--lr", "1e-4"]) == 0
    record = json.loads((out / "training.json").read_text())
    assert record["kind"] == "reranker" and record["examples"] == 22 and record["data"]["held_out"] == "qrels/test.tsv"
    scorer = CrossEncoderScorer(str(out), device="cpu", max_length=64)  # what --reranker.model DIR loads
    scores = scorer.score([("telescope galaxy", "a telescope sees a far galaxy"), ("telescope galaxy", "bread")]).tolist()
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores) and scores[0] != scores[1]


def test_a_collection_with_one_split_holds_out_a_stable_share_of_its_queries(beir):
    judged = beir_judgments(beir, "test", held_out_share=0.5)
    again = beir_judgments(beir, "test", held_out_share=0.5)
    assert judged.held_out_ids == again.held_out_ids and judged.held_out_ids  # stable
    assert not set(judged.held_out_ids) & set(judged.qrels)  # never trained on
    assert set(judged.held_out_ids) | set(judged.qrels) == {f"q{i}" for i in (0, 1, *range(30, 36))}
    assert judged.held_out.startswith("50% of qrels/test.tsv")
