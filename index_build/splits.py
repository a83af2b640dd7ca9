"""A corpus cut into read splits, and one split read, parsed and chunked into per-shard fragments.

The driver never parses the corpus. It plans splits in one streaming pass over the bytes that also
fingerprints each file: a JSONL file is cut at line starts about every ``split_bytes`` (so one large file
is read by many tasks), a Parquet file at row-group boundaries. Each split knows the corpus line (or
row) it starts at, so a task reports every record as ``file:line`` exactly as a single reader would.

A read task (``read_split_fragments``, what the build runs) parses its records, chunks them and returns, for
every shard, the split's documents and chunks as two Parquet blobs through Ray's object store (one return value
per shard, so each shard's task fetches only its own, from whichever node it runs on), with the per-shard counts
the driver checks the assembled shards against. ``read_split`` writes the same fragments as Parquet files under
a work folder instead (a delta's tasks, tests and benchmarks on one node). The shard tasks then put a shard
together from its fragments in split order, which is corpus order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from index_format.chunking import chunk_document
from index_format.records import metadata_json
from index_format.sharding import shard_name, shard_of

from .corpus import BadRecord, CorpusError, Document, record_to_document

DEFAULT_SPLIT_BYTES = 32 * 2**20
_BLOCK = 4 * 2**20  # bytes read at a time while planning

# A fragment's rows: a document or a chunk, with the split and corpus position it came from. ``position``
# orders rows within a split (the line of a JSONL record, the row of a Parquet record, the row of a base
# version's document in a delta); duplicates of an id are found by it.
FRAGMENT_DOCS = pa.schema([
    ("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string()), ("metadata_json", pa.string()),
    ("source", pa.string()), ("position", pa.int64()),
])
FRAGMENT_CHUNKS = pa.schema([
    ("chunk_id", pa.string()), ("doc_id", pa.string()), ("chunk_index", pa.int32()),
    ("char_start", pa.int64()), ("char_end", pa.int64()), ("title", pa.string()), ("section", pa.string()),
    ("text", pa.string()), ("metadata_json", pa.string()), ("source", pa.string()), ("position", pa.int64()),
])


@dataclass(frozen=True)
class Split:
    """One task's share of the corpus: bytes [start, end) of a JSONL file, or row groups [start, end) of a
    Parquet file; ``first_line`` is the corpus line (row) number of its first record, 1-based."""

    index: int
    file: str
    kind: str  # "jsonl" | "parquet"
    start: int
    end: int
    first_line: int
    source: str = ""  # the file's name in records and bad records, when not ``file`` (a URL it was downloaded from)

    @property
    def name(self) -> str:
        return self.source or self.file


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


def plan_file(path: Path, split_bytes: int, first_index: int) -> tuple[list[Split], str]:
    """The splits of one corpus file and its sha256, from one streaming pass (the driver holds one block)."""
    sha = hashlib.sha256()
    splits: list[Split] = []
    if _is_parquet(path):
        with open(path, "rb") as f:
            while block := f.read(_BLOCK):
                sha.update(block)
        try:
            meta = pq.ParquetFile(path).metadata
        except Exception as e:  # pyarrow raises several types for a corrupt file
            raise CorpusError(f"cannot read parquet file {path}: {e}") from e
        group, row, size, start, start_row = 0, 0, 0, 0, 0
        for group in range(meta.num_row_groups):
            size += meta.row_group(group).total_byte_size
            row += meta.row_group(group).num_rows
            if size >= split_bytes:
                splits.append(Split(first_index + len(splits), str(path), "parquet", start, group + 1, start_row + 1))
                start, start_row, size = group + 1, row, 0
        if start < meta.num_row_groups or not splits:
            splits.append(Split(first_index + len(splits), str(path), "parquet", start, meta.num_row_groups,
                                start_row + 1))
        return splits, sha.hexdigest()
    # JSONL: a split starts at a line start about every split_bytes; the line starting at or after each cut
    # begins the next split (found with one readline per cut, not a scan).
    size = path.stat().st_size
    starts = [0]
    with open(path, "rb") as f:
        cut = split_bytes
        while cut < size:
            f.seek(cut - 1)
            f.readline()
            nxt = f.tell()
            if nxt >= size:
                break
            starts.append(nxt)
            cut = nxt + split_bytes
        # One pass over the bytes: the fingerprint, and the newlines before each split (its first line).
        f.seek(0)
        line = 1
        bounds = list(zip(starts, [*starts[1:], size], strict=True))
        for i, (start, end) in enumerate(bounds):
            splits.append(Split(first_index + i, str(path), "jsonl", start, end, line))
            left = end - start
            while left > 0:
                block = f.read(min(_BLOCK, left))
                if not block:
                    break
                sha.update(block)
                line += block.count(b"\n")
                left -= len(block)
    return splits, sha.hexdigest()


def plan_splits(files: list[Path], split_bytes: int = DEFAULT_SPLIT_BYTES) -> tuple[list[Split], dict[str, str]]:
    """Every file's splits, in corpus order, and file -> sha256."""
    splits: list[Split] = []
    shas: dict[str, str] = {}
    for path in files:
        found, sha = plan_file(Path(path), split_bytes, len(splits))
        splits.extend(found)
        shas[str(path)] = sha
    return splits, shas


def _records(split: Split) -> Iterator[tuple[Any, int] | BadRecord]:
    """(record, line) of every non-blank line (row) of the split, or a BadRecord for a line that is not JSON."""
    if split.kind == "parquet":
        pf = pq.ParquetFile(split.file)
        line = split.first_line
        for batch in pf.iter_batches(batch_size=4096, row_groups=list(range(split.start, split.end))):
            for record in batch.to_pylist():
                yield record, line
                line += 1
        return
    with open(split.file, "rb") as f:
        f.seek(split.start)
        left = split.end - split.start
        line = split.first_line
        while left > 0:
            raw = f.readline()
            if not raw:
                break
            left -= len(raw)
            if raw.strip():
                try:
                    yield json.loads(raw), line
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    yield BadRecord(split.name, line, f"malformed JSON: {e}")
            line += 1


class FragmentWriter:
    """A split's documents and chunks, kept per shard as Arrow columns and written as two files a shard."""

    def __init__(self, num_shards: int, chunk_size: int, chunk_overlap: int):
        self.num_shards, self.chunk_size, self.chunk_overlap = num_shards, chunk_size, chunk_overlap
        self.docs = [{name: [] for name in FRAGMENT_DOCS.names} for _ in range(num_shards)]
        self.chunks = [{name: [] for name in FRAGMENT_CHUNKS.names} for _ in range(num_shards)]

    def add(self, doc: Document, position: int) -> None:
        shard = shard_of(doc.doc_id, self.num_shards)
        as_json = metadata_json(doc.metadata)
        d = self.docs[shard]
        for name, value in (("doc_id", doc.doc_id), ("title", doc.title), ("text", doc.text),
                            ("metadata_json", as_json), ("source", doc.source), ("position", position)):
            d[name].append(value)
        c = self.chunks[shard]
        for chunk in chunk_document(doc, self.chunk_size, self.chunk_overlap):
            for name, value in chunk.row(as_json).items():
                c[name].append(value)
            c["position"].append(position)

    def counts(self) -> list[dict[str, int]]:
        """Per shard {"docs": n, "chunks": n}: what the split gave each shard."""
        return [{"docs": len(d["doc_id"]), "chunks": len(c["chunk_id"])} for d, c in zip(self.docs, self.chunks,
                                                                                        strict=True)]

    def tables(self) -> list[tuple[pa.Table, pa.Table] | None]:
        """Per shard its (documents, chunks) fragment as Arrow tables; None for a shard that received no rows."""
        return [(pa.table(d, schema=FRAGMENT_DOCS), pa.table(c, schema=FRAGMENT_CHUNKS)) if d["doc_id"] else None
                for d, c in zip(self.docs, self.chunks, strict=True)]

    def write(self, work: Path, split_index: int) -> list[dict[str, int]]:
        """Two files per shard that received rows; returns per shard {"docs": n, "chunks": n}."""
        for shard, fragment in enumerate(self.tables()):
            if fragment is None:
                continue
            folder = fragment_dir(work, shard)
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(fragment[0], folder / f"{split_index:06d}.docs.parquet")
            pq.write_table(fragment[1], folder / f"{split_index:06d}.chunks.parquet")
        return self.counts()


def fragment_dir(work: Path, shard: int) -> Path:
    return Path(work) / "fragments" / shard_name(shard)


def fragments_of(work: Path, shard: int) -> list[tuple[Path, Path]]:
    """A shard's (documents, chunks) fragment files in split order, which is corpus order."""
    folder = fragment_dir(work, shard)
    if not folder.is_dir():
        return []
    docs = sorted(folder.glob("*.docs.parquet"))
    return [(d, d.with_name(d.name.replace(".docs.", ".chunks."))) for d in docs]


def _read_into(split: Split, num_shards: int, chunk_size: int, chunk_overlap: int, id_fields: tuple[str, ...],
               text_fields: tuple[str, ...], strict: bool) -> tuple[FragmentWriter, list[tuple[str, int, str]]]:
    """The split parsed and chunked: its rows per shard, and its bad records as (file, line, reason)."""
    writer = FragmentWriter(num_shards, chunk_size, chunk_overlap)
    bad: list[tuple[str, int, str]] = []
    for item in _records(split):
        if isinstance(item, BadRecord):
            doc: Document | BadRecord = item
            line = item.line
        else:
            record, line = item
            doc = record_to_document(record, (split.name, line), id_fields, text_fields)
        if isinstance(doc, BadRecord):
            if strict:
                raise CorpusError(f"{doc} (strict mode; drop --strict to skip and count bad records)")
            bad.append((doc.file, doc.line, doc.reason))
            continue
        writer.add(doc, line)
    return writer, bad


def read_split(split: Split, work: str, num_shards: int, chunk_size: int, chunk_overlap: int,
               id_fields: tuple[str, ...], text_fields: tuple[str, ...], strict: bool) -> dict:
    """Parse and chunk one split into per-shard fragment files under ``work``. Returns the counts per shard and
    the split's bad records. Duplicate ids are found later, per shard (an id always hashes to the same shard)."""
    writer, bad = _read_into(split, num_shards, chunk_size, chunk_overlap, id_fields, text_fields, strict)
    return {"split": split.index, "shards": writer.write(Path(work), split.index), "bad": bad}


def read_split_fragments(split: Split, num_shards: int, chunk_size: int, chunk_overlap: int,
                         id_fields: tuple[str, ...], text_fields: tuple[str, ...], strict: bool) -> tuple:
    """Ray task with ``num_returns=1 + num_shards``: ``read_split`` with no files. Returns its summary (the counts
    per shard, the bad records), then each shard's fragment ((documents, chunks) as Parquet bytes, or None): each a
    separate object in Ray's object store, fetched by that shard's task on whatever node it runs. Parquet, not
    Arrow tables: compressed as the fragment files were, so the object store (what it spills to disk, what crosses
    the network) holds about what the files held, at the same cost to write and read."""
    writer, bad = _read_into(split, num_shards, chunk_size, chunk_overlap, id_fields, text_fields, strict)
    return ({"split": split.index, "shards": writer.counts(), "bad": bad},
            *[None if f is None else (_parquet(f[0]), _parquet(f[1])) for f in writer.tables()])


def _parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def fragment_table(data: bytes) -> pa.Table:
    """A fragment's table from the bytes ``read_split_fragments`` returned."""
    return pq.read_table(pa.BufferReader(data))
