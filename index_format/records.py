"""A document as a record (the build's corpus lines, and the documents API's bodies) and as the index keeps it.

One reading of a record for both writers of an index: the build job (``index_build.corpus``) and the service's
documents API, so a document written either way is the same document (the same id, title, text and metadata,
and then the same chunks: ``index_format.chunking``). A record that cannot be one is a ``BadRecord`` naming
where it came from and why, never dropped silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

_TITLE_FIELDS = ("title",)


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # "file:line", for tracing a chunk back to its record


def metadata_json(metadata: dict[str, Any]) -> str:
    """Metadata as the index's tables store it: one JSON text, keys sorted, so equal metadata is equal bytes."""
    return json.dumps(metadata, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True)
class BadRecord:
    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


def _pick(record: dict[str, Any], names: tuple[str, ...]) -> tuple[str | None, Any]:
    for name in names:
        if name in record:
            return name, record[name]
    return None, None


def _metadata_value(value: Any) -> Any:
    """Scalars and lists of scalars stay as they are (filterable); anything else is kept as JSON text."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list) and all(isinstance(v, str | int | float | bool) for v in value):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def record_to_document(
    record: Any, where: tuple[str, int], id_fields: tuple[str, ...], text_fields: tuple[str, ...]
) -> Document | BadRecord:
    file, line = where
    if not isinstance(record, dict):
        return BadRecord(file, line, f"expected a JSON object, got {type(record).__name__}")
    id_name, doc_id = _pick(record, id_fields)
    if doc_id is None or (isinstance(doc_id, str) and not doc_id.strip()):
        return BadRecord(file, line, f"missing id (looked for {', '.join(id_fields)})")
    if not isinstance(doc_id, str | int) or isinstance(doc_id, bool):
        return BadRecord(file, line, f"id must be a string or integer, got {type(doc_id).__name__}")
    doc_id = str(doc_id).strip()
    text_name, text = _pick(record, text_fields)
    _, title = _pick(record, _TITLE_FIELDS)
    title = "" if title is None else str(title).strip()
    if text is not None and not isinstance(text, str):
        return BadRecord(file, line, f"doc {doc_id!r}: text field {text_name!r} must be a string")
    text = (text or "").strip()
    if not text and not title:
        return BadRecord(file, line, f"doc {doc_id!r}: empty text (looked for {', '.join(text_fields)})")
    skip = {id_name, text_name, *_TITLE_FIELDS}
    metadata: dict[str, Any] = {}
    nested = record.get("metadata")
    if isinstance(nested, dict):
        skip.add("metadata")
        metadata.update({k: _metadata_value(v) for k, v in nested.items()})
    metadata.update({k: _metadata_value(v) for k, v in record.items() if k not in skip})
    return Document(doc_id=doc_id, title=title, text=text, metadata=metadata, source=f"{file}:{line}")


def written_document(seq: int, record: dict[str, Any]) -> Document:
    """A document written through the API (a record of the change log, already checked: id, title, text,
    metadata) as the index keeps it, its source the write's sequence number: one reading for the fresh segment
    that serves it at once and the fold that puts it in a version, so both make the same chunks."""
    return Document(doc_id=record["id"], title=record.get("title") or "", text=record.get("text") or "",
                    metadata=dict(record.get("metadata") or {}), source=f"api:{seq}")
