"""Highlight spans: where a returned text holds the query's terms, as BM25 matched them.

Why here and not in the browser: BM25 matches analyzed terms (Lucene's English analyzer: lower case, stopwords
out, Porter stems), so "galaxies" in a query matches "galaxy" in a text; marking the query's words as typed
misses that and marks stopwords. The spans are computed against the returned text itself: each word of it (a run
of word characters, with inner apostrophes: "galaxy's") is analyzed on its own by the same analyzer the index
and the query use, and marked when one of its terms is one of the query's. Words are analyzed once each and kept
(``Highlighter``): a result page repeats most of them, and each analysis is a call into the JVM.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from deployments.bounded import BoundedCache

_WORD = re.compile(r"\w+(?:['\u2019]\w+)*")
WORDS_KEPT = 100_000  # analyzed words kept (a few dozen bytes each), the least recently used dropped first


def spans(text: str, query_terms: set[str] | frozenset[str], terms_of: Callable[[str], Sequence[str]]
          ) -> list[tuple[int, int]]:
    """``[(start, end), ...]``: each word of ``text`` (``text[start:end]``) whose analyzed terms meet
    ``query_terms``, in text order. No query terms (a query of stopwords) mark nothing."""
    if not query_terms:
        return []
    return [(m.start(), m.end()) for m in _WORD.finditer(text) if not query_terms.isdisjoint(terms_of(m.group()))]


def lucene_analyzer() -> Callable[[str], list[str]]:
    """The keyword index's analyzer (``shard.lucene.QueryAnalyzer``), its JVM loaded at the first call."""
    held = []

    def analyze(text: str) -> list[str]:
        if not held:
            from deployments.shard.lucene import QueryAnalyzer

            held.append(QueryAnalyzer())
        return held[0].analyze(text)

    return analyze


class Highlighter:
    """Spans of a query's terms in texts, with one analyzer (Lucene's unless given) and its words kept."""

    def __init__(self, analyze: Callable[[str], list[str]] | None = None, kept: int = WORDS_KEPT):
        self.analyze = analyze or lucene_analyzer()
        self.words: BoundedCache[str, tuple[str, ...]] = BoundedCache(kept)

    def terms_of(self, word: str) -> tuple[str, ...]:
        terms = self.words.get(word)
        if terms is None:
            terms = tuple(self.analyze(word))
            self.words.put(word, terms)
        return terms

    def spans(self, query: str, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Each text's spans of ``query``'s terms (the query analyzed whole, as BM25 analyzes it)."""
        query_terms = frozenset(self.analyze(query))
        return [spans(text, query_terms, self.terms_of) for text in texts]
