"""A shard's chunk table as a replica reads it: ``chunks.arrow``, the rows of ``chunks.parquet`` in an Arrow IPC file
(uncompressed, record batches of BATCH rows), memory-mapped.

Parquet is compact and what every tool reads, but it cannot be searched in place: a replica had to decode the whole
table into memory (its Arrow form is about 980 bytes a chunk of text, ids and metadata: 278 MB for a shard of
283,815 chunks of the growing-vocabulary corpus, against 3.6 KB a served chunk in all, bench/README.md). Arrow's IPC format is Arrow's own memory layout on disk, so a memory-mapped file is the
table: a page of results reads the pages its rows are on, and the kernel keeps or drops them like any file's. A
version built before the file existed has only the Parquet table, read whole as before.

Rows are found by batch: row r is row ``r % BATCH`` of batch ``r // BATCH``, and a batch's rows are taken from that
batch alone (a ``take`` over the whole table would concatenate its batches into memory first).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from index_format.manifest import CHUNKS_ARROW, CHUNKS_FILE
from index_format.mapping import map_for_random_reads

BATCH = 65_536  # rows a record batch of chunks.arrow (the last one shorter)


def write_arrow_table(folder: Path, batch_rows: int = BATCH) -> None:
    """``chunks.arrow`` written from the shard's ``chunks.parquet``, a batch of ``batch_rows`` at a time (never the
    whole table in memory), replacing any earlier one (a hard link to a base version's is unlinked, never written
    through)."""
    folder = Path(folder)
    source = pq.ParquetFile(folder / CHUNKS_FILE)
    tmp = folder / (CHUNKS_ARROW + ".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, source.schema_arrow) as writer:
        held: list[pa.RecordBatch] = []
        rows = 0
        for batch in source.iter_batches(batch_size=batch_rows):
            held.append(batch)
            rows += batch.num_rows
            while rows >= batch_rows:
                table = pa.Table.from_batches(held, source.schema_arrow).combine_chunks()
                writer.write_batch(table.slice(0, batch_rows).to_batches()[0])
                rest = table.slice(batch_rows)
                held, rows = rest.to_batches(), rest.num_rows
        if rows:
            writer.write_table(pa.Table.from_batches(held, source.schema_arrow).combine_chunks())
    (folder / CHUNKS_ARROW).unlink(missing_ok=True)
    os.replace(tmp, folder / CHUNKS_ARROW)


class ChunkTable:
    """A shard's chunk table: memory-mapped from ``chunks.arrow`` when the shard has it, else read whole from
    ``chunks.parquet``. ``take`` reads rows; ``column`` reads a whole column (a scan: spell correction's vocabulary,
    a ranking model's lengths, the filters' metadata) through the file, not the mapping, so a scan leaves no pages
    mapped in the process."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / CHUNKS_ARROW
        self.mapped = self.path.is_file()
        if self.mapped:
            reader = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(map_for_random_reads(self.path))))
            self.batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            self.schema = reader.schema
        else:
            table = pq.read_table(self.folder / CHUNKS_FILE).combine_chunks()
            self.batches, self.schema = table.to_batches(), table.schema
        self.batches = self.batches or [pa.RecordBatch.from_pylist([], self.schema)]  # an empty shard
        self.batch_rows = self.batches[0].num_rows if len(self.batches) > 1 else max(self.batches[0].num_rows, 1)
        self.num_rows = sum(b.num_rows for b in self.batches)

    def take(self, rows: Sequence[int], columns: Sequence[str] | None = None) -> pa.Table:
        """The rows at these positions, in the order given (``columns``: those only)."""
        rows = np.asarray(rows, dtype=np.int64)
        names = list(columns) if columns is not None else self.schema.names
        schema = pa.schema([self.schema.field(n) for n in names])
        if not len(rows):
            return schema.empty_table()
        batch, offset = np.divmod(rows, self.batch_rows)
        parts, order = [], []
        for b in np.unique(batch):
            at = np.flatnonzero(batch == b)
            source = self.batches[int(b)].select(names)
            parts.append(source.take(pa.array(offset[at])))
            order.append(at)
        table = pa.Table.from_batches(parts, schema)
        if len(parts) == 1 and np.all(np.diff(order[0]) >= 0):
            return table
        back = np.empty(len(rows), dtype=np.int64)
        back[np.concatenate(order)] = np.arange(len(rows))
        return table.take(pa.array(back))

    def __getitem__(self, name: str) -> pa.ChunkedArray:
        return self.column(name)

    def column(self, name: str) -> pa.ChunkedArray:
        """A whole column, read into memory for the caller (the pages are read through the file, not mapped)."""
        if not self.mapped:
            return pa.chunked_array([b.column(name) for b in self.batches], self.schema.field(name).type)
        only = pa.ipc.IpcReadOptions(included_fields=[self.schema.get_field_index(name)])
        with pa.OSFile(str(self.path), "rb") as f:
            reader = pa.ipc.open_file(f, options=only)
            return pa.chunked_array([reader.get_batch(i).column(0) for i in range(reader.num_record_batches)],
                                    self.schema.field(name).type)
