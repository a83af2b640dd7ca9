"""An answer from the best sentences of the top results, each cited: no generative model needed.

What a CPU node can always afford, and what a user can always check: every sentence is a source's own
words, so every citation holds (the attribution check confirms it). Sentences are scored by the query
words they hold, weighted by how rare each word is among the candidate sentences (idf), discounted
for a lower-ranked source and for length, so a short sentence of a top result that names the rarest query
words wins. Near-duplicates (the same sentence in two chunks of one document, or copied between
documents) are kept once. The picked sentences are ordered by their source's rank, then by their place
in it, so the answer reads in the results' order. Ray-free, model-free, deterministic.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from deployments.search.attribution import content_words, split_sentences

NOTHING_MATCHES = "None of the results says anything about the query's words."


@dataclass(frozen=True)
class Candidate:
    score: float
    n: int  # the source's number
    position: int  # the sentence's place in its source
    text: str
    words: frozenset[str]


def whole_sentence(sentence: str) -> bool:
    """Not a fragment: chunks and cut sources start and end mid-sentence ("seven degrees of freedom ...",
    "... from their residence (OR…"), and a fragment reads badly and says less than it seems to."""
    first = sentence.lstrip("\"'([")[:1]
    return bool(first) and not first.islower() and _STOP.search(sentence) is not None


_STOP = re.compile(r"[.!?][\"')\]]*$")


def candidates(query: str, sources: Sequence, whole_only: bool = True) -> list[Candidate]:
    """Every sentence of the sources with at least 3 content words (whole sentences only, unless
    ``whole_only`` is off), scored against the query."""
    query_words = set(content_words(query))
    raw = []
    for s in sources:
        for i, sentence in enumerate(split_sentences(s.text)):
            words = content_words(sentence)
            if len(words) >= 3 and (whole_sentence(sentence) or not whole_only):
                raw.append((s.n, i, sentence, words))
    if not raw:
        return []
    df: dict[str, int] = {}
    for *_, words in raw:
        for w in set(words) & query_words:
            df[w] = df.get(w, 0) + 1
    idf = {w: math.log(1 + len(raw) / d) for w, d in df.items()}
    out = []
    for n, i, sentence, words in raw:
        distinct = frozenset(words)
        matched = sum(idf.get(w, 0.0) for w in distinct & query_words)
        # A lower-ranked source and a long sentence both count against it, gently.
        score = matched / (1 + 0.15 * (n - 1)) / (1 + len(words) / 60)
        out.append(Candidate(score, n, i, sentence, distinct))
    return out


def pick(query: str, sources: Sequence, max_sentences: int = 4, max_chars: int = 900) -> list[Candidate]:
    """The best-scoring sentences, near-duplicates once, within ``max_sentences`` and ``max_chars``, in the
    order they are read: by source rank, then place."""
    chosen: list[Candidate] = []
    used = 0
    scored = candidates(query, sources)
    if not any(c.score > 0 for c in scored):  # only fragments hold the query's words: better than nothing
        scored = candidates(query, sources, whole_only=False)
    for c in sorted(scored, key=lambda c: (-c.score, c.n, c.position)):
        if c.score <= 0 or len(chosen) >= max_sentences:
            break
        if any(len(c.words & p.words) >= 0.6 * min(len(c.words), len(p.words)) for p in chosen):
            continue  # says what an already chosen sentence says
        if chosen and used + len(c.text) > max_chars:
            continue
        chosen.append(c)
        used += len(c.text) + 1
    return sorted(chosen, key=lambda c: (c.n, c.position))


class ExtractiveEngine:
    """An engine that writes from the sources directly (``write``), instead of from chat messages."""

    name = "extractive"

    def __init__(self, max_sentences: int = 4, max_chars: int = 900):
        self.max_sentences, self.max_chars = max_sentences, max_chars

    def write(self, query: str, sources: Sequence) -> str:
        chosen = pick(query, sources, self.max_sentences, self.max_chars)
        if not chosen:
            return NOTHING_MATCHES
        return " ".join(f"{c.text} [{c.n}]" for c in chosen)

    def stream_write(self, query: str, sources: Sequence) -> Iterator[str]:
        """The same answer a sentence at a time."""
        text = self.write(query, sources)
        for i, sentence in enumerate(split_sentences(text)):
            yield sentence if i == 0 else " " + sentence
