"""The two tables of a shard, ``documents.parquet`` and ``chunks.parquet``: their schemas, a writer whose
bytes depend only on the rows (never on how they arrived), and the text BM25 and the encoder see."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DOCUMENT_SCHEMA = pa.schema([
    ("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string()), ("metadata_json", pa.string()),
    ("source", pa.string()),
])

CHUNK_SCHEMA = pa.schema([
    ("chunk_id", pa.string()), ("doc_id", pa.string()), ("chunk_index", pa.int32()),
    ("char_start", pa.int64()), ("char_end", pa.int64()), ("title", pa.string()), ("section", pa.string()),
    ("text", pa.string()), ("metadata_json", pa.string()), ("source", pa.string()),
])

ROW_GROUP = 8192  # rows per Parquet row group of a shard's tables


class RowGroupWriter:
    """Appends tables to one Parquet file in row groups of exactly ``rows`` rows (the last one shorter), so
    the same rows give the same bytes whichever fragments they came in; holds at most one group."""

    def __init__(self, path: Path, schema: pa.Schema, rows: int = ROW_GROUP):
        self.path, self.schema, self.rows = Path(path), schema, rows
        self._writer = pq.ParquetWriter(self.path, schema)
        self._held: list[pa.Table] = []
        self._held_rows = 0
        self.written = 0

    def write(self, table: pa.Table) -> None:
        table = table.select(self.schema.names).cast(self.schema)
        while table.num_rows:
            take = min(self.rows - self._held_rows, table.num_rows)
            self._held.append(table.slice(0, take))
            self._held_rows += take
            table = table.slice(take)
            if self._held_rows == self.rows:
                self._flush()

    def _flush(self) -> None:
        if self._held_rows:
            self._writer.write_table(pa.concat_tables(self._held).combine_chunks(), row_group_size=self.rows)
            self.written += self._held_rows
        self._held, self._held_rows = [], 0

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def __enter__(self) -> RowGroupWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def contents_of(table: pa.Table, prepend_title: bool) -> list[str]:
    """The text BM25 and the encoder see for each row of a chunk table (see ``Chunk.contents``)."""
    titles, texts = table["title"].to_pylist(), table["text"].to_pylist()
    if not prepend_title:
        return [text or title for title, text in zip(titles, texts, strict=True)]
    return [
        (f"{title}\n{text}" if text else title) if title else text for title, text in zip(titles, texts, strict=True)
    ]
