"""Folding the change log into a version, against the oracle of a full build of the same documents (real Lucene,
real FAISS, Ray tasks): the same chunks, vectors, statistics and scores; the base version untouched; only the
touched shards changed, Lucene updated in place rather than rebuilt."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from deployments.search.inprocess import LocalIndex
from deployments.shard.features import coverage, held_of_bits
from deployments.shard.lucene import FactsReader
from index_build.build import build_index
from index_build.config import BuildConfig
from index_build.fold import _log_changes, fold
from index_build.reuse import link_shard
from index_format.bm25_stats import read_field_stats, read_stats
from index_format.change_log import CHANGES_DIR, ChangeLog, segment_name, segments
from index_format.lucene import LOCK_FILE, update_lucene_index
from index_format.manifest import (
    CHUNKS_FILE,
    EMBEDDINGS_FILE,
    FAISS_ROWS_FILE,
    LUCENE_DIR,
    TERMS_FILE,
    read_shard_manifest,
    terms_file,
)
from index_format.versions import active_version, read_version_manifest, verify_version
from tests.conftest import make_corpus, write_jsonl

ENCODER = "hashing:64"
# With prompts: the fold embeds its chunks as the build does (document_prompt + contents), or the vectors differ.
OPTIONS = {"encoder": ENCODER, "chunk_size": 40, "chunk_overlap": 8, "shards": 3, "progress": False,
           "query_prompt": "query: ", "document_prompt": "passage: "}
QUERIES = ["telescope galaxy", "bread oven butter", "boat wind anchor", "piano chord", "lucene shard replica",
           "zebra stripes savanna", "the"]


def _record(d: dict) -> dict:
    return {"id": d["_id"], "title": d["title"], "text": d["text"], "metadata": d.get("metadata", {})}


def _writes(docs: list[dict]) -> tuple[list[tuple[list[dict], list[str]]], list[dict]]:
    """Writes through the log (as the API makes them) and the corpus they leave: 3 documents replaced (one of
    them twice), 2 added (one then deleted again), 2 deleted."""
    by_id = {d["_id"]: dict(d) for d in docs}
    edited = [dict(by_id[i], text=by_id[i]["text"] + " edited with a sentence about lucene shard replica")
              for i in ("d001", "d017", "d030")]
    new = [{"_id": "n001", "title": "zebra", "text": "zebra stripes on the savanna " * 12, "metadata": {"topic": "z"}},
           {"_id": "n002", "title": "gone", "text": "written and deleted", "metadata": {}}]
    twice = dict(edited[0], text="replaced again: a telescope saw a galaxy")
    writes = [([_record(d) for d in edited], []), ([_record(d) for d in new], ["d005"]),
              ([_record(twice)], ["n002", "d011"])]
    for d in edited + new[:1] + [twice]:
        by_id[d["_id"]] = d
    for gone in ("d005", "n002", "d011"):
        by_id.pop(gone, None)
    order = [d["_id"] for d in docs if d["_id"] in by_id] + ["n001"]
    return writes, [by_id[i] for i in order]


def _rows_by_chunk(version_dir):
    """Every shard's chunk rows (less their source) and vectors, keyed by chunk id."""
    rows, vectors = {}, {}
    for shard in read_version_manifest(version_dir).shards:
        folder = version_dir / "shards" / shard
        table = pq.read_table(folder / CHUNKS_FILE).drop(["source"]).to_pylist()
        stored = np.load(folder / EMBEDDINGS_FILE)
        for row, vector in zip(table, stored, strict=True):
            rows[row["chunk_id"]] = (shard, row)
            vectors[row["chunk_id"]] = vector
    return rows, vectors


# HNSW is the path with most to check (appended to, dead ids kept); flat (made again from the vectors) is
# `make test-slow`, and every other fold test folds flat shards.
@pytest.fixture(scope="module", params=[pytest.param("flat", marks=pytest.mark.slow), "hnsw"])
def folded(request, ray_local, tmp_path_factory):
    kind = request.param
    folder = tmp_path_factory.mktemp(f"fold-{kind}")
    docs = make_corpus(120)  # shards large enough that Lucene's merge policy leaves their segment alone
    writes, after = _writes(docs)
    root = folder / "index"
    corpus = write_jsonl(folder / "v1.jsonl", docs)
    base = build_index(BuildConfig(corpus=corpus, out=root, version="v1", faiss_index=kind, **OPTIONS))
    log = ChangeLog(root / CHANGES_DIR, segment_bytes=1)  # a segment a write: the fold compacts the closed ones
    for upserts, deletes in writes:
        log.append(upserts, deletes)
    (root / CHANGES_DIR / segment_name(len(writes) + 1)).touch()  # the next one started: every write is closed
    before = {p: (os.stat(p).st_ino, p.read_bytes()) for p in base.version_dir.rglob("*") if p.is_file()}
    whole_log = _log_changes(root, 0, None)  # what a version holding none of the writes replays, before compaction
    summary = fold(root, dead_fraction=1.0)  # HNSW appended to whatever it holds dead: the path to test
    full = build_index(BuildConfig(corpus=write_jsonl(folder / "full.jsonl", after), out=folder / "full",
                                   version="full", faiss_index=kind, **OPTIONS))
    return {"kind": kind, "root": root, "base": base, "summary": summary, "full": full, "before": before,
            "after": after, "whole_log": whole_log, "corpus": corpus, "writes": writes}


def test_the_folded_version_holds_what_a_full_build_of_the_same_documents_holds(folded):
    summary, full = folded["summary"], folded["full"]
    folded_dir = folded["root"] / "versions" / summary.version
    assert active_version(folded["root"]) == summary.version
    manifest = read_version_manifest(folded_dir)
    assert manifest.log_seq == 3 and manifest.corpus == {"format": "fold", "base": "v1", "log_seq": 3,
                                                         "upserted": 4, "deleted": 3}
    assert manifest.counts["docs"] == full.docs and manifest.counts["chunks"] == full.chunks
    assert summary.change_log["segments"] == 3 and "3 closed segment(s) compacted" in summary.render()
    assert summary.change_log["changes_dropped"] == 0  # (each write still holds a document's last write)
    assert len(segments(folded["root"] / CHANGES_DIR)) == 2  # the compacted one and the newest
    assert _log_changes(folded["root"], 0, None) == folded["whole_log"]  # v1 (or a rollback to it) replays the same
    verify_version(folded_dir)  # every file against its checksum, the counts
    got_rows, got_vectors = _rows_by_chunk(folded_dir)
    want_rows, want_vectors = _rows_by_chunk(full.version_dir)
    assert got_rows == want_rows  # the same chunks in the same shards
    for chunk_id, vector in want_vectors.items():
        np.testing.assert_allclose(got_vectors[chunk_id], vector, atol=1e-6)
    assert read_stats(folded_dir / "bm25")[0] == read_stats(full.version_dir / "bm25")[0]
    assert read_stats(folded_dir / "bm25")[1].equals(read_stats(full.version_dir / "bm25")[1])
    for shard in manifest.shards:
        for name in (TERMS_FILE, terms_file("title")):  # the title's own statistics follow the fold too
            got = pq.read_table(folded_dir / "shards" / shard / name).sort_by("term")
            assert got.equals(pq.read_table(full.version_dir / "shards" / shard / name).sort_by("term").cast(got.schema))
    got_fields, want_fields = read_field_stats(folded_dir / "bm25"), read_field_stats(full.version_dir / "bm25")
    assert list(got_fields) == list(want_fields) == ["title"]
    assert got_fields["title"][0] == want_fields["title"][0] and got_fields["title"][1].equals(want_fields["title"][1])


def test_the_folded_version_answers_as_a_full_build(folded):
    folded_dir = folded["root"] / "versions" / folded["summary"].version
    got, want = LocalIndex(folded_dir), LocalIndex(folded["full"].version_dir)
    for q in QUERIES:
        # BM25: the same chunks and scores (Lucene's own statistics count the deleted documents; the corpus's do not)
        for weights in (None, {"contents": 1.0, "title": 0.5}):
            a = {h.chunk_id: h.score for h in got.bm25(q, 200, weights=weights)}
            b = {h.chunk_id: h.score for h in want.bm25(q, 200, weights=weights)}
            assert a.keys() == b.keys(), q
            assert a == pytest.approx(b, rel=1e-5), q
        vector = want.embed([q])
        a = {h.chunk_id: h.score for h in got.dense(vector, 20)}
        b = {h.chunk_id: h.score for h in want.dense(vector, 20)}
        assert a == pytest.approx(b, abs=1e-5), q  # a graph this small is searched whole: exact either way
    deleted = {"d005#0", "n002#0", "d011#0"}
    assert not deleted & {h.chunk_id for q in QUERIES for h in got.bm25(q, 200)}


def test_the_folded_version_reads_a_ranking_models_features_as_a_full_build(folded):
    """Each field's BM25 and the query-term masks of every chunk (``FactsReader``: one pass over the postings of each
    of a shard's segments) equal the full build's, where a folded shard holds several segments and deleted
    documents."""
    got = LocalIndex(folded["root"] / "versions" / folded["summary"].version)
    want = LocalIndex(folded["full"].version_dir)
    assert any(s.lucene.reader.leaves().size() > 1 for s in got.shards)  # the path under test: several segments
    readers = [(index, FactsReader([s.lucene for s in index.shards])) for index in (got, want)]
    for q in QUERIES:
        terms = want.shards[0].analyze(q)
        distinct = sorted(set(terms))
        facts = []
        for index, reader in readers:
            weights = [1.0 + i for i in range(len(distinct))]
            fields, masks, shares = reader.read([np.arange(s.chunks) for s in index.shards], terms, distinct, weights)
            # The JVM's coverage is the Python rule's over the same bits.
            expected = coverage(held_of_bits(masks, len(distinct)), weights)
            assert np.allclose(shares, expected, rtol=1e-6, atol=0), q
            ids = [c for s in index.shards for c in s.ids]
            facts.append({c: ({f: float(v[i]) for f, v in fields.items()}, int(masks[i])) for i, c in enumerate(ids)})
        assert facts[0].keys() == facts[1].keys(), q
        for chunk_id, (scores, mask) in facts[1].items():
            assert facts[0][chunk_id][1] == mask, (q, chunk_id)
            assert facts[0][chunk_id][0] == pytest.approx(scores, rel=1e-5, abs=1e-6), (q, chunk_id)
        assert any(mask for _, mask in facts[1].values()) or not distinct, q  # the masks are not all empty


def test_a_fold_changes_only_the_touched_shards_and_never_the_base(folded):
    summary, base = folded["summary"], folded["base"]
    folded_dir = folded["root"] / "versions" / summary.version
    for path, (inode, data) in folded["before"].items():
        assert os.stat(path).st_ino == inode and path.read_bytes() == data, path
    changed, linked = set(summary.shards_changed), set(summary.shards_linked)
    assert changed and changed | linked == set(read_version_manifest(folded_dir).shards)
    for shard in changed:  # Lucene updated in place: the base's segment files are still the same inodes
        lucene, old = folded_dir / "shards" / shard / LUCENE_DIR, base.version_dir / "shards" / shard / LUCENE_DIR
        shared = [p.name for p in old.iterdir() if (lucene / p.name).exists()
                  and os.stat(lucene / p.name).st_ino == os.stat(p).st_ino and p.name.endswith((".doc", ".tim"))]
        assert shared, shard
        has_map = (folded_dir / "shards" / shard / FAISS_ROWS_FILE).exists()
        assert has_map == (folded["kind"] == "hnsw")  # flat is made again; an approximate index is appended to
    assert all(shard in summary.rebuilt_faiss for shard in changed) if folded["kind"] == "flat" else \
        not summary.rebuilt_faiss


def test_a_fold_in_object_storage_equals_the_fold_of_a_local_root(folded, s3_root, tmp_path):
    """The same base built into object storage and the same writes in its log: the fold there (the touched shards
    folded by Ray Data tasks, each fetching its own base shard only; the others referenced) publishes what the local
    fold did, and fetched nothing of the base's shards to the driver's node."""
    from index_format.collection_log import open_change_log
    from index_format.object_root import ObjectRoot
    from tests.versions_equal import assert_versions_equal

    build_index(BuildConfig(corpus=folded["corpus"], out=s3_root, version="v1", faiss_index=folded["kind"],
                            **OPTIONS))
    log = open_change_log(s3_root)
    for upserts, deletes in folded["writes"]:
        log.append(upserts, deletes)
    cache = tmp_path / "cache"
    os.environ["RAYSEARCH_INDEX_CACHE"] = str(cache)  # this process's (the driver's) cache, seen by what it fetches
    try:
        summary = fold(s3_root, dead_fraction=1.0)
    finally:
        del os.environ["RAYSEARCH_INDEX_CACHE"]
    local = folded["summary"]
    assert (summary.shards_changed, summary.shards_linked) == (local.shards_changed, local.shards_linked)
    fetched = ObjectRoot(s3_root, cache_dir=cache).local_root() / "versions" / "v1"
    assert not (fetched / "shards").exists() or not any((fetched / "shards").iterdir())  # no base shard came here
    remote = ObjectRoot(s3_root, cache_dir=tmp_path / "fresh").fetch(summary.version)[0]
    assert_versions_equal(folded["root"] / "versions" / local.version, remote, ignore=frozenset({"build_key"}))


def test_a_fold_takes_lucenes_lock_on_a_file_of_its_own_never_one_shared_by_a_hard_link(folded, tmp_path):
    """A shard linked from its base shares the base's lock file, and a version fetched from object storage has all
    its empty files as one blob, so every shard's lock is one inode there. Lucene locks the inode: two shards
    folded at once on one node failed with "Lock held by another program". Here another process holds the base's
    lock while a shard linked from it is changed."""
    base = folded["base"].version_dir / "shards" / read_version_manifest(folded["base"].version_dir).shards[0]
    lock = base / LUCENE_DIR / LOCK_FILE
    target = tmp_path / "shard"
    link_shard(base, target)
    assert os.stat(target / LUCENE_DIR / LOCK_FILE).st_ino == os.stat(lock).st_ino
    hold = "import fcntl, sys; f = open(sys.argv[1], 'r+'); fcntl.lockf(f, fcntl.LOCK_EX); print('held', flush=True); "\
        "sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = read_shard_manifest(base)
        update = update_lucene_index(target / LUCENE_DIR, [], [("zz-new-0001", "a telescope saw a galaxy", {})],
                                     list(before.lucene.get("fields", {})))
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert update["documents"] == before.counts["lucene_docs"] + 1
    assert os.stat(target / LUCENE_DIR / LOCK_FILE).st_ino != os.stat(lock).st_ino


def test_a_second_fold_with_nothing_new_publishes_nothing_and_a_later_write_folds_on_top(folded):
    root = folded["root"]
    dead = root / "staging" / "fold-v1-123"  # what a killed fold leaves
    (dead / "shards" / "shard-000").mkdir(parents=True)
    again = fold(root)
    assert not dead.exists() and not list((root / "staging").glob("fold-*"))
    assert again.version is None and again.log_seq == 3 and "nothing to fold" in again.render()
    ChangeLog(root / CHANGES_DIR).append([{"id": "n001", "title": "zebra", "text": "now about a piano chord",
                                           "metadata": {}}], ["d001"])
    third = fold(root)
    assert third.version and third.log_seq == 4 and third.base == folded["summary"].version
    index = LocalIndex(root)
    assert [h.chunk_id for h in index.bm25("piano chord zebra", 1)] == ["n001#0"]
    assert not any(h.chunk_id.startswith("d001#") for h in index.bm25("telescope galaxy replaced", 200))
    assert json.loads((root / "versions" / third.version / "manifest.json").read_text())["log_seq"] == 4


def test_each_shards_document_row_map_is_what_its_stored_ids_say_after_the_build_and_the_fold(folded):
    """The map a replica reads instead of every stored id (``DOC_ROWS_FILE``), against the stored ids read one by one:
    written by the build, moved on by the fold (the base's segments kept), read again where the segments moved."""
    from index_format.lucene import DOC_ROWS_FILE, folded_doc_rows, lucene_doc_rows

    summary, base = folded["summary"], folded["base"]
    folded_dir = folded["root"] / "versions" / summary.version
    for version_dir in (base.version_dir, folded_dir):
        for shard in read_version_manifest(version_dir).shards:
            folder = version_dir / "shards" / shard
            ids = pq.read_table(folder / CHUNKS_FILE)["chunk_id"].to_pylist()
            written = np.load(folder / DOC_ROWS_FILE)
            np.testing.assert_array_equal(written, lucene_doc_rows(folder / LUCENE_DIR, ids))
            assert sorted(written[written >= 0].tolist()) == list(range(len(ids)))  # every row, once
    shard = summary.shards_changed[0]
    other = folded["full"].version_dir / "shards" / shard / LUCENE_DIR  # not this index's base: its segments differ
    assert folded_doc_rows(other, folded_dir / "shards" / shard / LUCENE_DIR, np.zeros(3, np.int32),
                           np.zeros(3, np.int64), [], 0) is None
