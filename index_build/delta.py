"""A corpus given as a change to a version already built: its documents, with some upserted and some
deleted (``--changes FILE``, ``--deletes FILE``), as the full corpus would have them.

Every version stores its documents (``documents.parquet`` in each shard, in corpus order within the
shard), so the base version's documents can be read back exactly. The new corpus is: the base's
documents shard by shard, a changed document in its old place, deleted ones left out, and new ones at
the end in the order of the changes file. Since a document's shard depends only on its id and each
shard keeps corpus order, this gives every shard the same rows a full build of the same corpus gives.

Bad records in the changes file are reported as in any corpus; an id to delete that the base does not
hold, or one both changed and deleted, is reported as a bad record too, never dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

from .corpus import BadRecord, Document, iter_documents, resolve_corpus_file
from .manifest import DOCUMENTS_FILE, IndexMismatch
from .versions import read_version_manifest


def read_delete_ids(path: Path, id_fields: tuple[str, ...]) -> Iterator[tuple[str, int] | BadRecord]:
    """Ids to delete, one per line: a bare id, or a JSON object or string holding one."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line_no, raw in enumerate(f, start=1):
            text = raw.strip()
            if not text:
                continue
            if text.startswith(("{", '"')):
                try:
                    value = json.loads(text)
                except json.JSONDecodeError as e:
                    yield BadRecord(str(path), line_no, f"malformed JSON: {e}")
                    continue
                if isinstance(value, dict):
                    value = next((value[k] for k in id_fields if k in value), None)
                if not isinstance(value, str | int) or isinstance(value, bool) or not str(value).strip():
                    yield BadRecord(str(path), line_no, f"no id (looked for {', '.join(id_fields)})")
                    continue
                text = str(value).strip()
            yield text, line_no


def base_documents(version_dir: Path) -> Iterator[Document]:
    """A built version's documents, shard by shard, each shard in corpus order."""
    manifest = read_version_manifest(version_dir)
    for shard in manifest.shards:
        path = version_dir / "shards" / shard / DOCUMENTS_FILE
        if not path.is_file():
            raise IndexMismatch(f"version {version_dir.name!r} does not store its documents ({shard} has no "
                                f"{DOCUMENTS_FILE}; it was built by an older release): build once from the full corpus, "
                                "then deltas apply to that version")
        table = pq.read_table(path)
        for row in table.to_pylist():
            yield Document(doc_id=row["doc_id"], title=row["title"], text=row["text"],
                           metadata=json.loads(row["metadata_json"]), source=row["source"])


def delta_documents(version_dir: Path, changes: Path | None, deletes: Path | None,
                    id_fields: tuple[str, ...], text_fields: tuple[str, ...],
                    report: dict | None = None) -> Iterator[Document | BadRecord]:
    """The documents of ``version_dir`` with ``changes`` upserted and ``deletes`` removed (see the module)."""
    report = report if report is not None else {}
    upserts: dict[str, Document] = {}
    order: list[str] = []
    if changes is not None:
        for item in iter_documents(resolve_corpus_file(changes), id_fields, text_fields):
            if isinstance(item, BadRecord):
                yield item
                continue
            upserts[item.doc_id] = item
            order.append(item.doc_id)
    doomed: dict[str, tuple[str, int]] = {}
    if deletes is not None:  # its existence was checked when the build fingerprinted it
        for item in read_delete_ids(Path(deletes), id_fields):
            if isinstance(item, BadRecord):
                yield item
                continue
            doc_id, line = item
            if doc_id in upserts:
                yield BadRecord(str(deletes), line, f"id {doc_id!r} is both changed and deleted; kept the change")
                continue
            doomed[doc_id] = (str(deletes), line)
    replaced = deleted = 0
    for doc in base_documents(version_dir):
        if doc.doc_id in doomed:
            del doomed[doc.doc_id]
            deleted += 1
            continue
        changed = upserts.pop(doc.doc_id, None)
        if changed is not None:
            replaced += 1
            yield changed
        else:
            yield doc
    for file, line in doomed.values():
        yield BadRecord(file, line, "no document with this id in the base version; nothing deleted")
    added = 0
    for doc_id in order:
        if doc_id in upserts:
            added += 1
            yield upserts.pop(doc_id)
    report.update(base=version_dir.name, replaced=replaced, added=added, deleted=deleted)
