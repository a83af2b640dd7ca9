"""Split documents into overlapping word windows that keep their place in the source.

A chunk's ``text`` is exactly ``document.text[char_start:char_end]``, so a citation can be traced back
and adjacent chunks can be merged at query time without guessing. A document no longer than
``chunk_size`` words stays whole (one chunk, index 0).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from index_format.chunk_ids import chunk_id
from index_format.records import Document, metadata_json

_WORD = re.compile(r"\S+")
# Markdown "# Heading" lines and setext headings (a line underlined with === or ---).
_HEADING = re.compile(r"^(?:#{1,6}[ \t]+(?P<atx>[^\n]+?)[ \t#]*|(?P<setext>[^\n]+)\n(?:=+|-+)[ \t]*)$", re.M)


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    doc_id: str
    chunk_index: int
    char_start: int
    char_end: int
    title: str
    section: str
    text: str
    metadata: dict[str, Any]
    source: str = ""  # "file:line" of the record the chunk came from

    def row(self, metadata_as_json: str | None = None) -> dict[str, Any]:
        """The chunk as a row of a shard's chunk table (``metadata_as_json``: its metadata already as JSON, when
        the caller has it), the same row whichever writer makes it: the build, a fold, a fresh segment."""
        return {"chunk_id": self.chunk_id, "doc_id": self.doc_id, "chunk_index": self.chunk_index,
                "char_start": self.char_start, "char_end": self.char_end, "title": self.title,
                "section": self.section, "text": self.text,
                "metadata_json": metadata_json(self.metadata) if metadata_as_json is None else metadata_as_json,
                "source": self.source}

    def contents(self, prepend_title: bool) -> str:
        """What BM25 and the encoder see: the chunk, with the document title in front when asked."""
        if prepend_title and self.title:
            return f"{self.title}\n{self.text}" if self.text else self.title
        return self.text or self.title


@dataclass(frozen=True)
class Chunking:
    """How documents are cut and read: the build's defaults (``index_build.config.BuildConfig`` takes them from
    here), and what a version's manifest records (``build_config``), so the API's writes and a fold chunk exactly
    as the build did."""

    chunk_size: int = 128  # words (whitespace tokens) in a chunk
    chunk_overlap: int = 24  # words shared by consecutive chunks of one document
    prepend_title: bool = True  # BM25 and the encoder see "title + text", not the text alone
    id_fields: tuple[str, ...] = ("_id", "id", "doc_id", "docid")  # tried in order for a record's id
    text_fields: tuple[str, ...] = ("text", "contents", "body")  # tried in order for a record's text

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Chunking:
        """The chunking a build config (a manifest's ``build_config``) names; what it leaves out is the default."""
        known: dict[str, Any] = {k: config[k] for k in ("chunk_size", "chunk_overlap", "prepend_title") if k in config}
        for k in ("id_fields", "text_fields"):
            if k in config:
                known[k] = tuple(config[k])
        return cls(**known)

    def chunks(self, doc: Document) -> list[Chunk]:
        return chunk_document(doc, self.chunk_size, self.chunk_overlap)


def _headings(text: str) -> list[tuple[int, str]]:
    out = []
    for m in _HEADING.finditer(text):
        name = (m.group("atx") or m.group("setext") or "").strip()
        if name:
            out.append((m.start(), name))
    return out


def chunk_document(doc: Document, chunk_size: int, chunk_overlap: int) -> list[Chunk]:
    """Word windows of ``chunk_size`` advancing by ``chunk_size - chunk_overlap`` words.

    The last window is not padded; a window that would only repeat the overlap is not emitted.
    """
    if chunk_overlap >= chunk_size:
        raise ValueError("chunk_overlap must be smaller than chunk_size")
    spans = [m.span() for m in _WORD.finditer(doc.text)]
    if len(spans) <= chunk_size:
        windows = [(0, len(spans))]
    else:
        step = chunk_size - chunk_overlap
        windows = []
        for start in range(0, len(spans), step):
            end = min(start + chunk_size, len(spans))
            windows.append((start, end))
            if end == len(spans):
                break
    headings = _headings(doc.text)
    chunks = []
    for i, (w0, w1) in enumerate(windows):
        char_start, char_end = (spans[w0][0], spans[w1 - 1][1]) if spans else (0, 0)
        section = doc.title
        for pos, name in headings:
            if pos > char_start:
                break
            section = name
        chunks.append(
            Chunk(
                chunk_id=chunk_id(doc.doc_id, i),
                doc_id=doc.doc_id,
                chunk_index=i,
                char_start=char_start,
                char_end=char_end,
                title=doc.title,
                section=section,
                text=doc.text[char_start:char_end],
                metadata=doc.metadata,
                source=doc.source,
            )
        )
    return chunks
