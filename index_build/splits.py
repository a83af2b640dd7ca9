"""A corpus cut into read splits, and one split read, parsed and chunked into per-shard fragments.

The build scans each file once where it is (``plan_file``, in a Ray Data task: ``read.scan_corpus``), in one
streaming pass over the bytes that also fingerprints it: a JSONL file is cut at line starts about every
``split_bytes`` (so one large file is read by many tasks), a Parquet file at row-group boundaries. Each split knows
the corpus line (or row) it starts at, so a task reports every record as ``file:line`` exactly as a single reader
would.

A split's raw records (``raw_records``) are what the build's Ray Data read stage hands its parse step
(``read.parse_and_chunk``); a shard's rows of a block are written as one fragment, two Parquet files named by their
first and last rows (``fragment_key``), which the shard's task puts together in corpus order. ``read_split`` does the
same in one process, with ``FragmentWriter`` (the oracle of the tests, and benchmarks).
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from index_format.chunking import chunk_document
from index_format.records import metadata_json
from index_format.sharding import shard_name, shard_of
from index_format.store import FolderStore, Store

from .corpus import BadRecord, CorpusError, Document, record_to_document

DEFAULT_SPLIT_BYTES = 32 * 2**20
_BLOCK = 4 * 2**20  # bytes read at a time while planning

# A fragment's rows: a document or a chunk, with the split and corpus position it came from. ``position``
# orders rows within a split (the line of a JSONL record, the row of a Parquet record, the row of a base
# version's document in a delta); duplicates of an id are found by it.
FRAGMENT_DOCS = pa.schema([
    ("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string()), ("metadata_json", pa.string()),
    ("source", pa.string()), ("split", pa.int32()), ("position", pa.int64()),
])
FRAGMENT_CHUNKS = pa.schema([
    ("chunk_id", pa.string()), ("doc_id", pa.string()), ("chunk_index", pa.int32()),
    ("char_start", pa.int64()), ("char_end", pa.int64()), ("title", pa.string()), ("section", pa.string()),
    ("text", pa.string()), ("metadata_json", pa.string()), ("source", pa.string()), ("split", pa.int32()),
    ("position", pa.int64()),
])


@dataclass(frozen=True)
class Split:
    """One task's share of the corpus: bytes [start, end) of a JSONL file, or row groups [start, end) of a
    Parquet file; ``first_line`` is the corpus line (row) number of its first record, 1-based. ``file`` is where
    it is read from and what its records are named by: a local path or an object's URL (``inputs.open_input``)."""

    index: int
    file: str
    kind: str  # "jsonl" | "parquet"
    start: int
    end: int
    first_line: int

    @property
    def name(self) -> str:
        return self.file


def _is_parquet(location: str) -> bool:
    return location.lower().endswith((".parquet", ".pq"))


def plan_file(location: str, split_bytes: int, first_index: int = 0) -> tuple[list[Split], str]:
    """The splits of one corpus file and its sha256, from one streaming pass over its bytes (one block held),
    where the file is: a scan task of the build opens it (``inputs.open_input``)."""
    from .inputs import open_input

    sha = hashlib.sha256()
    splits: list[Split] = []
    with open_input(location) as f:
        if _is_parquet(location):
            while block := f.read(_BLOCK):
                sha.update(block)
            try:
                f.seek(0)
                meta = pq.ParquetFile(f).metadata
            except Exception as e:  # pyarrow raises several types for a corrupt file
                raise CorpusError(f"cannot read parquet file {location}: {e}") from e
            group, row, size, start, start_row = 0, 0, 0, 0, 0
            for group in range(meta.num_row_groups):
                size += meta.row_group(group).total_byte_size
                row += meta.row_group(group).num_rows
                if size >= split_bytes:
                    splits.append(Split(first_index + len(splits), location, "parquet", start, group + 1,
                                        start_row + 1))
                    start, start_row, size = group + 1, row, 0
            if start < meta.num_row_groups or not splits:
                splits.append(Split(first_index + len(splits), location, "parquet", start, meta.num_row_groups,
                                    start_row + 1))
            return splits, sha.hexdigest()
        # JSONL: a split starts at a line start about every split_bytes; the line starting at or after each cut
        # begins the next split (found with one readline per cut, not a scan).
        size = f.seek(0, 2)
        starts = [0]
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
            splits.append(Split(first_index + i, location, "jsonl", start, end, line))
            left = end - start
            while left > 0:
                block = f.read(min(_BLOCK, left))
                if not block:
                    break
                sha.update(block)
                line += block.count(b"\n")
                left -= len(block)
    return splits, sha.hexdigest()


def plan_splits(files: list, split_bytes: int = DEFAULT_SPLIT_BYTES) -> tuple[list[Split], dict[str, str]]:
    """Every file's splits, in corpus order, and file -> sha256, planned in this process (tests, benchmarks; the
    build scans its files in parallel tasks: ``read.scan_corpus``)."""
    splits: list[Split] = []
    shas: dict[str, str] = {}
    for location in map(str, files):
        found, sha = plan_file(location, split_bytes, len(splits))
        splits.extend(found)
        shas[location] = sha
    return splits, shas


def raw_records(split: Split) -> Iterator[tuple[int, bytes, bool]]:
    """(line, bytes, pickled) of every non-blank line of a JSONL split (its raw JSON, not yet parsed) or every row of
    a Parquet split (the row's dict, pickled): what a read task hands the parse step."""
    from .inputs import open_input

    if split.kind == "parquet":
        with open_input(split.file) as f:
            pf = pq.ParquetFile(f)
            line = split.first_line
            for batch in pf.iter_batches(batch_size=4096, row_groups=list(range(split.start, split.end))):
                for record in batch.to_pylist():
                    yield line, pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL), True
                    line += 1
        return
    with open_input(split.file) as f:
        f.seek(split.start)
        left = split.end - split.start
        line = split.first_line
        while left > 0:
            raw = f.readline()
            if not raw:
                break
            left -= len(raw)
            if raw.strip():
                yield line, raw, False
            line += 1


def decode(raw: bytes, pickled: bool, name: str, line: int) -> Any:
    """A raw record's value (``raw_records``), or a BadRecord for a line that is not JSON."""
    if pickled:
        return pickle.loads(raw)
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return BadRecord(name, line, f"malformed JSON: {e}")


def _records(split: Split) -> Iterator[tuple[Any, int] | BadRecord]:
    """(record, line) of every non-blank line (row) of the split, or a BadRecord for a line that is not JSON."""
    for line, raw, pickled in raw_records(split):
        value = decode(raw, pickled, split.name, line)
        yield value if isinstance(value, BadRecord) else (value, line)


class FragmentWriter:
    """Documents and chunks, kept per shard as Arrow columns; each shard's as two tables (or two files)."""

    def __init__(self, num_shards: int, chunk_size: int, chunk_overlap: int, split: int):
        self.num_shards, self.chunk_size, self.chunk_overlap, self.split = num_shards, chunk_size, chunk_overlap, split
        self.docs = [{name: [] for name in FRAGMENT_DOCS.names} for _ in range(num_shards)]
        self.chunks = [{name: [] for name in FRAGMENT_CHUNKS.names} for _ in range(num_shards)]

    def add(self, doc: Document, position: int) -> None:
        shard = shard_of(doc.doc_id, self.num_shards)
        as_json = metadata_json(doc.metadata)
        d = self.docs[shard]
        for name, value in (("doc_id", doc.doc_id), ("title", doc.title), ("text", doc.text),
                            ("metadata_json", as_json), ("source", doc.source), ("split", self.split),
                            ("position", position)):
            d[name].append(value)
        c = self.chunks[shard]
        for chunk in chunk_document(doc, self.chunk_size, self.chunk_overlap):
            for name, value in chunk.row(as_json).items():
                c[name].append(value)
            c["split"].append(self.split)
            c["position"].append(position)

    def counts(self) -> list[dict[str, int]]:
        """Per shard {"docs": n, "chunks": n}: what the split gave each shard."""
        return [{"docs": len(d["doc_id"]), "chunks": len(c["chunk_id"])} for d, c in zip(self.docs, self.chunks,
                                                                                        strict=True)]

    def tables(self) -> list[tuple[pa.Table, pa.Table] | None]:
        """Per shard its (documents, chunks) fragment as Arrow tables; None for a shard that received no rows."""
        return [(pa.table(d, schema=FRAGMENT_DOCS), pa.table(c, schema=FRAGMENT_CHUNKS)) if d["doc_id"] else None
                for d, c in zip(self.docs, self.chunks, strict=True)]

    def write(self, work: Path) -> list[dict[str, int]]:
        """Two files per shard that received rows (``fragment_key``); returns per shard {"docs": n, "chunks": n}."""
        store = FolderStore(Path(work))
        for shard, fragment in enumerate(self.tables()):
            if fragment is not None:
                docs = fragment[0]
                write_fragment(store, fragment_key("", shard, (self.split, docs["position"][0].as_py()),
                                                   (self.split, docs["position"][-1].as_py())), *fragment)
        return self.counts()


FRAGMENTS = "fragments"  # <work>/fragments/<shard>/: each shard's fragments


def fragment_key(prefix: str, shard: int, first: tuple[int, int], last: tuple[int, int]) -> str:
    """The key of a fragment's documents file under ``prefix``, named by its first and last rows' (split, position):
    a shard's fragments sort by their first rows, and whether they follow one another shows in their names. Its
    chunks file is ``chunks_key`` of it."""
    folder = f"{prefix.rstrip('/')}/{FRAGMENTS}" if prefix else FRAGMENTS
    return f"{folder}/{shard_name(shard)}/{first[0]:06d}-{first[1]:012d}_{last[0]:06d}-{last[1]:012d}.docs.parquet"


def fragment_range(docs_key: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (split, position) of a fragment's first and last rows, from its key."""
    first, last = docs_key.rsplit("/", 1)[1].removesuffix(".docs.parquet").split("_")
    return tuple(map(int, first.split("-"))), tuple(map(int, last.split("-")))


def chunks_key(docs_key: str) -> str:
    return docs_key[:-len(".docs.parquet")] + ".chunks.parquet"


def write_fragment(store: Store, docs_key: str, docs: pa.Table, chunks: pa.Table) -> int:
    """A fragment's two tables written as Parquet (compressed: they cross the network to the shard's node); returns
    the bytes written."""
    written = 0
    for key, table in ((docs_key, docs), (chunks_key(docs_key), chunks)):
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue().to_pybytes()
        store.put(key, data, durable=False)  # a rerun reads the corpus again
        written += len(data)
    return written


def read_fragment(store: Store, docs_key: str) -> tuple[pa.Table, pa.Table]:
    """A fragment's (documents, chunks) tables."""
    tables = []
    for key in (docs_key, chunks_key(docs_key)):
        with store.open(key) as f:
            tables.append(pq.read_table(f))
    return tuple(tables)


def fragments_of(work: Path, shard: int) -> list[str]:
    """The keys (under ``work``) of a shard's fragment files written there, in corpus order."""
    folder = Path(work) / FRAGMENTS / shard_name(shard)
    if not folder.is_dir():
        return []
    return [f"{FRAGMENTS}/{shard_name(shard)}/{f.name}" for f in sorted(folder.glob("*.docs.parquet"))]


def _read_into(split: Split, num_shards: int, chunk_size: int, chunk_overlap: int, id_fields: tuple[str, ...],
               text_fields: tuple[str, ...], strict: bool) -> tuple[FragmentWriter, list[tuple[str, int, str]]]:
    """The split parsed and chunked: its rows per shard, and its bad records as (file, line, reason)."""
    writer = FragmentWriter(num_shards, chunk_size, chunk_overlap, split.index)
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
    """Parse and chunk one split into per-shard fragment files under ``work``, in this process (tests, benchmarks).
    Returns the counts per shard and the split's bad records. Duplicate ids are found later, per shard (an id always
    hashes to the same shard)."""
    writer, bad = _read_into(split, num_shards, chunk_size, chunk_overlap, id_fields, text_fields, strict)
    return {"split": split.index, "shards": writer.write(Path(work)), "bad": bad}
