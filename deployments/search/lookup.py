"""Documents by id and by filter: where a collection holds one (the fresh segment decides the ids it holds, the
version's shards the rest), its chunks in order, the text they came from, and whether a caller may see it (the rule
the shards apply to searches, so a document a caller may not see is answered exactly like one that does not
exist); and pages of documents in id order, listed without a query."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from deployments.search.clients import Collection
from deployments.shard.filters import FilterError, MetadataTable
from deployments.shard.query import DocumentsAnswer, DocumentsQuery, merged_pages
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


async def document_page(target: Collection, query: DocumentsQuery, timeout_s: float
                        ) -> tuple[list[dict[str, Any]], int, str | None]:
    """(a page of the collection's documents in id order, each as ``document_body`` makes it; how many match in all;
    the page's last id where more come after it, else None).
    The version's shards list theirs less the ids the fresh segment decides, the segment its own; the page's chunk
    rows are then read in one call a slot. Raises ``FilterError`` for a filter a shard or the segment refused."""
    fresh = target.fresh
    asked = replace(query, exclude=tuple(sorted(fresh.masked)) if fresh is not None else ())
    answers = await asyncio.wait_for(asyncio.gather(*(slot.documents(asked) for slot in target.shards)), timeout_s)
    version = merged_pages(list(answers), query.limit)
    written = fresh.list_documents(query) if fresh is not None else DocumentsAnswer()
    if version.filter_error or written.filter_error:
        raise FilterError(version.filter_error or written.filter_error)
    page = sorted([(i, c, "index") for i, c in zip(version.ids, version.chunks, strict=True)]
                  + [(i, c, "api") for i, c in zip(written.ids, written.chunks, strict=True)])[:query.limit]
    wanted = [chunk_id(i, n) for i, c, where in page if where == "index" for n in range(c)]
    found = await asyncio.wait_for(asyncio.gather(*(slot.fetch(wanted) for slot in target.shards)), timeout_s) \
        if wanted else []
    rows: dict[str, list[dict]] = {}
    for row in (r for part in found for r in part):
        rows.setdefault(row["doc_id"], []).append(row)
    documents = []
    for doc_id, _, where in page:
        if where == "api":
            _, _, chunk_ids = fresh.document(doc_id)
            held, seq = await fresh.fetch(chunk_ids), fresh.docs[doc_id].seq
        else:
            held, seq = sorted(rows.get(doc_id, []), key=lambda r: r["chunk_index"]), None
        if held:  # (a document gone between the two calls: a version switch; left out)
            documents.append(document_body(doc_id, where, held, seq))
    more = version.remaining + written.remaining > len(page)
    return documents, version.total + written.total, page[-1][0] if page and more else None
