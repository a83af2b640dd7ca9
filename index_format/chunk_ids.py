"""A chunk's id: ``<document id>#<chunk index>``, made and read here only.

Document ids may hold ``#`` themselves; the chunk index is always after the last one.
"""

from __future__ import annotations


def chunk_id(doc_id: str, chunk_index: int) -> str:
    return f"{doc_id}#{chunk_index}"


def doc_of(chunk_id: str) -> str:
    """The document id of a chunk id (``doc#1#3`` -> ``doc#1``)."""
    return chunk_id.rsplit("#", 1)[0]
