"""The chunk table a replica maps (``chunks.arrow``) against the Parquet table it is written from: the same rows by
position in any order asked, the same columns, and a shard without the file read as before."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from index_build.tables import CHUNK_SCHEMA, ROW_GROUP
from index_format.chunk_table import ChunkTable, write_arrow_table
from index_format.manifest import CHUNKS_ARROW, CHUNKS_FILE


def _table(rows: int) -> pa.Table:
    rng = np.random.default_rng(rows)
    return pa.table({
        "chunk_id": [f"d{i // 3}#{i % 3}" for i in range(rows)], "doc_id": [f"d{i // 3}" for i in range(rows)],
        "chunk_index": pa.array([i % 3 for i in range(rows)], pa.int32()),
        "char_start": np.arange(rows) * 10, "char_end": np.arange(rows) * 10 + 9,
        "title": [f"title {i}" for i in range(rows)], "section": [None] * rows,
        "text": [" ".join(["word"] * int(n)) for n in rng.integers(0, 30, rows)],
        "metadata_json": [f'{{"n": {i}}}' for i in range(rows)], "source": ["s"] * rows}, schema=CHUNK_SCHEMA)


@pytest.mark.parametrize("rows", [0, 1, 7, 40, 41])
def test_the_mapped_table_gives_the_parquet_rows_by_position_in_the_order_asked(tmp_path, rows):
    table = _table(rows)
    pq.write_table(table, tmp_path / CHUNKS_FILE, row_group_size=min(ROW_GROUP, 3))
    write_arrow_table(tmp_path, batch_rows=8)  # 41 rows: five full batches and one of one row
    mapped, whole = ChunkTable(tmp_path), None
    assert mapped.mapped and mapped.num_rows == rows
    (tmp_path / "parquet-only").mkdir()
    pq.write_table(table, tmp_path / "parquet-only" / CHUNKS_FILE)
    whole = ChunkTable(tmp_path / "parquet-only")
    assert not whole.mapped and whole.num_rows == rows
    rng = np.random.default_rng(0)
    asks = [[], list(range(rows)), rng.integers(0, max(rows, 1), 25).tolist() if rows else []]
    for ask in asks:
        expected = table.take(pa.array(ask, pa.int64())).to_pylist()
        assert mapped.take(ask).to_pylist() == expected == whole.take(ask).to_pylist()
        assert mapped.take(ask, ["chunk_id", "text"]).to_pylist() == [
            {"chunk_id": r["chunk_id"], "text": r["text"]} for r in expected]
    for name in ("chunk_id", "text", "metadata_json"):
        assert mapped.column(name).to_pylist() == table[name].to_pylist() == whole[name].to_pylist()


def test_a_table_written_again_replaces_a_hard_link_without_writing_through_it(tmp_path):
    base, new = tmp_path / "base", tmp_path / "new"
    base.mkdir(), new.mkdir()
    pq.write_table(_table(20), base / CHUNKS_FILE)
    write_arrow_table(base, batch_rows=8)
    before = (base / CHUNKS_ARROW).read_bytes()
    (new / CHUNKS_ARROW).hardlink_to(base / CHUNKS_ARROW)
    pq.write_table(_table(5), new / CHUNKS_FILE)
    write_arrow_table(new, batch_rows=8)
    assert (base / CHUNKS_ARROW).read_bytes() == before and ChunkTable(new).num_rows == 5
