"""Read splits: a corpus cut anywhere reads exactly as one reader reads it (same documents, chunks, lines,
bad records), the oracle being the whole file read as one split and ``iter_documents``."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from index_build.corpus import Document, iter_documents
from index_build.read import _raw_block, parse_and_chunk, write_fragments
from index_build.splits import (
    FRAGMENT_DOCS,
    fragment_range,
    fragments_of,
    plan_splits,
    raw_records,
    read_fragment,
    read_split,
)
from index_format.manifest import sha256_file
from index_format.store import FolderStore
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
        parts = [read_fragment(FolderStore(work), key) for key in fragments_of(work, shard)]
        # which split a row came from differs with the cut; the rest must not
        docs = pa.concat_tables([d for d, _ in parts]).drop_columns(["split"]) if parts else None
        chunks = pa.concat_tables([c for _, c in parts]).drop_columns(["split"]) if parts else None
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


def test_the_pipelines_fragments_equal_one_readers(tmp_path):
    """What the build's Ray Data stages make of a split (its raw records, parsed and chunked, written by the sink) is,
    shard by shard, what ``read_split`` reads in one process: the same tables, counts and bad records."""
    path = _lines(tmp_path)
    splits, _ = plan_splits([path], 700)
    assert len(splits) > 2
    names = [s.name for s in splits]
    for split in splits:
        work = tmp_path / f"work-{split.index}"
        written = read_split(split, str(work), SHARDS, 40, 8, ("_id",), ("text",), False)
        raw = list(raw_records(split))
        batch = _raw_block(split.index, [r[0] for r in raw], [r[1] for r in raw], [r[2] for r in raw])
        parsed = parse_and_chunk(batch, names, SHARDS, 40, 8, ("_id",), ("text",))
        sunk = write_fragments(parsed, str(tmp_path / f"sink-{split.index}"))
        assert [(str(path), line, reason) for _, line, reason in sunk["bad"]] == written["bad"]
        for shard in range(SHARDS):
            files = fragments_of(work, shard)
            assert (shard in sunk["shards"]) == bool(files) == (written["shards"][shard]["docs"] > 0)
            if not files:
                continue
            assert len(sunk["shards"][shard]["keys"]) == 1  # a split's rows of a shard: one fragment
            got = read_fragment(FolderStore(tmp_path / f"sink-{split.index}"), sunk["shards"][shard]["keys"][0])
            want = read_fragment(FolderStore(work), files[0])
            assert got[0].equals(want[0]) and got[1].equals(want[1])
            assert sunk["shards"][shard]["chunks"] == written["shards"][shard]["chunks"] == want[1].num_rows


def test_a_deltas_documents_are_chunked_as_the_corpus_read_chunks_them(tmp_path):
    """``chunk_documents`` (a delta's documents, already parsed) gives the rows ``parse_and_chunk`` gives for the same
    records: the same shards, chunks and metadata."""
    from index_build.read import chunk_documents

    path = _lines(tmp_path)
    splits, _ = plan_splits([path], 10**9)
    raw = list(raw_records(splits[0]))
    parsed = parse_and_chunk(_raw_block(0, [r[0] for r in raw], [r[1] for r in raw], [r[2] for r in raw]),
                             [splits[0].name], SHARDS, 40, 8, ("_id",), ("text",))
    good = parsed.filter(pa.compute.not_equal(parsed["shard"], -1))
    docs = good.select(["doc_id", "title", "text", "metadata_json", "source", "split", "position"])
    assert chunk_documents(docs, SHARDS, 40, 8).equals(good)


def test_fragments_whose_rows_interleave_are_read_together_in_corpus_order(tmp_path):
    """A delta's new documents reach a shard from several base shards' tasks, their positions interleaved: the shard
    reads those fragments together, sorted, and every other fragment alone, in order."""
    from index_build.read import chunk_documents
    from index_build.shard_tasks import _fragment_tables, _overlapping

    def docs(split, positions):
        return pa.table({"doc_id": [f"d{p}" for p in positions], "title": [""] * len(positions),
                         "text": [f"text {p}" for p in positions], "metadata_json": ["{}"] * len(positions),
                         "source": ["x"] * len(positions), "split": [split] * len(positions),
                         "position": positions}).cast(FRAGMENT_DOCS)

    keys = []
    for split, positions in ((0, [1, 2, 3]), (1, [1, 2]), (2, [1, 5, 9]), (2, [3, 4]), (2, [12])):
        sunk = write_fragments(chunk_documents(docs(split, positions), 1, 40, 8), str(tmp_path))
        keys += sunk["shards"][0]["keys"]
    keys.sort()
    assert [len(g) for g in _overlapping(keys, [fragment_range(k) for k in keys])] == [1, 1, 2, 1]
    rows = [(s, p) for d, _ in _fragment_tables(str(tmp_path), keys)
            for s, p in zip(d["split"].to_pylist(), d["position"].to_pylist(), strict=True)]
    assert rows == sorted(rows) and len(rows) == 11
