"""Incremental reindexing: a build into a root with earlier versions reuses what did not change, and gives
the version a full build of the same corpus gives (the oracle: a build of the same corpus with reuse off,
into another root). Real Ray, FAISS and Lucene; the hashing encoder, so vectors are exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from deployments.search.inprocess import LocalIndex
from index_build.build import build_index
from index_build.config import BuildConfig
from index_format.bm25_stats import read_stats
from index_format.manifest import CHUNKS_FILE, EMBEDDINGS_FILE, verify_shard
from index_format.versions import active_version, read_version_manifest
from tests.conftest import make_corpus, write_jsonl
from tests.integration.conftest import ENCODER, oracle_chunks, run_killed

QUERIES = ["telescope galaxy", "bread oven butter", "boat wind anchor", "piano chord", "lucene shard replica", "the"]
OPTIONS = {"encoder": ENCODER, "chunk_size": 40, "chunk_overlap": 8, "shards": 2, "progress": False}


def _changed(docs: list[dict]) -> list[dict]:
    """3 documents edited, 1 deleted, 2 added."""
    out = [dict(d) for d in docs if d["_id"] != "d005"]
    for d in out:
        if d["_id"] in ("d001", "d017", "d030"):
            d["text"] = d["text"] + " edited with a new sentence about lucene"
    out += [{"_id": "n001", "title": "new note", "text": "a telescope saw a galaxy", "metadata": {"topic": "space"}},
            {"_id": "n002", "title": "another", "text": "bread and butter in the oven " * 20, "metadata": {}}]
    return out


def _shard_rows(version_dir):
    """Per shard: chunk ids, the table's rows and the stored vectors."""
    out = []
    for shard in read_version_manifest(version_dir).shards:
        folder = version_dir / "shards" / shard
        out.append((pq.read_table(folder / CHUNKS_FILE).drop(["source"]), np.load(folder / EMBEDDINGS_FILE)))
    return out


def _assert_same_version(a, b):
    for (ta, va), (tb, vb) in zip(_shard_rows(a), _shard_rows(b), strict=True):
        assert ta.equals(tb)
        np.testing.assert_allclose(va, vb, atol=1e-6)
    assert read_stats(a / "bm25")[0] == read_stats(b / "bm25")[0]
    assert read_stats(a / "bm25")[1].equals(read_stats(b / "bm25")[1])
    ia, ib = LocalIndex(a), LocalIndex(b)
    for q in QUERIES:
        assert [(h.chunk_id, round(h.score, 5)) for h in ia.bm25(q, 20)] == \
               [(h.chunk_id, round(h.score, 5)) for h in ib.bm25(q, 20)]
        vector = ia.embed([q])
        assert [h.chunk_id for h in ia.dense(vector, 20)] == [h.chunk_id for h in ib.dense(vector, 20)]


@pytest.fixture(scope="module")
def versions(ray_local, tmp_path_factory):
    folder = tmp_path_factory.mktemp("incremental")
    docs = make_corpus(40)
    changed = _changed(docs)
    first = write_jsonl(folder / "v1.jsonl", docs)
    second = write_jsonl(folder / "v2.jsonl", changed)
    root = folder / "index"
    v1 = build_index(BuildConfig(corpus=first, out=root, version="v1", **OPTIONS))
    v2 = build_index(BuildConfig(corpus=second, out=root, version="v2", **OPTIONS))
    again = build_index(BuildConfig(corpus=second, out=root, version="v2-again", **OPTIONS))
    full = build_index(BuildConfig(corpus=second, out=folder / "full", version="full", reuse=False, **OPTIONS))
    return {"root": root, "docs": docs, "changed": changed, "v1": v1, "v2": v2, "again": again, "full": full,
            "second": second}


def test_an_incremental_version_equals_a_full_build(versions):
    _assert_same_version(versions["v2"].version_dir, versions["full"].version_dir)
    assert versions["v2"].chunks == versions["full"].chunks and versions["v2"].docs == versions["full"].docs == 41
    assert active_version(versions["root"]) == "v2-again"


def test_only_new_or_changed_chunks_are_embedded(versions):
    cfg = BuildConfig(corpus=versions["second"], out=versions["root"], **OPTIONS)
    before = {c.contents(True) for c in oracle_chunks(versions["docs"], cfg)}
    after = oracle_chunks(versions["changed"], cfg)
    new = sum(c.contents(True) not in before for c in after)
    assert 0 < new < len(after) / 4
    reuse = versions["v2"].reuse
    assert reuse["chunks_embedded"] == new and reuse["chunks_reused"] == len(after) - new
    assert reuse["reused_from"] == {"v1": len(after) - new} and reuse["from"] == ["v1"]
    assert read_version_manifest(versions["v2"].version_dir).reuse == reuse
    assert f"embedded       {new:,} chunks   reused {len(after) - new:,} ({len(after) - new:,} from v1)" in \
        versions["v2"].render()


def test_an_unchanged_corpus_links_every_shard_and_embeds_nothing(versions):
    again = versions["again"]
    assert again.reuse["chunks_embedded"] == 0 and again.reuse["shards_linked"] == {"0": "v2", "1": "v2"}
    _assert_same_version(again.version_dir, versions["full"].version_dir)
    for shard in read_version_manifest(again.version_dir).shards:
        folder = again.version_dir / "shards" / shard
        verify_shard(folder)
        # Linked, not copied: versions are immutable, so they share the bytes.
        assert (folder / EMBEDDINGS_FILE).stat().st_ino == \
            (versions["v2"].version_dir / "shards" / shard / EMBEDDINGS_FILE).stat().st_ino


@pytest.mark.parametrize("change", [{"chunk_size": 30}, {"encoder": "hashing:32"}])
def test_changed_chunking_or_encoder_embeds_everything(versions, change):
    summary = build_index(BuildConfig(corpus=versions["second"], out=versions["root"], activate=False,
                                      **(OPTIONS | change)))
    assert summary.reuse["from"] == [] and summary.reuse["shards_linked"] == {}  # no version qualifies
    assert summary.reuse["chunks_reused"] == 0 and summary.reuse["chunks_embedded"] == summary.chunks


def test_no_reuse_embeds_everything_and_records_no_reuse(versions):
    summary = build_index(BuildConfig(corpus=versions["second"], out=versions["root"], activate=False,
                                      reuse=False, **OPTIONS))
    assert summary.reuse == {} and read_version_manifest(summary.version_dir).reuse is None
    assert "embedded" not in summary.render()
    _assert_same_version(summary.version_dir, versions["full"].version_dir)


def test_a_delta_applied_to_a_version_equals_the_full_corpus(versions, tmp_path):
    """--changes (3 edited, 2 new) and --deletes (1) on v1 give what the changed corpus gives built whole."""
    by_id = {d["_id"]: d for d in versions["docs"]}
    changed = [d for d in versions["changed"] if d["_id"] not in by_id or d != by_id[d["_id"]]]
    assert len(changed) == 5
    changes = write_jsonl(tmp_path / "changes.jsonl", changed + ["{torn", {"_id": "n001", "text": "a duplicate"}])
    deletes = tmp_path / "deletes.txt"
    deletes.write_text('d005\n{"_id": "no-such-doc"}\n\n')
    summary = build_index(BuildConfig(changes=changes, deletes=deletes, base="v1", out=versions["root"],
                                      version="v1-delta", activate=False, **OPTIONS))
    _assert_same_version(summary.version_dir, versions["full"].version_dir)
    assert summary.delta == {"base": "v1", "replaced": 3, "added": 2, "deleted": 1}
    assert [r.reason.split(" ")[0] for r in summary.bad_records] == ["malformed", "duplicate", "no"]
    assert "delta          on v1: 3 replaced, 2 added, 1 deleted" in summary.render()
    assert summary.reuse["chunks_embedded"] == 0  # v2 (the same corpus, built whole) already holds every text
    manifest = read_version_manifest(summary.version_dir)
    assert manifest.corpus["format"] == "delta" and manifest.corpus["delta"]["base"] == "v1"


def test_a_delta_needs_a_base_that_stores_its_documents(versions, tmp_path):
    from index_format.manifest import IndexMismatch

    changes = write_jsonl(tmp_path / "changes.jsonl", versions["changed"][:1])
    with pytest.raises(IndexMismatch, match="no version 'v9'"):
        build_index(BuildConfig(changes=changes, base="v9", out=versions["root"], **OPTIONS))
    with pytest.raises(ValueError, match="either --corpus or --changes"):
        BuildConfig(corpus=changes, changes=changes, out=versions["root"], **OPTIONS)
    with pytest.raises(ValueError, match="give --corpus"):
        BuildConfig(out=versions["root"], **OPTIONS)


def test_a_folder_or_glob_of_files_is_read_in_parallel_as_one_corpus(ray_local, tmp_path):
    """Three files (two JSONL, one Parquet) read by parallel Ray tasks equal the same records in one file;
    an id repeated in a later file and a torn line are reported, not dropped or kept twice."""
    import pyarrow as pa

    docs = make_corpus(30)
    parts = tmp_path / "parts"
    write_jsonl(parts / "a.jsonl", docs[:10] + ["{torn"])
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in d.items() if k != "metadata"} for d in docs[10:20]]),
                   parts / "b.parquet")
    write_jsonl(parts / "c.jsonl", docs[20:] + [{"_id": "d003", "text": "again"}])
    single = write_jsonl(tmp_path / "all.jsonl", docs[:10] + [{k: v for k, v in d.items() if k != "metadata"}
                                                             for d in docs[10:20]] + docs[20:])
    options = OPTIONS | {"reuse": False}
    oracle = build_index(BuildConfig(corpus=single, out=tmp_path / "one", **options))
    for corpus in (parts, tmp_path / "parts" / "*.*"):
        summary = build_index(BuildConfig(corpus=corpus, out=tmp_path / f"many-{len(str(corpus))}", **options))
        _assert_same_version(summary.version_dir, oracle.version_dir)
        assert summary.docs == 30
        assert sorted((Path(r.file).name, r.line, r.reason.split(" ")[0]) for r in summary.bad_records) == [
            ("a.jsonl", 11, "malformed"), ("c.jsonl", 11, "duplicate")]
        corpus_record = read_version_manifest(summary.version_dir).corpus
        assert corpus_record["format"] == "files" and len(corpus_record["files"]) == 3
        assert "read           3 files in 3 parallel tasks" in summary.render()


# `make test-slow` (about 30 s): test_build kills and resumes a full build in the default run
@pytest.mark.slow
def test_a_killed_incremental_build_resumes_to_the_same_version(versions, tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    from index_build.build import CRASH_ENV

    root = tmp_path / "index"
    shutil.copytree(versions["root"] / "versions" / "v1", root / "versions" / "v1")
    argv = [sys.executable, "-m", "index_build", "--corpus", str(versions["second"]), "--out", str(root),
            "--shards", "2", "--encoder", ENCODER, "--chunk-size", "40", "--chunk-overlap", "8", "--no-progress",
            "--version", "v2"]
    first = run_killed(argv, dict(os.environ, **{CRASH_ENV: "1"}))
    assert first.returncode == 137, first.stdout + first.stderr
    second = subprocess.run(argv, capture_output=True, text=True)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "(1 reused from an interrupted build)" in second.stdout and "from v1" in second.stdout
    _assert_same_version(root / "versions" / "v2", versions["full"].version_dir)
