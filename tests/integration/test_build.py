"""The build job through real Ray, FAISS and Lucene, checked against independent computations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import faiss
import numpy as np
import pyarrow.parquet as pq
import pytest

from index_build.build import CRASH_ENV, build_index
from index_build.config import BuildConfig
from index_build.corpus import CorpusError
from index_format.bm25_stats import read_stats
from index_format.encoders import HashingEncoder
from index_format.lucene import build_lucene_index, index_statistics, write_collection
from index_format.manifest import IndexMismatch, verify_shard
from index_format.sharding import shard_name
from index_format.versions import active_version, list_versions, read_version_manifest
from tests.conftest import make_corpus, write_jsonl
from tests.integration.conftest import ENCODER, oracle_chunks, run_killed, shard_dirs


def test_summary_counts_and_bad_records(built, corpus):
    path, docs = corpus
    cfg, summary = built[3]
    assert summary.docs == 60 and summary.shards == 3 and summary.reused_shards == 0
    assert summary.chunks == len(oracle_chunks(docs, cfg))
    assert [(r.line, r.reason.split(" ")[0]) for r in summary.bad_records] == [
        (11, "malformed"), (12, "missing"), (63, "duplicate")
    ]
    text = summary.render()
    assert "documents      60" in text and "3 skipped" in text and f"{path}:11: malformed JSON" in text
    listed = (summary.version_dir / "bad_records.jsonl").read_text().splitlines()
    assert len(listed) == 3
    manifest = read_version_manifest(summary.version_dir)
    assert manifest.counts == {"docs": 60, "chunks": summary.chunks, "bad_records": 3}
    assert active_version(cfg.out) == summary.version and list_versions(cfg.out) == [summary.version]


def test_every_chunk_lands_in_exactly_one_shard_with_its_trace(built, corpus):
    path, docs = corpus
    cfg, summary = built[3]
    by_id = {c.chunk_id: c for c in oracle_chunks(docs, cfg)}
    seen = []
    sizes = []
    for folder in shard_dirs(summary):
        rows = pq.read_table(folder / "chunks.parquet").to_pylist()
        sizes.append(len(rows))
        for r in rows:
            c = by_id[r["chunk_id"]]
            assert (r["doc_id"], r["chunk_index"], r["char_start"], r["char_end"], r["text"]) == (
                c.doc_id, c.chunk_index, c.char_start, c.char_end, c.text)
            assert json.loads(r["metadata_json"]) == c.metadata
            i = int(c.doc_id[1:])  # d007 is record 7; two bad lines were inserted before record 10
            assert r["source"] == f"{path}:{i + 1 if i < 10 else i + 3}"
            seen.append(r["chunk_id"])
    assert sorted(seen) == sorted(by_id)  # all chunks, once
    # ... in the shard their document's id hashes to (the oracle: sharding's own function over the documents).
    from index_format.sharding import shard_of

    expected = [sum(1 for c in by_id.values() if shard_of(c.doc_id, len(sizes)) == s) for s in range(len(sizes))]
    assert sizes == expected
    # a document's chunks never straddle shards
    doc_shard = {}
    for i, folder in enumerate(shard_dirs(summary)):
        for d in pq.read_table(folder / "chunks.parquet")["doc_id"].to_pylist():
            assert doc_shard.setdefault(d, i) == i


def test_sharded_dense_search_equals_one_flat_index(built, corpus):
    """Per-shard FAISS top-k merged by score == brute force over every chunk (ties allowed)."""
    _, docs = corpus
    cfg, summary = built[3]
    chunks = oracle_chunks(docs, cfg)
    encoder = HashingEncoder(64)
    all_vectors = encoder.encode([c.contents(True) for c in chunks])
    ids = np.array([c.chunk_id for c in chunks])
    queries = encoder.encode(["telescope galaxy orbit", "bread oven", "lucene shard replica commit", "violin"])
    k = 10
    brute = queries @ all_vectors.T
    shards = [(faiss.read_index(str(f / "dense.faiss")), pq.read_table(f / "chunks.parquet")["chunk_id"].to_pylist())
              for f in shard_dirs(summary)]
    for qi, q in enumerate(queries):
        merged = []
        for index, chunk_ids in shards:
            scores, rows = index.search(q[None, :], k)
            merged += [(float(s), chunk_ids[r]) for s, r in zip(scores[0], rows[0], strict=True) if r >= 0]
        merged.sort(key=lambda t: (-t[0], t[1]))
        top = merged[:k]
        expected = np.sort(brute[qi])[::-1][:k]
        assert np.allclose([s for s, _ in top], expected, atol=1e-5)
        score_of = dict(zip(ids, brute[qi], strict=True))
        assert all(abs(score_of[cid] - s) < 1e-5 for s, cid in top)


def test_lucene_shards_hold_every_chunk_once(built):
    from index_format.lucene import boot

    boot()
    from pyserini.index.lucene import LuceneIndexReader

    cfg, summary = built[3]
    in_lucene, in_tables = [], []
    for folder in shard_dirs(summary):
        reader = LuceneIndexReader(str(folder / "lucene"))
        n = reader.stats()["documents"]
        in_lucene += [reader.convert_internal_docid_to_collection_docid(i) for i in range(n)]
        in_tables += pq.read_table(folder / "chunks.parquet")["chunk_id"].to_pylist()
    assert len(in_lucene) == len(set(in_lucene)) and sorted(in_lucene) == sorted(in_tables)


def test_global_bm25_statistics_equal_one_unsharded_lucene_index(built, tmp_path):
    cfg, summary = built[3]
    rows = []
    for folder in shard_dirs(summary):
        t = pq.read_table(folder / "chunks.parquet")
        rows += [(cid, f"{title}\n{text}" if text else title) for cid, title, text in
                 zip(t["chunk_id"].to_pylist(), t["title"].to_pylist(), t["text"].to_pylist(), strict=True)]
    write_collection(rows, tmp_path / "coll")
    build_lucene_index(tmp_path / "coll", tmp_path / "one")
    one_stats, one_terms = index_statistics(tmp_path / "one")
    stats, terms = read_stats(summary.version_dir / "bm25")
    assert (stats.doc_count, stats.total_terms, stats.documents) == (
        one_stats["non_empty_documents"], one_stats["total_terms"], one_stats["documents"])
    assert terms.sort_by("term").equals(one_terms.sort_by("term"))
    # and the one-shard build already is that single index
    _, one_shard = built[1]
    s1, t1 = read_stats(one_shard.version_dir / "bm25")
    assert (s1.doc_count, s1.total_terms) == (stats.doc_count, stats.total_terms) and t1.equals(terms)


def test_an_index_built_in_this_processs_jvm_equals_one_built_by_a_jvm_of_its_own(tmp_path, monkeypatch):
    """A shard's Lucene index is built in the process's JVM (no second JVM to start); where that JVM has less heap
    than asked, by a JVM of its own. Both give the same index: statistics, terms, a field's, and answers."""
    from index_format import lucene

    lucene.boot()  # this project's JVM before pyserini's import starts another
    from pyserini.search.lucene import LuceneSearcher

    docs = make_corpus(120)
    write_collection([(d["_id"], f"{d['title']}\n{d['text']}", {"title": d["title"]}) for d in docs], tmp_path / "c")
    lucene.build_lucene_index(tmp_path / "c", tmp_path / "here", fields=["title"])
    assert lucene._jvm_holds("1g") and not lucene._jvm_holds("64g")  # 64g: a JVM of its own
    monkeypatch.setattr(lucene, "_jvm_holds", lambda heap: False)
    lucene.build_lucene_index(tmp_path / "c", tmp_path / "own", fields=["title"])
    monkeypatch.undo()
    assert index_statistics(tmp_path / "here") == index_statistics(tmp_path / "own")
    assert lucene.field_statistics(tmp_path / "here", "title") == lucene.field_statistics(tmp_path / "own", "title")
    for query in ("telescope galaxy", "bread oven butter"):
        here, own = LuceneSearcher(str(tmp_path / "here")), LuceneSearcher(str(tmp_path / "own"))
        assert [(h.docid, h.score) for h in here.search(query, 10)] == [(h.docid, h.score) for h in own.search(query, 10)]
    with pytest.raises(RuntimeError, match="Invalid collection path"):
        lucene.build_lucene_index(tmp_path / "missing", tmp_path / "none")


def test_manifests_describe_the_shard_and_mismatches_are_refused(built, tmp_path):
    cfg, summary = built[3]
    folder = shard_dirs(summary)[0]
    m = verify_shard(folder, expect={"encoder": ENCODER, "dimension": 64})
    assert m.counts["chunks"] == m.counts["faiss_vectors"] == m.counts["lucene_docs"]
    assert m.faiss["class"] == "IndexFlatIP" and m.metric == "inner_product" and m.build_config["chunk_size"] == 40
    assert "dense.faiss" in m.checksums and any(k.startswith("lucene/") for k in m.checksums)
    with pytest.raises(IndexMismatch, match="manifest says encoder='hashing:64' but 'all-MiniLM-L6-v2' is required"):
        verify_shard(folder, expect={"encoder": "all-MiniLM-L6-v2"})
    copy = tmp_path / "shard"
    shutil.copytree(folder, copy)
    with open(copy / "dense.faiss", "ab") as f:
        f.write(b"\0")
    with pytest.raises(IndexMismatch, match=r"changed since build \['dense.faiss'\]"):
        verify_shard(copy)
    (copy / "manifest.json").unlink()
    with pytest.raises(IndexMismatch, match="incomplete"):
        verify_shard(copy)
    out = subprocess.run([sys.executable, "-m", "index_build.versions", "verify", str(cfg.out)],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "3 shards verified" in out.stdout


def test_strict_mode_stops_at_the_first_bad_record(corpus, tmp_path):
    path, _ = corpus
    cfg = BuildConfig(corpus=path, out=tmp_path, shards=2, encoder=ENCODER, strict=True, progress=False)
    with pytest.raises(CorpusError, match=rf"{path}:11: malformed JSON.*strict mode"):
        build_index(cfg)
    assert list_versions(tmp_path) == []


def test_killed_build_resumes_and_ends_with_the_same_result(corpus, built, tmp_path):
    path, _ = corpus
    cfg, clean = built[3]
    argv = [sys.executable, "-m", "index_build", "--corpus", str(path), "--out", str(tmp_path), "--shards", "3",
            "--encoder", ENCODER, "--chunk-size", "40", "--chunk-overlap", "8", "--no-progress"]
    env = dict(os.environ, **{CRASH_ENV: "1"})
    first = run_killed(argv, env)
    assert first.returncode == 137, first.stdout + first.stderr
    staged = list((tmp_path / "staging").glob("*/shards/*/manifest.json"))
    assert len(staged) == 1 and list_versions(tmp_path) == []
    second = subprocess.run(argv, capture_output=True, text=True)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "(1 reused from an interrupted build)" in second.stdout, second.stdout + second.stderr
    resumed = read_version_manifest(tmp_path / "versions" / list_versions(tmp_path)[0])
    assert resumed.counts == read_version_manifest(clean.version_dir).counts
    assert resumed.bm25 == read_version_manifest(clean.version_dir).bm25
    for a, b in zip(sorted((tmp_path / "versions").glob("*/shards/*")), shard_dirs(clean), strict=True):
        assert pq.read_table(a / "chunks.parquet").equals(pq.read_table(b / "chunks.parquet"))
        assert np.array_equal(np.load(a / "embeddings.npy"), np.load(b / "embeddings.npy"))
    assert not any((tmp_path / "staging").iterdir())


def test_a_fragment_lost_on_the_way_fails_the_build_naming_its_shard(corpus, ray_local, tmp_path, monkeypatch):
    """The driver sums what the read tasks gave each shard: a shard assembled from less (its one fragment's
    reference dropped, as a lost object would be) fails the build, naming the shard and both counts; nothing is
    published."""
    import index_build.build as build

    path, _ = corpus
    given = build._shard_fragments
    monkeypatch.setattr(build, "_shard_fragments", lambda fragments, shard: given(fragments, shard)[1:]
                        if shard == 1 else given(fragments, shard))
    cfg = BuildConfig(corpus=path, out=tmp_path, shards=3, encoder=ENCODER, chunk_size=40, chunk_overlap=8,
                      progress=False, reuse=False)
    with pytest.raises(IndexMismatch, match=rf"{shard_name(1)}: the read tasks gave it [1-9]\d* documents and "
                                            r"[1-9]\d* chunks, it was assembled from 0 and 0"):
        build_index(cfg)
    assert list_versions(tmp_path) == []


def test_parquet_input_with_hnsw(ray_local, tmp_path):
    import pyarrow as pa

    docs = make_corpus(30, seed=3)
    table = pa.table({"id": [d["_id"] for d in docs], "title": [d["title"] for d in docs],
                      "text": [d["text"] for d in docs], "topic": [d["metadata"]["topic"] for d in docs]})
    pq.write_table(table, tmp_path / "corpus.parquet")
    cfg = BuildConfig(corpus=tmp_path / "corpus.parquet", out=tmp_path / "idx", shards=2, encoder=ENCODER,
                      faiss_index="hnsw", progress=False)
    summary = build_index(cfg)
    assert summary.docs == 30 and not summary.bad_records
    for folder in shard_dirs(summary):
        m = verify_shard(folder)
        assert m.faiss["class"] == "IndexHNSWFlat" and m.faiss["hnsw_m"] == 32
        row = pq.read_table(folder / "chunks.parquet").slice(0, 1).to_pylist()[0]
        assert set(json.loads(row["metadata_json"])) == {"topic"}


def test_compressed_vectors_rescored_from_disk_answer_as_exact_search_does(ray_local, tmp_path):
    """``--faiss-index ivf_rabitq``: each shard holds RaBitQ codes, and the dense leg, its candidates rescored with
    the stored vectors (memory-mapped), answers the exact top-10 (``ann: {exact: true}``, a scan of the stored
    vectors) for nearly every query, with exact scores; a filter keeps working inside the shard. The hashing
    encoder's vectors are the hard case for codes (a query's top-10 lie within a few hundredths of cosine of the
    rest): 4 bits at the default 4x oversampling found 0.83 of the exact top-10 here, at 16x all but a few."""
    from deployments.search.inprocess import LocalIndex

    docs = make_corpus(900, seed=11)
    path = write_jsonl(tmp_path / "corpus.jsonl", docs)
    summary = build_index(BuildConfig(corpus=path, out=tmp_path / "idx", shards=2, encoder="hashing:384",
                                      chunk_size=40, chunk_overlap=8, faiss_index="ivf_rabitq", progress=False))
    for folder in shard_dirs(summary):
        m = verify_shard(folder)
        assert m.faiss["class"] == "IndexIVFRaBitQ" and m.faiss["refine"] == 4, m.faiss
        assert m.faiss["bytes_per_vector"] < 384 * 4 / 4  # codes (and, this small, the lists' centroids)
    index = LocalIndex(summary.version_dir)
    assert all(isinstance(s.dense.vectors, np.ndarray) and not s.dense.vectors.flags.owndata for s in index.shards)
    recalls = []
    for doc in docs[:40]:
        query = " ".join(doc["text"].split()[:6])
        exact = index.dense(query, 10, ann={"exact": True})
        got = index.dense(query, 10, ann={"nprobe": 10_000, "refine": 16})
        recalls.append(len({h.chunk_id for h in got} & {h.chunk_id for h in exact}) / len(exact))
        truth = {h.chunk_id: h.score for h in exact}
        for h in got:
            if h.chunk_id in truth:
                assert abs(h.score - truth[h.chunk_id]) < 1e-5
    assert np.mean(recalls) >= 0.95, recalls
    first = index.shards[0]
    allowed = np.arange(0, first.chunks, 3)
    rows, _ = first.dense_leg(index.embed([docs[0]["text"]])[0], 10, allowed)
    assert len(rows) == 10 and set(rows.tolist()) <= set(allowed.tolist())


def test_real_encoder_vectors_equal_direct_sentence_transformers(ray_local, tmp_path):
    from sentence_transformers import SentenceTransformer

    from index_format.encoders import resolve_model_path

    docs = make_corpus(12, seed=5)
    path = write_jsonl(tmp_path / "corpus.jsonl", docs)
    cfg = BuildConfig(corpus=path, out=tmp_path / "idx", shards=2, chunk_size=64, chunk_overlap=16, progress=False)
    summary = build_index(cfg)
    model = SentenceTransformer(resolve_model_path("all-MiniLM-L6-v2"), device="cpu")
    for folder in shard_dirs(summary):
        t = pq.read_table(folder / "chunks.parquet")
        contents = [f"{a}\n{b}" for a, b in zip(t["title"].to_pylist(), t["text"].to_pylist(), strict=True)]
        expected = model.encode(contents, normalize_embeddings=True)
        got = np.load(folder / "embeddings.npy")
        assert got.shape == (t.num_rows, 384)
        assert np.allclose(got, expected, atol=1e-5)
        assert verify_shard(folder).encoder == "all-MiniLM-L6-v2"


def _strace_works() -> bool:
    """strace is installed and may trace here (a container can forbid ptrace)."""
    if shutil.which("strace") is None:
        return False
    return subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat", "-o", os.devnull, "true"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _strace_works(), reason="needs strace, allowed to trace (apt-get install strace)")
def test_the_driver_never_opens_a_shards_vectors_chunk_texts_or_fragments(corpus, built, ray_local, tmp_path):
    """The build's driver, joined to a running cluster (so Ray's workers are not its children) and traced
    with strace: it never opens the corpus (Ray Data's tasks scan and read it), a file holding documents, chunks or
    vectors of a shard, or the read's fragments. The version equals the one the in-process build gave."""
    path, _ = corpus
    trace = tmp_path / "opens.trace"
    argv = ["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", str(trace), sys.executable, "-m",
            "index_build", "--corpus", str(path), "--out", str(tmp_path / "idx"), "--shards", "3", "--encoder", ENCODER,
            "--chunk-size", "40", "--chunk-overlap", "8", "--no-progress", "--no-reuse"]
    env = dict(os.environ, RAY_ADDRESS=ray_local.get_runtime_context().gcs_address)
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    opened = [line for line in trace.read_text().splitlines() if "open" in line and "ENOENT" not in line]
    forbidden = [line for line in opened if any(name in line for name in (
        "chunks.parquet", "documents.parquet", "embeddings.npy", "dense.faiss", "/fragments/", "todo.parquet",
        "embedded-", "reused.npy", "terms.parquet"))]
    assert forbidden == []
    assert not any(f'"{path}"' in line for line in opened)
    assert any("manifest.json" in line for line in opened)  # the trace sees the driver's own opens
    version = tmp_path / "idx" / "versions" / list_versions(tmp_path / "idx")[0]
    _, clean = built[3]
    for a, b in zip(sorted((version / "shards").iterdir()), shard_dirs(clean), strict=True):
        assert pq.read_table(a / "chunks.parquet").equals(pq.read_table(b / "chunks.parquet"))
        assert np.array_equal(np.load(a / "embeddings.npy"), np.load(b / "embeddings.npy"))

