"""The sources an answer is written from: the final results numbered [1]..[n], their texts cut to a length.

Read by ``core`` and ``prompts`` (and by the engines through them), it imports neither, so the package's modules
import one another one way (``core`` -> ``prompts`` -> ``sources``; ``core`` makes the engines, which read ``prompts``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    n: int  # 1-based citation number
    chunk_id: str
    doc_id: str
    title: str
    text: str


def cut_text(text: str, max_chars: int) -> str:
    """``text`` if it fits in ``max_chars``, else its longest prefix ending on a word, plus "…" (within the limit).

    A text whose first word is longer than the limit is cut inside that word.
    """
    text = text.strip()
    if len(text) <= max_chars:
        return text
    if max_chars <= 1:
        return "…"[:max_chars]
    limit = max_chars - 1  # room for the ellipsis
    head = text[: limit + 1]  # one more character: a space there means the cut falls between words
    space = max((head.rfind(c) for c in " \t\n\r"), default=-1)
    cut = head[:space].rstrip() if space > 0 else ""
    return (cut or text[:limit]) + "…"


def sources_from_results(results: list[dict], max_sources: int, max_chars: int) -> list[Source]:
    """The first ``max_sources`` results as sources [1]..[n], in result order, texts cut by ``cut_text``.

    ``results`` are search ``Result`` models dumped to dicts (chunk_id, doc_id, title, content); a missing
    or null title or content counts as "".
    """
    return [
        Source(n, str(r["chunk_id"]), str(r["doc_id"]), r.get("title") or "",
               cut_text(r.get("content") or "", max_chars))
        for n, r in enumerate(results[: max(0, max_sources)], start=1)
    ]
