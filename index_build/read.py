"""The build's read on Ray Data: the corpus's files scanned, their splits read, parsed and chunked, and each shard's
rows written once, as Parquet fragments, into the build's staging area.

    scan    ray.data.from_items(files).map(ScanFile)             a file's sha256 and its splits, a task a file
    read    ray.data.read_datasource(corpus_splits(splits))      a read task a split: its raw records, in order
    parse   .map_batches(parse_and_chunk)                        documents, their chunks and shard; bad records
    write   .write_datasink(FragmentSink(...))                   each shard's rows of a block, as two Parquet files

Ray Data fuses read, parse and write into one task a split, runs those tasks on every node that may read the
corpus, streams blocks between them with backpressure, retries what a lost node was running, and counts each
operator's rows, bytes, time and nodes (``stage_report``). Ray Data cannot cut one JSONL file at line starts, nor
number its lines, so the scan does (``splits.plan_file``, where the file is): a 100M-line file is read by many tasks,
and every record is still named ``file:line`` as one reader would name it.

Where each runs: a corpus in object storage is scanned and read by any node, each task reading its byte range with
ranged reads; a local corpus only on the driver's node, the only one that has its files. The fragments go to the
store of the build's root (its staging area: ``staging/<build key>/_work/fragments/<shard>/``): object storage,
from any node, for a root there; the root's folder, on the driver's node, for a local root. The write returns
what it wrote for each shard (files, documents, chunks) and the bad records; the driver checks every assembled shard
against those counts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasink

from index_format.chunking import chunk_document
from index_format.records import metadata_json
from index_format.sharding import shard_of
from index_format.store import open_store

from .corpus import BadRecord, Document, record_to_document
from .splits import (
    FRAGMENT_CHUNKS,
    FRAGMENT_DOCS,
    Split,
    decode,
    fragment_key,
    plan_file,
    raw_records,
    write_fragment,
)

READ_BLOCK_ROWS = 8192  # raw records a read task hands on at a time
RAW = pa.schema([("split", pa.int32()), ("position", pa.int64()), ("raw", pa.binary()), ("pickled", pa.bool_())])
_CHUNK_FIELDS = [f for f in FRAGMENT_CHUNKS if f.name not in ("split", "position")]
PARSED = pa.schema([
    ("shard", pa.int32()), *[f for f in FRAGMENT_DOCS], ("chunks", pa.list_(pa.struct(_CHUNK_FIELDS))),
    ("bad", pa.string()),
])


def _node() -> str:
    """The node this task runs on ("" outside Ray: a test calling a stage's function)."""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


# ---------------------------------------------------------------- scan


def scan_file(row: dict, split_bytes: int) -> dict:
    """Ray Data ``map``: one corpus file's sha256 and its splits (``plan_file``), where the file is read."""
    splits, sha = plan_file(row["file"], split_bytes)
    return {"index": row["index"], "file": row["file"], "sha256": sha, "node": _node(),
            "splits": [asdict(s) for s in splits]}


def scan_corpus(files: list[str], split_bytes: int, where: dict) -> tuple[list[Split], dict[str, str], dict]:
    """Every file scanned in its own task: the corpus's splits in corpus order (numbered), file -> sha256, and the
    stage's report."""
    t = time.perf_counter()
    ds = ray.data.from_items([{"index": i, "file": f} for i, f in enumerate(files)], override_num_blocks=len(files))
    ds = ds.map(scan_file, fn_kwargs={"split_bytes": split_bytes}, num_cpus=1, **where)
    rows = sorted(ds.take_all(), key=lambda r: r["index"])
    splits: list[Split] = []
    for row in rows:
        for s in row["splits"]:
            splits.append(Split(**(s | {"index": len(splits)})))
    report = {"nodes": sorted({r["node"] for r in rows}), "rows": len(rows), "bytes": None,
              "seconds": round(time.perf_counter() - t, 3)}
    return splits, {r["file"]: r["sha256"] for r in rows}, report


# ---------------------------------------------------------------- read


class TaskSource(Datasource):
    """A Ray Data datasource of one read task a piece of work: ``tasks`` holds each task's function (a generator of
    Arrow blocks) and the files it reads (None: none to name). ``name`` is what its operator is called."""

    def __init__(self, name: str, tasks: list[tuple[Callable[[], Iterator[pa.Table]], list[str] | None]]):
        super().__init__()
        self.name, self.tasks = name, tasks

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_name(self) -> str:
        return self.name

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context=None) -> list:
        return [ReadTask(read, BlockMetadata(num_rows=None, size_bytes=None, input_files=files, exec_stats=None))
                for read, files in self.tasks]


def corpus_splits(splits: list[Split]) -> TaskSource:
    """One read task a split, yielding its raw records (``splits.raw_records``) in order."""
    return TaskSource("CorpusSplits", [(_reader(s), [s.file]) for s in splits])


def _reader(split: Split):
    def read():
        lines, raws, pickled = [], [], []
        for line, raw, is_pickled in raw_records(split):
            lines.append(line)
            raws.append(raw)
            pickled.append(is_pickled)
            if len(lines) == READ_BLOCK_ROWS:
                yield _raw_block(split.index, lines, raws, pickled)
                lines, raws, pickled = [], [], []
        if lines:
            yield _raw_block(split.index, lines, raws, pickled)

    return read


def _raw_block(split: int, lines: list[int], raws: list[bytes], pickled: list[bool]) -> pa.Table:
    return pa.table({"split": pa.array([split] * len(lines), pa.int32()), "position": lines, "raw": raws,
                     "pickled": pickled}, schema=RAW)


# ---------------------------------------------------------------- parse


class ParsedRows:
    """Rows of ``PARSED`` built up one document (or bad record) at a time: the parse step's output, for the corpus's
    records and for a delta's documents alike."""

    def __init__(self, num_shards: int, chunk_size: int, chunk_overlap: int):
        self.num_shards, self.chunk_size, self.chunk_overlap = num_shards, chunk_size, chunk_overlap
        self.cols: dict[str, list] = {name: [] for name in PARSED.names if name != "chunks"}
        self.chunk_cols: dict[str, list] = {f.name: [] for f in _CHUNK_FIELDS}
        self.offsets = [0]

    def bad(self, split: int, position: int, reason: str) -> None:
        self.cols["split"].append(split)
        self.cols["position"].append(position)
        for key in ("doc_id", "title", "text", "metadata_json", "source"):
            self.cols[key].append(None)
        self.cols["shard"].append(-1)
        self.cols["bad"].append(reason)
        self.offsets.append(self.offsets[-1])

    def document(self, split: int, position: int, doc: Document, as_json: str | None = None) -> None:
        """``doc`` with its chunks and its shard; ``as_json``: its metadata as stored, when the caller has it."""
        as_json = metadata_json(doc.metadata) if as_json is None else as_json
        self.cols["split"].append(split)
        self.cols["position"].append(position)
        for key, value in (("doc_id", doc.doc_id), ("title", doc.title), ("text", doc.text),
                           ("metadata_json", as_json), ("source", doc.source)):
            self.cols[key].append(value)
        self.cols["shard"].append(shard_of(doc.doc_id, self.num_shards))
        self.cols["bad"].append(None)
        n = 0
        for chunk in chunk_document(doc, self.chunk_size, self.chunk_overlap):
            for key, value in chunk.row(as_json).items():
                self.chunk_cols[key].append(value)
            n += 1
        self.offsets.append(self.offsets[-1] + n)

    def table(self) -> pa.Table:
        chunks = pa.StructArray.from_arrays([pa.array(self.chunk_cols[f.name], f.type) for f in _CHUNK_FIELDS],
                                            fields=_CHUNK_FIELDS)
        arrays = {name: pa.array(self.cols[name], PARSED.field(name).type) for name in self.cols}
        arrays["chunks"] = pa.ListArray.from_arrays(pa.array(self.offsets, pa.int32()), chunks)
        return pa.table([arrays[name] for name in PARSED.names], schema=PARSED)


def parse_and_chunk(batch: pa.Table, names: list[str], num_shards: int, chunk_size: int, chunk_overlap: int,
                    id_fields: tuple[str, ...], text_fields: tuple[str, ...]) -> pa.Table:
    """Ray Data ``map_batches``: each raw record as a document with its chunks and its shard, or as a bad record
    (``bad``: why; ``shard`` -1). ``names``: each split's file, which records and bad records are named by."""
    out = ParsedRows(num_shards, chunk_size, chunk_overlap)
    for split, line, raw, pickled in zip(batch["split"].to_pylist(), batch["position"].to_pylist(),
                                         batch["raw"].to_pylist(), batch["pickled"].to_pylist(), strict=True):
        name = names[split]
        value = decode(raw, pickled, name, line)
        doc = value if isinstance(value, BadRecord) else record_to_document(value, (name, line), id_fields,
                                                                           text_fields)
        if isinstance(doc, BadRecord):
            out.bad(split, line, doc.reason)
        else:
            out.document(split, line, doc)
    return out.table()


def chunk_documents(batch: pa.Table, num_shards: int, chunk_size: int, chunk_overlap: int) -> pa.Table:
    """Ray Data ``map_batches``: documents already parsed (``FRAGMENT_DOCS`` rows: a delta's) chunked, with their
    shard, as the parse step gives them."""
    out = ParsedRows(num_shards, chunk_size, chunk_overlap)
    for row in batch.to_pylist():
        doc = Document(row["doc_id"], row["title"], row["text"], json.loads(row["metadata_json"]), row["source"])
        out.document(row["split"], row["position"], doc, row["metadata_json"])
    return out.table()


# ---------------------------------------------------------------- write


class WorkAreaSink(Datasink):
    """A Ray Data datasink writing into the build's work area ``work_at``; what each write task returned is kept on
    the driver (``results``)."""

    def __init__(self, work_at: str):
        self.work_at = work_at
        self.results: list[dict] = []

    def on_write_complete(self, write_result) -> None:
        self.results = list(write_result.write_returns)


class FragmentSink(WorkAreaSink):
    """A write task's rows, each shard's sorted into corpus order and written as one fragment
    (``splits.write_fragment``) in the work area (a folder, or a prefix in object storage). Returns, per task, what
    each shard got (its fragments' keys, documents, chunks), the bad records and the task's node."""

    def get_name(self) -> str:
        return "Fragments"

    def write(self, blocks, ctx) -> dict:
        return write_fragments(pa.concat_tables(list(blocks)), self.work_at)


def write_fragments(table: pa.Table, work_at: str) -> dict:
    """``FragmentSink``'s write: the rows of ``table`` (``PARSED``) as one fragment a shard, in the work area."""
    store = open_store(work_at)
    out: dict = {"node": _node(), "shards": {}, "bad": [], "bytes": 0}
    if table.num_rows == 0:
        return out
    bad = table.filter(pc.equal(table["shard"], -1))
    out["bad"] = list(zip(bad["split"].to_pylist(), bad["position"].to_pylist(), bad["bad"].to_pylist(),
                          strict=True))
    good = table.filter(pc.not_equal(table["shard"], -1))
    # One fragment a shard and split: a task that read one split (a corpus's) writes one a shard; a delta's task
    # writes its base shard's rows and its new documents apart, so that the base's fragments never overlap.
    parts = good.group_by(["shard", "split"]).aggregate([]).sort_by([("shard", "ascending"), ("split", "ascending")])
    for shard, split in zip(parts["shard"].to_pylist(), parts["split"].to_pylist(), strict=True):
        rows = good.filter(pc.and_(pc.equal(good["shard"], shard), pc.equal(good["split"], split))).sort_by(
            [("position", "ascending")])
        docs = rows.select(FRAGMENT_DOCS.names).cast(FRAGMENT_DOCS)
        parents = pc.list_parent_indices(rows["chunks"])
        flat = pc.list_flatten(rows["chunks"])
        chunk_arrays = {f.name: pc.struct_field(flat, f.name) for f in _CHUNK_FIELDS}
        chunk_arrays["split"] = pc.take(rows["split"], parents)
        chunk_arrays["position"] = pc.take(rows["position"], parents)
        chunks = pa.table([chunk_arrays[name] for name in FRAGMENT_CHUNKS.names], schema=FRAGMENT_CHUNKS)
        key = fragment_key("", shard, (docs["split"][0].as_py(), docs["position"][0].as_py()),
                           (docs["split"][-1].as_py(), docs["position"][-1].as_py()))
        out["bytes"] += write_fragment(store, key, docs, chunks)
        got = out["shards"].setdefault(shard, {"keys": [], "docs": 0, "chunks": 0})
        got["keys"].append(key)
        got["docs"] += docs.num_rows
        got["chunks"] += chunks.num_rows
    return out


# ---------------------------------------------------------------- the stage


def show_progress(enabled: bool) -> None:
    """Ray Data's progress bars and its log lines (each dataset's plan and end) on the console, or neither."""
    import logging

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = enabled
    ctx.enable_operator_progress_bars = enabled
    logging.getLogger("ray.data").setLevel(logging.INFO if enabled else logging.ERROR)


@dataclass
class ReadResult:
    """What the read gave: each shard's fragment keys (in corpus order) and counts, the bad records as (split,
    position, reason) sorted, and each stage's report."""

    fragments: list[list[str]]
    counts: list[dict[str, int]]
    bad: list[tuple[int, int, str]] = field(default_factory=list)
    stages: dict = field(default_factory=dict)


def placement(node: str | None) -> dict:
    """Ray Data's arguments keeping a stage's tasks on ``node`` (None: wherever Ray Data puts them)."""
    return {} if node is None else {"label_selector": {"ray.io/node-id": node}}


def read_corpus(splits: list[Split], num_shards: int, chunk_size: int, chunk_overlap: int,
                id_fields: tuple[str, ...], text_fields: tuple[str, ...], work_at: str,
                node: str | None) -> ReadResult:
    """Read, parse and write the fragments of every split (on ``node``, or anywhere when None)."""
    where = placement(node)
    names = [s.name for s in splits]
    ds = ray.data.read_datasource(corpus_splits(splits), override_num_blocks=len(splits), num_cpus=1, **where)
    ds = ds.map_batches(parse_and_chunk, batch_size=None, batch_format="pyarrow", num_cpus=1, fn_kwargs={
        "names": names, "num_shards": num_shards, "chunk_size": chunk_size, "chunk_overlap": chunk_overlap,
        "id_fields": tuple(id_fields), "text_fields": tuple(text_fields)}, **where)
    return write_shard_fragments(ds, num_shards, work_at, where, "read+parse+write")


def write_shard_fragments(ds, num_shards: int, work_at: str, where: dict, stage: str) -> ReadResult:
    """Run ``ds`` (rows of ``PARSED``) into a ``FragmentSink`` in the work area ``work_at``; what it wrote, as the
    build's read gives it: each shard's fragments and counts, the bad records, and the stage's report (``stage``: the
    operator Ray Data fused the pipeline into; its rows are the records read, its bytes the fragments')."""
    sink = FragmentSink(work_at)
    ds.write_datasink(sink, ray_remote_args={"num_cpus": 1, **where})
    result = ReadResult([[] for _ in range(num_shards)], [{"docs": 0, "chunks": 0} for _ in range(num_shards)])
    for written in sink.results:
        result.bad.extend(written["bad"])
        for shard, got in written["shards"].items():
            result.fragments[shard].extend(got["keys"])
            result.counts[shard]["docs"] += got["docs"]
            result.counts[shard]["chunks"] += got["chunks"]
    for keys in result.fragments:
        keys.sort()
    result.bad.sort()
    report = stage_report(ds, sorted({w["node"] for w in sink.results}))
    name, got = list(report.items())[-1] if report else ("", {"seconds": None, "nodes": []})
    result.stages = {stage: got | {
        "operator": name, "rows": sum(c["docs"] for c in result.counts) + len(result.bad),
        "bytes": sum(w["bytes"] for w in sink.results)}}
    return result


def stage_report(ds, nodes: list[str] | None = None) -> dict:
    """Each Ray Data operator the dataset ran, in pipeline order: its rows, bytes, seconds and the nodes its tasks ran
    on (``nodes`` where Ray Data's statistics do not say)."""
    try:
        summaries = _chain(ds.get_stats_summary(), lambda s: s.operators_stats)
    except Exception:  # statistics are a report, never a reason to fail a build
        return {}
    by_op = _nodes_by_operator(ds)
    out = {}
    for op in summaries:
        out[op.operator_name] = {
            "rows": op.output_num_rows.sum if op.output_num_rows else None,
            "bytes": op.output_size_bytes.sum if op.output_size_bytes else None,
            "seconds": round(op.time_total_s, 3), "nodes": by_op.get(op.operator_name) or nodes or []}
    return out


def _chain(stats, items) -> list:
    """What ``items`` gives of a statistics object and of its parents, the first operator first."""
    out = []
    while stats is not None:
        out[:0] = list(items(stats))
        stats = stats.parents[0] if stats.parents else None
    return out


def _nodes_by_operator(ds) -> dict[str, list[str]]:
    """The nodes each operator's tasks ran on, from the blocks' execution statistics."""
    try:
        stats = ds._write_ds._raw_stats() if getattr(ds, "_write_ds", None) is not None else ds._raw_stats()
        return {name: sorted({b.exec_stats.node_id for b in blocks if b.exec_stats is not None})
                for name, blocks in _chain(stats, lambda s: s.metadata.items())}
    except Exception:
        return {}
