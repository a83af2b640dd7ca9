"""Context assembly: the final ranked chunks become numbered passages that fit a token budget.

Chunks are word windows with exact character offsets into their document (``index_format.chunking``), so
overlapping neighbours can be merged back into the source text without guessing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_WORD = re.compile(r"\S+")


def whitespace_token_count(text: str) -> int:
    """Tokens as whitespace-separated words: cheap, and an under-estimate of subword tokens by ~1.3x."""
    return len(text.split())


@dataclass(frozen=True)
class Passage:
    doc_id: str
    chunk_ids: tuple[str, ...]  # in document order
    title: str
    section: str
    text: str  # document.text[char_start:char_end]
    char_start: int
    char_end: int
    score: float  # the best member's score
    citation: int  # 1-based, in passage (rank) order
    trimmed: bool = False  # cut on a word boundary to fit the token budget


@dataclass
class _Group:
    rank: int  # position of the best-ranked member in the input
    members: list[dict[str, Any]]  # in document order
    text: str
    char_start: int
    char_end: int
    score: float


def _consistent(row: dict[str, Any]) -> bool:
    return len(row["text"]) == row["char_end"] - row["char_start"]


def _groups(rows: list[dict[str, Any]], merge_adjacent: bool) -> list[_Group]:
    """One group per chunk, or, when merging, per run of same-document chunks whose ranges touch or overlap."""
    rank_of = {row["chunk_id"]: i for i, row in enumerate(rows)}
    by_doc: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_doc.setdefault(row["doc_id"], []).append(row)
    groups = []
    for doc_rows in by_doc.values():
        ordered = sorted(doc_rows, key=lambda r: (r["char_start"], r.get("chunk_index", 0), r["chunk_id"]))
        current: _Group | None = None
        for row in ordered:
            rank, score = rank_of[row["chunk_id"]], float(row["score"])
            # Merging needs text that matches its offsets; a row that does not is kept on its own.
            if (merge_adjacent and current is not None and _consistent(row) and _consistent(current.members[-1])
                    and row["char_start"] <= current.char_end):
                if row["char_end"] > current.char_end:
                    current.text += row["text"][current.char_end - row["char_start"]:]
                    current.char_end = row["char_end"]
                current.members.append(row)
                current.rank, current.score = min(current.rank, rank), max(current.score, score)
                continue
            current = _Group(rank, [row], row["text"], row["char_start"], row["char_end"], score)
            groups.append(current)
    return sorted(groups, key=lambda g: g.rank)


def _trim(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    """The longest prefix of ``text`` ending on a word that counts at most ``budget`` tokens ("" if none)."""
    ends = [m.end() for m in _WORD.finditer(text)]
    lo, hi = 0, len(ends)  # invariant: a prefix of `lo` words fits; binary search assumes counts grow with words
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(text[: ends[mid - 1]]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[: ends[lo - 1]] if lo else ""


def assemble(
    rows: Sequence[dict[str, Any]],
    token_budget: int = 2000,
    merge_adjacent: bool = True,
    count_tokens: Callable[[str], int] = whitespace_token_count,
) -> tuple[list[Passage], dict[str, Any]]:
    """Numbered passages from the final ranked rows, within ``token_budget`` tokens.

    ``rows`` are best first, each with doc_id, chunk_id, chunk_index, char_start, char_end, title, section,
    text and score; a repeated chunk id counts once (its first row). With ``merge_adjacent``, chunks of one
    document whose character ranges touch or overlap (neighbouring windows share ``chunk_overlap`` words)
    become one passage: ``text = first.text + second.text[first.char_end - second.char_start:]``, i.e.
    ``document.text[first.char_start:second.char_end]``. A merged passage takes the position of its
    best-ranked member and the maximum score; title and section come from its first chunk in the document.
    Windows separated by a gap (``chunk_overlap = 0``) are not merged: the text between them is unknown.

    Passages are taken in rank order while they fit; the one that crosses the budget is cut after its last
    whole word that fits (``trimmed``, ``char_end`` moved, members cut away entirely listed as dropped) and
    every later passage is dropped. Citations are 1..n in passage order.

    Returns ``(passages, info)``, ``info = {"tokens": used, "budget": token_budget, "dropped": [chunk ids
    not included, in rank order], "trimmed": [citation numbers]}``. No rows: ``([], info)`` with 0 tokens.
    """
    if token_budget < 0:
        raise ValueError(f"token_budget must be >= 0, got {token_budget}")
    unique: dict[str, dict[str, Any]] = {}
    for row in rows:
        unique.setdefault(row["chunk_id"], row)
    passages: list[Passage] = []
    included: set[str] = set()
    trimmed: list[int] = []
    used = 0
    for group in _groups(list(unique.values()), merge_adjacent):
        if trimmed:  # a passage was cut to fit: the budget is spent
            break
        text, cut = group.text, False
        tokens = count_tokens(text)
        if used + tokens > token_budget:
            text, cut = _trim(text, token_budget - used, count_tokens), True
            if not text:
                break
            tokens = count_tokens(text)
        char_end = group.char_start + len(text) if cut else group.char_end
        members = [m for m in group.members if not cut or m["char_start"] < char_end]
        first = group.members[0]
        passage = Passage(first["doc_id"], tuple(m["chunk_id"] for m in members), first.get("title", ""),
                          first.get("section", ""), text, group.char_start, char_end, group.score,
                          citation=len(passages) + 1, trimmed=cut)
        if cut:
            trimmed.append(passage.citation)
        passages.append(passage)
        included.update(passage.chunk_ids)
        used += tokens
    dropped = [cid for cid in unique if cid not in included]
    return passages, {"tokens": used, "budget": token_budget, "dropped": dropped, "trimmed": trimmed}


def citations(passages: Sequence[Passage]) -> list[dict[str, Any]]:
    """The citation list that goes with the passages: one dict per passage, numbered as they are."""
    return [
        {"id": p.citation, "doc_id": p.doc_id, "chunk_ids": list(p.chunk_ids), "title": p.title,
         "section": p.section, "char_start": p.char_start, "char_end": p.char_end}
        for p in passages
    ]
