"""A shard's chunk ids found by their sorted hashes (``deployments.shard.chunk_ids``) against a plain dict: every
id's row, -1 for an id the shard does not hold, ids read back by row, and colliding hashes still the right rows; each
for a shard small enough to keep its ids as a list and for one that reads them from its table."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import deployments.shard.chunk_ids as chunk_ids
from deployments.shard.chunk_ids import ChunkIds, ids_at, rows_of
from index_build.tables import CHUNK_SCHEMA
from index_format.chunk_table import ChunkTable, write_arrow_table
from index_format.manifest import CHUNKS_FILE


@pytest.fixture
def table(tmp_path) -> ChunkTable:
    ids = [f"doc-{i // 4}#{i % 4}" for i in range(103)]
    rows = len(ids)
    pq.write_table(pa.table({"chunk_id": ids, "doc_id": [c.split("#")[0] for c in ids],
                             "chunk_index": pa.array([0] * rows, pa.int32()), "char_start": [0] * rows,
                             "char_end": [0] * rows, "title": [""] * rows, "section": [None] * rows,
                             "text": ids, "metadata_json": ["{}"] * rows, "source": [""] * rows},
                            schema=CHUNK_SCHEMA), tmp_path / CHUNKS_FILE)
    write_arrow_table(tmp_path, batch_rows=16)
    return ChunkTable(tmp_path)


@pytest.fixture(params=["listed", "from the table"])
def listed(request, monkeypatch) -> bool:
    monkeypatch.setattr(chunk_ids, "LISTED_MAX", 10**9 if request.param == "listed" else 0)
    return request.param == "listed"


def _check(ids: ChunkIds, held: list[str]) -> None:
    asked = held[::-1] + ["doc-999#0", "", held[5]]
    expected = {c: i for i, c in enumerate(held)}
    assert ids.rows_of(asked).tolist() == [expected.get(c, -1) for c in asked]
    assert rows_of(held, asked).tolist() == ids.rows_of(asked).tolist()  # a plain list: a dict, the same answer
    assert ids.take([7, 0, 102, 7]) == [held[7], held[0], held[102], held[7]] == ids_at(held, [7, 0, 102, 7])
    many = np.random.default_rng(0).permutation(np.repeat(np.arange(len(held)), 2))  # Arrow's take, every batch
    assert len(many) >= chunk_ids.ARROW_TAKE and ids.take(many) == [held[r] for r in many]
    assert ids.take(many[:chunk_ids.ARROW_TAKE - 1]) == [held[r] for r in many[:chunk_ids.ARROW_TAKE - 1]]
    assert len(ids) == 103 and list(ids) == held and ids[40] == held[40] and held[3] in ids and "nope" not in ids


def test_every_id_is_found_at_its_row_and_an_unknown_one_nowhere(table, listed):
    held = table.column("chunk_id").to_pylist()
    ids = ChunkIds(table)
    assert (ids.listed is not None) == listed
    _check(ids, held)
    assert ids.take(np.array([], dtype=np.int64)) == [] and ids.take(np.array([5, 5], dtype=np.int32)) == [held[5]] * 2


def test_ids_whose_hashes_collide_are_told_apart_by_the_ids_themselves(table, monkeypatch, listed):
    # Every id hashed to one of three values: each lookup meets dozens of candidates and must read them.
    monkeypatch.setattr(chunk_ids, "_hashes", lambda ids, count: np.fromiter(
        (len(c) % 3 for c in ids), dtype=np.int64, count=count))
    held = table.column("chunk_id").to_pylist()
    _check(ChunkIds(table), held)
