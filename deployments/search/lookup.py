"""Documents by id: where a collection holds one (the fresh segment decides the ids it holds, the version's shards
the rest), its chunks in order, the text they came from, and whether a caller may see it (the rule the shards
apply to searches, so a document a caller may not see is answered exactly like one that does not exist)."""

from __future__ import annotations

import asyncio
from typing import Any

from deployments.search.clients import Collection
from deployments.shard.filters import FilterError, MetadataTable
from index_format.chunk_ids import chunk_id

CHUNKS_ASKED = 64  # chunk ids asked of the shards at once when a document's chunks are looked up


def visible(row: dict, acl_field: str | None, principals: list[str] | None, public: str) -> bool:
    """Whether these principals may see a chunk (with an ACL field: one of theirs, or the public principal,
    in its field; a chunk without the field is seen by nobody)."""
    if not acl_field:
        return True
    table = MetadataTable.from_json_column([row.get("metadata_json")])
    try:
        allowed = table.allowed_rows({acl_field: sorted(set(principals or ()) | {public})})
    except FilterError:
        return False
    return allowed is not None and len(allowed) > 0


async def chunk_rows(target: Collection, doc_id: str, timeout_s: float) -> tuple[str, list[dict], int | None]:
    """(where the document lives: "api", "index" or "" for nowhere, its chunk rows in order, the sequence number of
    the write that made it when it came through the API)."""
    fresh = target.fresh
    if fresh is not None:
        decided, document, chunk_ids = fresh.document(doc_id)
        if decided:
            seq = fresh.docs[doc_id].seq
            return ("api", await fresh.fetch(chunk_ids), seq) if document is not None else ("", [], seq)
    rows: list[dict] = []
    while True:  # the document's chunks are <doc id>#0, #1, ...: ask in pages until one comes back short
        wanted = [chunk_id(doc_id, i) for i in range(len(rows), len(rows) + CHUNKS_ASKED)]
        found = await asyncio.wait_for(asyncio.gather(*(slot.fetch(wanted) for slot in target.shards)), timeout_s)
        page = sorted((r for part in found for r in part), key=lambda r: r["chunk_index"])
        rows += page
        if len(page) < CHUNKS_ASKED:
            return ("index" if rows else "", rows, None)


def document_text(rows: list[dict]) -> str:
    """The document's text from its chunks (each is ``text[char_start:char_end]``; neighbours overlap)."""
    text, end = "", None
    for row in rows:
        if end is None:
            text = row["text"]
        elif row["char_start"] <= end:
            text += row["text"][end - row["char_start"]:]
        else:
            text += " " + row["text"]
        end = row["char_end"] if end is None else max(end, row["char_end"])
    return text


def document_body(doc_id: str, where: str, rows: list[dict], seq: int | None) -> dict[str, Any]:
    first = rows[0]
    return {"id": doc_id, "title": first["title"], "text": document_text(rows), "metadata": first["metadata"],
            "chunk_ids": [r["chunk_id"] for r in rows], "source": where, "seq": seq}
