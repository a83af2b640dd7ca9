"""Query text before retrieval: normalization, synonym expansion, and conversation history."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence


def normalize_query(text: str) -> str:
    """NFKC-normalized text with runs of whitespace collapsed to one space and the ends stripped.

    Case and punctuation are kept: BM25 analyzes the query as text (Lucene syntax characters are not
    interpreted), and the encoder is case-aware. Empty or blank input: ``""``.
    """
    return " ".join(unicodedata.normalize("NFKC", text).split())


def _phrase(words: str) -> re.Pattern[str] | None:
    """Case-insensitive whole-word pattern for a word or phrase (any whitespace between its words)."""
    parts = words.split()
    if not parts:
        return None
    return re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, parts)) + r"(?!\w)", re.IGNORECASE)


def expand_synonyms(query: str, synonyms: Mapping[str, Sequence[str]]) -> tuple[str, list[str]]:
    """``(expanded query, added terms)``: for each key found in the query, its synonyms are appended.

    A key matches as a whole word or phrase, ignoring case (``"db"`` matches ``"DB"`` but not ``"dbms"``).
    A synonym is added only if it is not already in the query or among the terms added so far (the same
    whole-word test). Only the original query is searched for keys, so expansion is not transitive.
    Order: keys in mapping order, then each key's synonyms in order. Nothing matched: ``(query, [])``.
    """
    added: list[str] = []
    expanded = query
    for key, terms in synonyms.items():
        pattern = _phrase(key)
        if pattern is None or not pattern.search(query):
            continue
        for term in terms:
            term_pattern = _phrase(term)
            if term_pattern is None or term_pattern.search(expanded):
                continue
            added.append(term)
            expanded = f"{expanded} {term}" if expanded else term
    return expanded, added


def expand_with_history(query: str, history: Sequence[dict | str], turns: int = 2, max_chars: int = 500) -> str:
    """The query followed by the last ``turns`` user turns, most recent first, adding at most ``max_chars``.

    A follow-up ("and in 2019?") retrieves poorly on its own; the previous user turns carry its subject.
    History items are ``{"role": ..., "content": ...}`` dicts (only role "user" with string content counts)
    or plain strings (taken as user turns). Turns are whitespace-normalized; empty ones and ones equal to
    the query (ignoring case: clients often send the current message as the last turn) are skipped. Each
    added turn costs its length plus one separating space; the turn that would pass ``max_chars`` is cut
    on a word boundary and later ones are left out. No usable history: the query unchanged.
    """
    same = normalize_query(query).casefold()
    user_turns = []
    for item in history:
        content = item if isinstance(item, str) else item.get("content") if item.get("role") == "user" else None
        if isinstance(content, str):
            text = normalize_query(content)
            if text and text.casefold() != same:
                user_turns.append(text)
    added = ""
    for text in reversed(user_turns[-turns:] if turns > 0 else []):
        room = max_chars - len(added) - 1
        if len(text) > room:
            text = text[: room + 1].rsplit(" ", 1)[0] if room > 0 else ""
            if len(text) > room:  # no space to cut at: the first word alone is too long
                text = ""
            if text:
                added += " " + text
            break
        added += " " + text
    if not added:
        return query
    return query + added if query else added[1:]
