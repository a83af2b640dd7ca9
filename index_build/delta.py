"""A corpus given as a change to a version already built: its documents, with some upserted and some
deleted (``--changes FILE``, ``--deletes FILE``), as the full corpus would have them.

Every version stores its documents (``documents.parquet`` in each shard, in corpus order within the
shard), so the base version's documents can be read back exactly. The new corpus is: the base's
documents shard by shard, a changed document in its old place, deleted ones left out, and new ones at
the end in the order of the changes file. Since a document's shard depends only on its id and each
shard keeps corpus order, this gives every shard the same rows a full build of the same corpus gives.

Bad records in the changes file are reported as in any corpus; an id to delete that the base does not
hold, or one both changed and deleted, is reported as a bad record too, never dropped silently.

It runs as read tasks like any corpus: one task parses the changes and deletes, one task per base shard
applies them to that shard's documents, and a last one adds the new documents; the driver holds none.
These tasks pass files to each other in the build's work folder (the parsed changes, the ids used, the
fragments) and read the base version fetched on the driver's node: ``build`` runs them all there, and the
shards' tasks of a delta build too (they read the fragment files). A delta build is one node's work, safe on a
cluster whose nodes share no disk but not spread over it; a corpus build is read by Ray Data (``read``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from index_format.manifest import DOCUMENTS_FILE, IndexMismatch
from index_format.records import metadata_json

from .corpus import BadRecord, Document, iter_documents, resolve_corpus_file
from .splits import FRAGMENT_DOCS, FragmentWriter


def read_delete_ids(path: Path, id_fields: tuple[str, ...], name: str | None = None) -> Iterator[tuple[str, int] | BadRecord]:
    """Ids to delete, one per line: a bare id, or a JSON object or string holding one. Bad records name the file
    ``name`` (default: its path)."""
    name = name or str(path)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line_no, raw in enumerate(f, start=1):
            text = raw.strip()
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


def _delta_dir(work: Path) -> Path:
    return Path(work) / "delta"


def parse_delta(changes: str | None, deletes: str | None, work: str, id_fields: tuple[str, ...],
                text_fields: tuple[str, ...], names: dict[str, str] | None = None) -> dict:
    """Ray task: the changes file parsed (its bad records and repeated ids reported) and the ids to delete,
    both kept in the work folder for the tasks that apply them. Returns the bad records, in file order.
    ``names``: what records call the "changes" and "deletes" files, when not their paths (the URLs they were
    downloaded from)."""
    names = names or {}
    folder = _delta_dir(Path(work))
    folder.mkdir(parents=True, exist_ok=True)
    bad: list[tuple[str, int, str]] = []
    rows: dict[str, list] = {name: [] for name in FRAGMENT_DOCS.names}
    upserts: set[str] = set()
    if changes is not None:
        for item in iter_documents(resolve_corpus_file(Path(changes)), id_fields, text_fields, names.get("changes")):
            if isinstance(item, BadRecord):
                bad.append((item.file, item.line, item.reason))
                continue
            upserts.add(item.doc_id)
            for name, value in (("doc_id", item.doc_id), ("title", item.title), ("text", item.text),
                                ("metadata_json", metadata_json(item.metadata)),
                                ("source", item.source), ("split", 0), ("position", len(rows["doc_id"]))):
                rows[name].append(value)
    pq.write_table(pa.table(rows, schema=FRAGMENT_DOCS), folder / "changes.parquet")
    doomed: dict[str, list] = {"doc_id": [], "file": [], "line": []}
    if deletes is not None:  # its existence was checked when the build fingerprinted it
        deletes_name = names.get("deletes") or str(deletes)
        for item in read_delete_ids(Path(deletes), id_fields, deletes_name):
            if isinstance(item, BadRecord):
                bad.append((item.file, item.line, item.reason))
                continue
            doc_id, line = item
            if doc_id in upserts:
                bad.append((deletes_name, line, f"id {doc_id!r} is both changed and deleted; kept the change"))
                continue
            for name, value in (("doc_id", doc_id), ("file", deletes_name), ("line", line)):
                doomed[name].append(value)
    pq.write_table(pa.table(doomed, schema=pa.schema([("doc_id", pa.string()), ("file", pa.string()),
                                                       ("line", pa.int64())])), folder / "deletes.parquet")
    return {"bad": bad}


def apply_to_base_shard(base_shard: str, work: str, split: int, num_shards: int, chunk_size: int,
                        chunk_overlap: int) -> dict:
    """Ray task: one shard of the base version with the changes applied, as one read split: every document
    in its place, a changed one replaced, a deleted one left out. Notes which changes and deletes it used."""
    folder = _delta_dir(Path(work))
    path = Path(base_shard) / DOCUMENTS_FILE
    if not path.is_file():
        raise IndexMismatch(f"version {Path(base_shard).parent.parent.name!r} does not store its documents "
                            f"({Path(base_shard).name} has no {DOCUMENTS_FILE}; it was built by an older release): "
                            "build once from the full corpus, then deltas apply to that version")
    changes = pq.read_table(folder / "changes.parquet")
    changed = {doc_id: i for i, doc_id in enumerate(changes["doc_id"].to_pylist())}
    doomed = set(pq.read_table(folder / "deletes.parquet", columns=["doc_id"])["doc_id"].to_pylist())
    writer = FragmentWriter(num_shards, chunk_size, chunk_overlap, split)
    used: list[str] = []
    replaced = deleted = 0
    position = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=8192):
        for row in batch.to_pylist():
            position += 1
            doc_id = row["doc_id"]
            if doc_id in doomed:
                used.append(doc_id)
                deleted += 1
                continue
            if doc_id in changed:
                used.append(doc_id)
                replaced += 1
                row = changes.slice(changed[doc_id], 1).to_pylist()[0]
            writer.add(Document(row["doc_id"], row["title"], row["text"], json.loads(row["metadata_json"]),
                                row["source"]), position)
    pq.write_table(pa.table({"doc_id": used}, schema=pa.schema([("doc_id", pa.string())])),
                   folder / f"used-{split:06d}.parquet")
    return {"split": split, "shards": writer.write(Path(work)), "bad": [], "replaced": replaced,
            "deleted": deleted}


def add_new_documents(work: str, split: int, num_shards: int, chunk_size: int, chunk_overlap: int) -> dict:
    """Ray task, after every base shard's: the changes no base document took, in the order of the changes
    file, as the last read split; an id to delete that no base shard held is a bad record."""
    folder = _delta_dir(Path(work))
    used = set()
    for path in sorted(folder.glob("used-*.parquet")):
        used.update(pq.read_table(path)["doc_id"].to_pylist())
    writer = FragmentWriter(num_shards, chunk_size, chunk_overlap, split)
    added = 0
    for row in pq.read_table(folder / "changes.parquet").to_pylist():
        if row["doc_id"] not in used:
            added += 1
            writer.add(Document(row["doc_id"], row["title"], row["text"], json.loads(row["metadata_json"]),
                                row["source"]), row["position"])
    bad = [(r["file"], r["line"], "no document with this id in the base version; nothing deleted")
           for r in pq.read_table(folder / "deletes.parquet").to_pylist() if r["doc_id"] not in used]
    return {"split": split, "shards": writer.write(Path(work)), "bad": bad, "added": added}
