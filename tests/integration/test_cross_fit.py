"""A ranker cross-fitted over encoders trained on its own judgments (``train_encoder --leave-out-fold``,
``train_ranker --cross-fit``): each training query is searched with the named encoder that left it out, whose
cosine stands in for the version's own. Oracles: the encoder run here on the query and each chunk's contents,
brute force over them for the dense leg's best chunk."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from index_build.add_encoder import add_encoder
from index_build.build import build_index
from index_build.config import BuildConfig
from index_build.tables import contents_of
from index_format.encoders import resolve_model_path
from index_format.manifest import CHUNKS_FILE
from index_format.versions import read_version_manifest, resolve_version_dir
from relevance import train_ranker
from relevance.ranking_data import collect, cross_fit_encoders, open_pipeline
from relevance.training import beir_judgments, leave_out_fold
from relevance.tuning import fold_of
from tests.conftest import make_corpus, write_jsonl

PROMPTS = {"f0": "query: ", "f1": "find: "}  # two query prompts, so the two stand-ins' cosines differ


@pytest.fixture(scope="module")
def setup(ray_local, tmp_path_factory):
    """A 2-shard version (hashing encoder) holding f0 and f1: MiniLM folders whose training.json says each left
    out one fold of 2 of the BEIR folder's train queries, as ``train_encoder --leave-out-fold K/2`` writes it."""
    folder = tmp_path_factory.mktemp("crossfit")
    docs = make_corpus(40, seed=5)
    write_jsonl(folder / "corpus.jsonl", docs)
    write_jsonl(folder / "queries.jsonl", [{"_id": f"q{i}", "text": " ".join(d["text"].split()[:5])}
                                           for i, d in enumerate(docs)])
    (folder / "qrels").mkdir()
    (folder / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\t{docs[i]['_id']}\t1\n" for i in range(30)))
    root = folder / "index"
    build_index(BuildConfig(corpus=folder / "corpus.jsonl", out=root, shards=2, encoder="hashing:32",
                            chunk_size=40, chunk_overlap=8, progress=False))
    for k, name in enumerate(PROMPTS):
        model = folder / name
        shutil.copytree(resolve_model_path("all-MiniLM-L6-v2"), model)
        left_out = leave_out_fold(beir_judgments(folder, "train"), (k, 2)).left_out_ids
        (model / "training.json").write_text(json.dumps({"data": {"left_out_fold": [k, 2],
                                                                  "left_out_query_ids": left_out}}))
        add_encoder(root, name, str(model), query_prompt=PROMPTS[name], document_prompt="", progress=False)
    return folder, root


def test_folds_partition_the_training_queries(setup):
    folder, _ = setup
    judged = beir_judgments(folder, "train")
    parts = [leave_out_fold(beir_judgments(folder, "train"), (k, 2)) for k in (0, 1)]
    assert sorted(parts[0].left_out_ids + parts[1].left_out_ids) == sorted(judged.qrels)
    for k, part in enumerate(parts):
        assert part.left_out_ids and all(fold_of(q, 2) == k for q in part.left_out_ids)
        assert not set(part.left_out_ids) & set(part.qrels) and not set(part.left_out_ids) & set(part.queries)


def test_each_query_gets_the_encoder_that_left_it_out(setup):
    folder, root = setup
    qids = [f"q{i}" for i in range(30)]
    assert cross_fit_encoders(root, ["f0", "f1"], qids) == {q: f"f{fold_of(q, 2)}" for q in qids}
    with pytest.raises(SystemExit, match="left out by none"):
        cross_fit_encoders(root, ["f0"], qids)  # fold 1's queries have no encoder that never saw them
    with pytest.raises(SystemExit, match="holds no encoder"):
        cross_fit_encoders(root, ["f0", "nope"], qids)


def test_the_stand_ins_cosine_and_leg_are_the_encoders_own(setup):
    from sentence_transformers import SentenceTransformer

    folder, root = setup
    version = resolve_version_dir(root)
    ids, contents = [], []
    for shard in read_version_manifest(version).shards:
        table = pq.read_table(version / "shards" / shard / CHUNKS_FILE)
        ids += table["chunk_id"].to_pylist()
        contents += contents_of(table, True)
    model = SentenceTransformer(resolve_model_path("all-MiniLM-L6-v2"), device="cpu")
    chunks = dict(zip(ids, model.encode(contents, normalize_embeddings=True), strict=True))
    queries = {f"q{i}": json.loads(line)["text"]
               for i, line in enumerate((folder / "queries.jsonl").read_text().splitlines()[:8])}
    stand_in = cross_fit_encoders(root, ["f0", "f1"], queries)
    assert set(stand_in.values()) == {"f0", "f1"}  # both folds among these queries
    data = collect(open_pipeline(root, 50), queries, {}, None, stand_in)
    for q in data:
        prompt = PROMPTS[stand_in[q.query_id]]
        vector = model.encode([prompt + q.text], normalize_embeddings=True)[0]
        oracle = np.array([chunks[c] @ vector for c in q.chunk_ids])
        assert np.allclose(q.columns["dense"], oracle, atol=1e-4)
        assert np.allclose(q.columns["dense_gap"], oracle.max() - oracle, atol=1e-4)
        assert not {"dense_f0", "dense_f1", "dense_gap_f0", "dense_gap_f1"} & set(q.columns)
        best = max(ids, key=lambda c: chunks[c] @ vector)  # brute force over every chunk
        assert best in q.chunk_ids and q.columns["dense_rank"][q.chunk_ids.index(best)] == 1
    # Without a stand-in the cosine is the version's own encoder's (hashing), not MiniLM's.
    plain = collect(open_pipeline(root, 50), queries, {})
    assert not np.allclose(plain[0].columns["dense"], data[0].columns["dense"], atol=1e-3)


def test_train_ranker_cross_fits_and_its_comparison_does_too(setup, tmp_path):
    from relevance.rankers import compare

    folder, root = setup
    out = tmp_path / "model"
    code = train_ranker.main(["--index", str(root), "--data", str(folder), "--out", str(out), "--folds", "3",
                              "--validation-share", "0.25", "--cross-fit", "f0", "f1", "--no-progress", "--publish"])
    assert code == 0
    description = json.loads((out / "ranker.json").read_text())
    assert description["cross_fit"] == ["f0", "f1"]
    assert "dense" in description["features"]
    assert not any(n.endswith(("_f0", "_f1")) for n in description["features"])
    got = compare(root, description["id"])  # the activation's comparison, features cross-fitted as in training
    assert got["model_ndcg"] == description["validation"]["model_ndcg"]
    assert got["served_ndcg"] == description["validation"]["without_model_ndcg"]
