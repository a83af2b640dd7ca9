"""Corpus readers: a BEIR folder, a JSONL file or a Parquet file, as one stream of documents.

Bad records are never dropped silently: each becomes a ``BadRecord`` naming the file and line (row for
Parquet) and why, so the build can count and report them, or stop at the first one in strict mode.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from index_format.manifest import sha256_file
from index_format.records import BadRecord, Document, record_to_document  # noqa: F401 - the job's readers make them


class CorpusError(ValueError):
    """The corpus cannot be read at all, or a record is bad while running in strict mode."""


CORPUS_SUFFIXES = (".jsonl", ".json", ".parquet", ".pq")


def corpus_files(path: Path) -> list[Path]:
    """The files a corpus is read from, in corpus order: one file; a BEIR folder's ``corpus.jsonl``; else every
    .jsonl and .parquet file of a folder, or every file a glob pattern (``data/part-*.parquet``) matches,
    sorted by name."""
    text = str(path)
    if any(c in text for c in "*?["):
        parent = Path(text).parent
        files = sorted(f for f in parent.glob(Path(text).name) if f.is_file())
        if not files:
            raise CorpusError(f"no file matches {text}")
    elif Path(path).is_dir() and not any((Path(path) / n).is_file() for n in ("corpus.jsonl", "corpus.parquet")):
        files = sorted(f for f in Path(path).iterdir() if f.is_file() and f.suffix.lower() in CORPUS_SUFFIXES)
        if not files:
            raise CorpusError(f"{path} is a folder without corpus.jsonl and without .jsonl or .parquet files: expected "
                              "a BEIR folder, a folder of corpus files, a .jsonl or a .parquet file")
    else:
        return [resolve_corpus_file(path)]
    for f in files:
        if f.suffix.lower() not in CORPUS_SUFFIXES:
            raise CorpusError(f"unsupported corpus file {f}: expected .jsonl or .parquet")
    return files


def resolve_corpus_file(path: Path) -> Path:
    """The file that holds the documents: ``corpus.jsonl`` inside a BEIR folder, else the path itself."""
    path = Path(path)
    if path.is_dir():
        for name in ("corpus.jsonl", "corpus.parquet"):
            if (path / name).is_file():
                return path / name
        raise CorpusError(f"{path} is a folder without corpus.jsonl: expected a BEIR folder, a .jsonl or a .parquet file")
    if not path.exists():
        raise CorpusError(f"corpus not found: {path}")
    if path.suffix.lower() not in (".jsonl", ".json", ".parquet", ".pq"):
        raise CorpusError(f"unsupported corpus file {path}: expected .jsonl or .parquet (or a BEIR folder)")
    return path


def fingerprint(path: Path) -> str:
    """Content hash of the corpus file, so a resumed build notices a corpus that changed under it."""
    return sha256_file(path)


def _iter_jsonl(path: Path, name: str | None = None) -> Iterator[tuple[Any, int] | BadRecord]:
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield json.loads(raw), line_no
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                yield BadRecord(name or str(path), line_no, f"malformed JSON: {e}")


def _iter_parquet(path: Path, name: str | None = None) -> Iterator[tuple[Any, int] | BadRecord]:
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise CorpusError(f"cannot read parquet file {name or path}: {e}") from e
    row = 0
    for batch in pf.iter_batches(batch_size=4096):
        for record in batch.to_pylist():
            row += 1
            yield record, row


def iter_documents(
    path: Path,
    id_fields: tuple[str, ...] = ("_id", "id", "doc_id", "docid"),
    text_fields: tuple[str, ...] = ("text", "contents", "body"),
    name: str | None = None,
) -> Iterator[Document | BadRecord]:
    """Every record of the corpus as a Document or a BadRecord; duplicate ids after the first are bad. Records
    name their file ``name`` (default: its path; a URL the file was downloaded from)."""
    file = resolve_corpus_file(path)
    rows = _iter_parquet(file, name) if file.suffix.lower() in (".parquet", ".pq") else _iter_jsonl(file, name)
    seen: dict[str, int] = {}
    name = name or os.fspath(file)
    for item in rows:
        if isinstance(item, BadRecord):
            yield item
            continue
        record, line = item
        doc = record_to_document(record, (name, line), id_fields, text_fields)
        if isinstance(doc, Document):
            first = seen.setdefault(doc.doc_id, line)
            if first != line:
                doc = BadRecord(name, line, f"duplicate id {doc.doc_id!r} (first seen on line {first}); kept the first")
        yield doc
