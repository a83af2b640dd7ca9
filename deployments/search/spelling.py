"""Query spell correction against a collection's own vocabulary, Ray-free.

A query word the collection has never seen is replaced by the known word closest to it in Levenshtein
distance, the most frequent one (document frequency) among equally close words. How far a word may
be changed grows with its length, as Elasticsearch's ``fuzziness: AUTO`` does: words of 1-2 letters
are never changed, 3-5 letters by one edit, longer words by up to two. A word the vocabulary knows is
never changed, so a query whose words are all known comes back as it was. Numbers and words with
digits are left alone (model numbers, years).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rapidfuzz import process
from rapidfuzz.distance import Levenshtein

from deployments.shard.vocabulary import WORD


def allowed_edits(word: str) -> int:
    return 0 if len(word) <= 2 else (1 if len(word) <= 5 else 2)


@dataclass(frozen=True)
class Correction:
    original: str
    corrected: str
    edits: int
    df: int


class Speller:
    """One collection's (or several collections') vocabulary, ready to correct queries."""

    def __init__(self, df: Mapping[str, int]):
        self.df = dict(df)
        # Words by length: a word n edits away differs in length by n at most, so a suggestion looks only
        # at words within its allowed edits of the query word's length, not at the whole vocabulary.
        self._by_length: dict[int, list[str]] = {}
        for w in self.df:
            self._by_length.setdefault(len(w), []).append(w)

    def suggest(self, word: str) -> Correction | None:
        """The replacement of an unknown word, or None (known, too short, a number, or nothing close)."""
        w = word.lower()
        limit = allowed_edits(w)
        if w in self.df or limit == 0 or not w.isalpha():
            return None
        choices = [c for n in range(len(w) - limit, len(w) + limit + 1) for c in self._by_length.get(n, ())]
        found = process.extract(w, choices, scorer=Levenshtein.distance, score_cutoff=limit, limit=None)
        if not found:
            return None
        best, edits, _ = min(found, key=lambda m: (m[1], -self.df[m[0]], m[0]))
        return Correction(word, best, int(edits), self.df[best])

    def correct(self, query: str, max_words: int | None = None) -> tuple[str, list[Correction], int]:
        """(the query with unknown words replaced, the replacements made, unknown words left unchecked).
        Everything else of the query, spacing and punctuation included, is kept as it was. At most
        ``max_words`` unknown words are looked up (None: all); the rest stay as typed and are counted."""
        corrections: list[Correction] = []
        out, last = [], 0
        looked_up = unchecked = 0
        for m in WORD.finditer(query):
            w = m.group(0).lower()
            if w in self.df or allowed_edits(w) == 0 or not w.isalpha():
                continue
            if max_words is not None and looked_up >= max_words:
                unchecked += 1
                continue
            looked_up += 1
            fix = self.suggest(m.group(0))
            if fix is None:
                continue
            out += [query[last:m.start()], fix.corrected]
            last = m.end()
            corrections.append(fix)
        return "".join(out) + query[last:], corrections, unchecked
