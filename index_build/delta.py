"""A corpus given as a change to a version already built: its documents, with some upserted and some
deleted (``--changes FILE``, ``--deletes FILE``), as the full corpus would have them.

Every version stores its documents (``documents.parquet`` in each shard, in corpus order within the
shard), so the base version's documents can be read back exactly. The new corpus is: the base's
documents shard by shard, a changed document in its old place, deleted ones left out, and new ones at
the end in the order of the changes file. Since a document's shard depends only on its id and each
shard keeps corpus order, this gives every shard the same rows a full build of the same corpus gives.

It is the build's read pipeline on Ray Data, with the base version as its input:

    changes  read_datasource(corpus_splits) -> map_batches(parse_changes) -> ChangesSink
             the changes file read in splits like a corpus, each document filed under the base shard its id hashes
             to (``delta/changes/<base shard>/``), malformed records reported
    deletes  from_items -> map(parse_deletes)      the ids to delete, filed the same way (``delta/deletes/``)
    apply    read_datasource(delta_shards) -> map_batches(read.chunk_documents) -> read.FragmentSink
             a read task a base shard: its documents streamed from the base version with its changes and deletes
             applied, then its changes the base did not hold (new documents, numbered after every base shard); the
             fragments written as a corpus's are

Every file passes through the build's work area (``build.work_area``) and the base's documents are read where the
version is (its blobs in object storage, or its folder): for a root in object storage every stage runs on any node,
a changes or deletes file on this node's disk being read on this node. A changes record repeated (its first kept),
an id both changed and deleted (the change kept) and an id to delete that the base does not hold are bad records,
never dropped silently; each apply task writes its counts and bad records as a report (``delta/reports/``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray.data

from index_format.manifest import DOCUMENTS_FILE, IndexMismatch
from index_format.records import metadata_json
from index_format.sharding import shard_of
from index_format.store import open_store

from .corpus import BadRecord, record_to_document
from .read import (
    ReadResult,
    TaskSource,
    WorkAreaSink,
    chunk_documents,
    corpus_splits,
    placement,
    stage_report,
    write_shard_fragments,
)
from .splits import FRAGMENT_DOCS, Split, decode

DELTA = "delta"
CHANGES = pa.schema([*FRAGMENT_DOCS, ("base_shard", pa.int32()), ("bad", pa.string())])
DELETES = pa.schema([("doc_id", pa.string()), ("line", pa.int64())])


@dataclass
class DeltaInput:
    """What a delta reads: the base version's name and each of its shards' documents (a file, or a blob's URL), the
    changes (a file or URL, and the name its records are called by) and the deletes file."""

    base: str
    documents: list[str]
    changes: str | None = None
    deletes: str | None = None
    names: dict[str, str] = field(default_factory=dict)


def read_delete_ids(lines: Iterable[bytes], id_fields: tuple[str, ...], name: str) -> Iterator[tuple[str, int] | BadRecord]:
    """Ids to delete, one per line: a bare id, or a JSON object or string holding one. Bad records name the file
    ``name``."""
    for line_no, raw in enumerate(lines, start=1):
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            continue
        if text.startswith(("{", '"')):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                yield BadRecord(name, line_no, f"malformed JSON: {e}")
                continue
            if isinstance(value, dict):
                value = next((value[k] for k in id_fields if k in value), None)
            if not isinstance(value, str | int) or isinstance(value, bool) or not str(value).strip():
                yield BadRecord(name, line_no, f"no id (looked for {', '.join(id_fields)})")
                continue
            text = str(value).strip()
        yield text, line_no


# ---------------------------------------------------------------- the changes and the deletes, filed by base shard


def parse_changes(batch: pa.Table, name: str, base_shards: int, id_fields: tuple[str, ...],
                  text_fields: tuple[str, ...]) -> pa.Table:
    """Ray Data ``map_batches``: each raw record of the changes file as a document and the base shard its id hashes
    to, or a bad record (``bad``: why)."""
    cols: dict[str, list] = {n: [] for n in CHANGES.names}
    for split, line, raw, pickled in zip(batch["split"].to_pylist(), batch["position"].to_pylist(),
                                         batch["raw"].to_pylist(), batch["pickled"].to_pylist(), strict=True):
        value = decode(raw, pickled, name, line)
        doc = value if isinstance(value, BadRecord) else record_to_document(value, (name, line), id_fields, text_fields)
        good = not isinstance(doc, BadRecord)
        for key, v in (("doc_id", doc.doc_id if good else None), ("title", doc.title if good else None),
                       ("text", doc.text if good else None),
                       ("metadata_json", metadata_json(doc.metadata) if good else None),
                       ("source", doc.source if good else None), ("split", split), ("position", line),
                       ("base_shard", shard_of(doc.doc_id, base_shards) if good else -1),
                       ("bad", None if good else doc.reason)):
            cols[key].append(v)
    return pa.table(cols, schema=CHANGES)


class ChangesSink(WorkAreaSink):
    """Each base shard's changes of a write task, as one Parquet file in ``delta/changes/<base shard>/`` of the work
    area (named by its first record, so a retried task replaces its file); returns the bad records."""

    def get_name(self) -> str:
        return "Changes"

    def write(self, blocks, ctx) -> dict:
        table = pa.concat_tables(list(blocks))
        store = open_store(self.work_at)
        bad = table.filter(pc.equal(table["base_shard"], -1))
        for shard in sorted(set(pc.unique(table["base_shard"]).to_pylist()) - {-1}):
            rows = table.filter(pc.equal(table["base_shard"], shard)).sort_by([("position", "ascending")])
            store.put(f"{DELTA}/changes/{shard:06d}/{rows['position'][0].as_py():012d}.parquet",
                      _parquet(rows.drop_columns(["base_shard", "bad"])), durable=False)
        return {"bad": list(zip(bad["position"].to_pylist(), bad["bad"].to_pylist(), strict=True)),
                "rows": table.num_rows}


def parse_deletes(row: dict, work_at: str, base_shards: int, id_fields: tuple[str, ...]) -> dict:
    """Ray Data ``map``: the deletes file read where it is, its ids filed by base shard (``delta/deletes/<base
    shard>.parquet``); returns its bad records as (line, reason)."""
    from .inputs import open_input

    with open_input(row["deletes"]) as f:
        items = list(read_delete_ids(io.BytesIO(f.read()).readlines(), id_fields, row["name"]))
    bad = [(item.line, item.reason) for item in items if isinstance(item, BadRecord)]
    by_shard: dict[int, dict[str, list]] = {}
    for item in items:
        if not isinstance(item, BadRecord):
            cols = by_shard.setdefault(shard_of(item[0], base_shards), {"doc_id": [], "line": []})
            cols["doc_id"].append(item[0])
            cols["line"].append(item[1])
    store = open_store(work_at)
    for shard, cols in by_shard.items():
        store.put(f"{DELTA}/deletes/{shard:06d}.parquet", _parquet(pa.table(cols, schema=DELETES)), durable=False)
    return {"bad": json.dumps(bad), "rows": len(items)}


# ---------------------------------------------------------------- applied to the base, a shard a task


def delta_shards(delta: DeltaInput, work_at: str) -> TaskSource:
    """One read task a base shard, yielding its documents with the changes and deletes filed under it applied
    (``apply_to_base_shard``), then its new documents."""
    return TaskSource("DeltaShards", [
        (lambda s=s, loc=loc: apply_to_base_shard(s, loc, len(delta.documents), work_at, delta.names), [loc])
        for s, loc in enumerate(delta.documents)])


def apply_to_base_shard(shard: int, documents: str, base_shards: int, work_at: str,
                        names: dict[str, str]) -> Iterator[pa.Table]:
    """One base shard with its changes and deletes applied: every document in its place (split ``shard``, its row in
    the shard), a changed one replaced, a deleted one left out; then the changes no base document took (split
    ``base_shards``, after every base shard, at their line of the changes file). Its counts and bad records are
    written as its report."""
    from .inputs import open_input

    store = open_store(work_at)
    changes = _changes_of(store, shard)
    deletes = pq.read_table(io.BytesIO(store.get(f"{DELTA}/deletes/{shard:06d}.parquet"))) \
        if store.exists(f"{DELTA}/deletes/{shard:06d}.parquet") else DELETES.empty_table()
    bad: list[tuple[int, int, str, str]] = []  # (order, line, file, reason): the changes' first, then the deletes'
    changed: dict[str, dict] = {}
    for row in changes.to_pylist():
        first = changed.setdefault(row["doc_id"], row)
        if first is not row:
            bad.append((0, row["position"], names.get("changes", ""),
                        f"duplicate id {row['doc_id']!r} (first seen on line {first['position']}); kept the first"))
    doomed: dict[str, list[int]] = {}
    for doc_id, line in zip(deletes["doc_id"].to_pylist(), deletes["line"].to_pylist(), strict=True):
        if doc_id in changed:
            bad.append((1, line, names.get("deletes", ""), f"id {doc_id!r} is both changed and deleted; kept the change"))
        else:
            doomed.setdefault(doc_id, []).append(line)
    used, found = set(), set()
    replaced = deleted = 0
    position = 0
    with open_input(documents) as f:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=8192, columns=FRAGMENT_DOCS.names[:5]):
            out: dict[str, list] = {n: [] for n in FRAGMENT_DOCS.names}
            for row in batch.to_pylist():
                position += 1
                doc_id = row["doc_id"]
                if doc_id in doomed:
                    found.add(doc_id)
                    deleted += 1
                    continue
                if doc_id in changed:
                    used.add(doc_id)
                    replaced += 1
                    row = changed[doc_id]
                for name in FRAGMENT_DOCS.names[:5]:
                    out[name].append(row[name])
                out["split"].append(shard)
                out["position"].append(position)
            if out["doc_id"]:
                yield pa.table(out, schema=FRAGMENT_DOCS)
    new = [row | {"split": base_shards} for doc_id, row in changed.items() if doc_id not in used]
    if new:
        yield pa.Table.from_pylist(new, schema=FRAGMENT_DOCS)
    bad += [(1, line, names.get("deletes", ""), "no document with this id in the base version; nothing deleted")
            for doc_id, lines in doomed.items() if doc_id not in found for line in lines]
    store.put(f"{DELTA}/reports/{shard:06d}.json", json.dumps({
        "replaced": replaced, "deleted": deleted, "added": len(new), "bad": bad}).encode(), durable=False)


def _changes_of(store, shard: int) -> pa.Table:
    """The changes filed under base shard ``shard``, in the order of the changes file."""
    keys = sorted(store.list(f"{DELTA}/changes/{shard:06d}/"))
    if not keys:
        return FRAGMENT_DOCS.empty_table()
    return pa.concat_tables([pq.read_table(io.BytesIO(store.get(k))) for k in keys]).cast(FRAGMENT_DOCS)


def _parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


# ---------------------------------------------------------------- the stage


@dataclass
class DeltaResult:
    """What a delta's read gave: the fragments, counts and stages as a corpus's read gives them (its bad records as
    (order, line, file, reason) sorted: the changes file's, then the deletes file's), and what it did to the base."""

    read: ReadResult
    bad: list[tuple[int, int, str, str]]
    report: dict


def read_delta(delta: DeltaInput, change_splits: list[Split], num_shards: int, chunk_size: int, chunk_overlap: int,
               id_fields: tuple[str, ...], text_fields: tuple[str, ...], work_at: str, home: str,
               spread: bool) -> DeltaResult:
    """The delta's three stages (the module's docstring). ``spread``: the work area and the base are in object
    storage, so every stage may run on any node, but reading a local changes or deletes file (on ``home``)."""
    from index_format.store import is_remote

    anywhere = placement(None if spread else home)
    bad: list[tuple[int, int, str, str]] = []
    base_shards = len(delta.documents)
    stages: dict = {}
    if change_splits:
        where = placement(None if spread and is_remote(delta.changes) else home)
        ds = ray.data.read_datasource(corpus_splits(change_splits), override_num_blocks=len(change_splits), num_cpus=1,
                                      **where)
        ds = ds.map_batches(parse_changes, batch_size=None, batch_format="pyarrow", num_cpus=1, fn_kwargs={
            "name": delta.names["changes"], "base_shards": base_shards, "id_fields": tuple(id_fields),
            "text_fields": tuple(text_fields)}, **where)
        sink = ChangesSink(work_at)
        ds.write_datasink(sink, ray_remote_args={"num_cpus": 1, **where})
        bad += [(0, line, delta.names["changes"], reason) for r in sink.results for line, reason in r["bad"]]
        stages["changes"] = _stage(ds) | {"rows": sum(r["rows"] for r in sink.results)}
    if delta.deletes is not None:
        where = placement(None if spread and is_remote(delta.deletes) else home)
        ds = ray.data.from_items([{"deletes": delta.deletes, "name": delta.names["deletes"]}])
        ds = ds.map(parse_deletes, fn_kwargs={"work_at": work_at, "base_shards": base_shards,
                                              "id_fields": tuple(id_fields)}, num_cpus=1, **where)
        rows = ds.take_all()
        for row in rows:
            bad += [(1, line, delta.names["deletes"], reason) for line, reason in json.loads(row["bad"])]
        stages["deletes"] = _stage(ds) | {"rows": sum(row["rows"] for row in rows)}
    ds = ray.data.read_datasource(delta_shards(delta, work_at), override_num_blocks=base_shards, num_cpus=1, **anywhere)
    ds = ds.map_batches(chunk_documents, batch_size=None, batch_format="pyarrow", num_cpus=1, fn_kwargs={
        "num_shards": num_shards, "chunk_size": chunk_size, "chunk_overlap": chunk_overlap}, **anywhere)
    result = write_shard_fragments(ds, num_shards, work_at, anywhere, "apply+chunk+write")
    result.stages = stages | result.stages
    store = open_store(work_at)
    report = {"base": delta.base, "replaced": 0, "added": 0, "deleted": 0}
    for shard in range(base_shards):
        got = json.loads(store.get(f"{DELTA}/reports/{shard:06d}.json"))
        for key in ("replaced", "added", "deleted"):
            report[key] += got[key]
        bad += [tuple(b) for b in got["bad"]]
    return DeltaResult(result, sorted(bad), report)


def _stage(ds) -> dict:
    """The report of the operator a stage's pipeline was fused into (its last)."""
    report = stage_report(ds)
    return list(report.values())[-1] | {"operator": list(report)[-1]} if report else {"seconds": None, "nodes": []}


def base_documents(root: str, base: str, shards: list[str]) -> list[str]:
    """Where each shard of version ``base`` of ``root`` keeps its documents: a file of the root's folder, or the blob's
    URL in object storage (read by whichever node applies the delta)."""
    from index_format.versions import open_root

    locations = open_root(root).locations(base, [f"shards/{s}/{DOCUMENTS_FILE}" for s in shards])
    missing = [s for s, loc in zip(shards, locations, strict=True) if loc is None]
    if missing:
        raise IndexMismatch(f"version {base!r} does not store its documents ({missing[0]} has no {DOCUMENTS_FILE}; it "
                            "was built by an older release): build once from the full corpus, then deltas apply to "
                            "that version")
    return locations
