"""Read splits: a corpus cut anywhere reads exactly as one reader reads it (same documents, chunks, lines,
bad records), the oracle being the whole file read as one split and ``iter_documents``."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from index_build.corpus import Document, iter_documents
from index_build.splits import fragment_table, fragments_of, plan_splits, read_split, read_split_fragments
from index_format.manifest import sha256_file
from tests.conftest import make_corpus

SHARDS = 3


def _read_all(path, split_bytes, work):
    splits, shas = plan_splits([path], split_bytes)
    bad, counts = [], []
    for split in splits:
        result = read_split(split, str(work), SHARDS, 40, 8, ("_id",), ("text",), False)
        bad += result["bad"]
        counts.append(result["shards"])
    tables = []
    for shard in range(SHARDS):
        parts = fragments_of(work, shard)
        docs = pa.concat_tables([pq.read_table(d) for d, _ in parts]) if parts else None
        chunks = pa.concat_tables([pq.read_table(c) for _, c in parts]) if parts else None
        tables.append((docs, chunks))
    return splits, shas, bad, tables


def _lines(tmp_path):
    docs = make_corpus(40, seed=11)
    lines = [json.dumps(d) for d in docs]
    lines[5:5] = ["", "{torn json", "   "]
    lines.append(json.dumps({"_id": "long", "text": "word " * 3000}))
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines))  # no newline after the last record
    return path


@pytest.mark.parametrize("split_bytes", [1, 97, 1000, 5000, 10**9])
def test_a_jsonl_file_cut_anywhere_reads_like_one_reader(tmp_path, split_bytes):
    path = _lines(tmp_path)
    splits, shas, bad, tables = _read_all(path, split_bytes, tmp_path / "cut")
    _, _, bad_one, oracle = _read_all(path, 10**12, tmp_path / "whole")
    assert shas == {str(path): sha256_file(path)}
    if split_bytes < 5000:
        assert len(splits) > 3
    assert splits[0].start == 0 and splits[-1].end == path.stat().st_size
    assert all(a.end == b.start for a, b in zip(splits, splits[1:], strict=False))
    assert bad == bad_one == [(str(path), 7, bad_one[0][2])] and "malformed JSON" in bad_one[0][2]
    for (docs, chunks), (docs_1, chunks_1) in zip(tables, oracle, strict=True):
        assert docs.equals(docs_1) and chunks.equals(chunks_1)
    # and what one reader gives: every document, with its file:line
    expected = [d for d in iter_documents(path, ("_id",), ("text",)) if isinstance(d, Document)]
    got = {r["doc_id"]: r["source"] for docs, _ in tables for r in docs.to_pylist()}
    assert got == {d.doc_id: d.source for d in expected}


def test_a_parquet_file_is_cut_at_row_groups(tmp_path):
    docs = make_corpus(50, seed=2)
    table = pa.table({"_id": [d["_id"] for d in docs], "title": [d["title"] for d in docs],
                      "text": [d["text"] for d in docs]})
    path = tmp_path / "corpus.parquet"
    pq.write_table(table, path, row_group_size=7)
    splits, _, bad, tables = _read_all(path, 1, tmp_path / "cut")
    assert len(splits) == 8 and [s.first_line for s in splits] == [1, 8, 15, 22, 29, 36, 43, 50]
    _, _, _, oracle = _read_all(path, 10**12, tmp_path / "whole")
    assert not bad
    for (d, c), (d1, c1) in zip(tables, oracle, strict=True):
        assert d.equals(d1) and c.equals(c1)
    rows = {r["doc_id"]: r["source"] for d, _ in tables for r in d.to_pylist()}
    assert rows["d049"] == f"{path}:50" and len(rows) == 50


def test_fragments_returned_as_objects_equal_the_fragment_files(tmp_path):
    """What a read task returns through the object store (the build's fragments) is, shard by shard, the tables
    and counts ``read_split`` writes as files."""
    path = _lines(tmp_path)
    splits, _ = plan_splits([path], 700)
    assert len(splits) > 2
    for split in splits:
        work = tmp_path / f"work-{split.index}"
        written = read_split(split, str(work), SHARDS, 40, 8, ("_id",), ("text",), False)
        summary, *fragments = read_split_fragments(split, SHARDS, 40, 8, ("_id",), ("text",), False)
        assert summary == written
        assert len(fragments) == SHARDS
        files = {shard: fragments_of(work, shard) for shard in range(SHARDS)}
        for shard, fragment in enumerate(fragments):
            assert (fragment is None) == (not files[shard]) == (written["shards"][shard]["docs"] == 0)
            if fragment is not None:
                (docs_file, chunks_file), = files[shard]
                assert fragment_table(fragment[0]).equals(pq.read_table(docs_file))
                assert fragment_table(fragment[1]).equals(pq.read_table(chunks_file))
                assert fragment_table(fragment[1]).num_rows == written["shards"][shard]["chunks"]
