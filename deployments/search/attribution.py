"""Every sentence of an answer attributed to the results that support it, checked here, not by the model.

A small model cites unreliably (the demo's SmolLM2 cited nothing, or a source that does not say what the
sentence says), and even a large one is not always deployed, so citing cannot be left to the model. After
any engine writes an answer, each sentence is checked against the sources:
- a marker ``[n]`` the model wrote is kept when source n supports the sentence, removed when it does not;
- a sentence left without a marker gets the best supporting source, when one supports it;
- a sentence no source supports is kept, marked ``supported: false``;
- a sentence that repeats an earlier one (the same words, give or take a few) is dropped;
- a fenced code block is kept as written and never cited (it is no claim a source can back).

Support is lexical and explainable: the share of the sentence's content words (lower-cased, stop words
out, a plural "s" off) found among the source's words, in [0, 1], with ``min_support`` (0.5) as the bar.
A sentence copied from a source scores 1.0; a paraphrase scores lower, and may honestly come out
unsupported. Ray-free and model-free: it runs wherever the answer is written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)
# A sentence ends at . ! or ? (and any closing quote or bracket after it) before white space or the end;
# the markers a model puts after the period ("... true. [2] Next") stay with the sentence before them.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?:[ \t]*\[[0-9,\s\-–—]+\])*(?=\s|$)")
STOP_WORDS = frozenset(["a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "yourself", "yourselves", "also", "may", "might", "must", "shall", "however", "thus"])
MIN_SUPPORT = 0.5
MAX_RANGE = 64  # a marker like [1-999999] is read as its two ends, not expanded into a million ids
MAX_ID_DIGITS = 18  # longer digit runs are not ids (and int() of a huge one can raise): dropped, not listed
# A citation marker: [1], [1, 3], [1-3]; group 1 is the space before it, group 2 its body.
MARKER = re.compile(r"([ \t]*)\[\s*([0-9]+(?:\s*[-–—]\s*[0-9]+)?(?:\s*,\s*[0-9]+(?:\s*[-–—]\s*[0-9]+)?)*)\s*\]")
_ITEM = re.compile(r"([0-9]+)(?:\s*[-–—]\s*([0-9]+))?")


def _as_id(digits: str) -> int | None:
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= MAX_ID_DIGITS else None


def marker_ids(body: str) -> list[int | None]:
    """Ids of one marker's body, in order: ranges expanded (either direction) when at most MAX_RANGE long."""
    ids: list[int | None] = []
    for m in _ITEM.finditer(body):
        lo, hi = _as_id(m.group(1)), _as_id(m.group(2)) if m.group(2) else None
        if m.group(2) is None:
            ids.append(lo)
        elif lo is not None and hi is not None and abs(hi - lo) < MAX_RANGE:
            step = 1 if hi >= lo else -1
            ids.extend(range(lo, hi + step, step))
        else:
            ids.extend([lo, hi])
    return ids


REPEAT_OVERLAP = 0.8  # a sentence sharing this share of its words with an earlier one repeats it


def content_words(text: str) -> list[str]:
    """Lower-cased words that carry meaning: stop words and one-character words out, plurals made singular
    (so "cells" supports "cell")."""
    out = []
    for w in WORD.findall(text.lower()):
        if w in STOP_WORDS or len(w) < 2:
            continue
        out.append(_singular(w))
    return out


def _singular(w: str) -> str:
    """A crude plural strip, the same on both sides of a comparison: cells -> cell, searches -> search,
    studies -> study; words of 3 letters or fewer and -ss words stay."""
    if len(w) <= 3 or not w.endswith("s") or w.endswith("ss"):
        return w
    if w.endswith("ies") and len(w) > 4:
        return w[:-3] + "y"
    if w.endswith(("ches", "shes", "xes", "sses", "zes")):
        return w[:-2]
    return w[:-1]


_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)  # a fenced code block (a model may leave the last one open)


def is_code(unit: str) -> bool:
    return unit.startswith("```")


def split_sentences(text: str) -> list[str]:
    """The answer's sentences, in order, each with the markers written right after it; a fenced code block
    is one unit of its own, as written."""
    out, pos = [], 0
    for m in _FENCE.finditer(text):
        out += _prose_sentences(text[pos:m.start()])
        out.append(m.group(0).strip())
        pos = m.end()
    return out + _prose_sentences(text[pos:])


def _prose_sentences(text: str) -> list[str]:
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        out.append(text[start:m.end()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


def support(sentence_words: Sequence[str], source_words: set[str]) -> float:
    """Share of a sentence's content words the source holds; 0.0 for a sentence without any."""
    if not sentence_words:
        return 0.0
    return sum(w in source_words for w in sentence_words) / len(sentence_words)


@dataclass
class AttributedSentence:
    text: str  # the sentence with its checked markers, as it stands in the answer's text
    citations: list[int]  # source numbers that support it, best first
    supported: bool
    support: float  # the best support among its citations (or of any source, when it has none)


@dataclass
class Attribution:
    text: str
    sentences: list[AttributedSentence]
    cited: list[int]  # every source number cited, in order of first use
    removed: list[int]  # numbers the model wrote that were dropped (not a source, or not supporting), once each
    added: list[int] = field(default_factory=list)  # numbers the service added to sentences the model left bare
    repeats_dropped: int = 0


def _strip_markers(sentence: str) -> tuple[str, list[int | None]]:
    ids: list[int | None] = []
    for m in MARKER.finditer(sentence):
        ids.extend(marker_ids(m.group(2)))
    bare = MARKER.sub("", sentence)
    bare = re.sub(r"\s+([.,;:!?])", r"\1", bare)  # "true [2]." -> "true."
    return re.sub(r"\s{2,}", " ", bare).strip(), ids


_TRAILING_MARKERS = re.compile(r"^(.*?\S)([.!?][\"')\]]*)((?:[ \t]*\[[0-9,\s\-–—]+\])+)$", re.S)


def _with_markers(sentence: str, ids: Sequence[int]) -> str:
    if not ids:
        return sentence
    marks = "".join(f"[{n}]" for n in ids)
    end = re.search(r"[.!?][\"')\]]*$", sentence)
    if end:
        return f"{sentence[:end.start()]} {marks}{sentence[end.start():]}"
    return f"{sentence} {marks}"


def attribute(text: str, sources: dict[int, str], min_support: float = MIN_SUPPORT) -> Attribution:
    """Check and complete an answer's citations against ``sources`` (number -> source text); see the
    module docstring for the rules.

    A marker vouches for the words written before it, back to the previous marker or the sentence's start
    (``"BM25 ranks terms [1], FAISS searches vectors [2]."``: [1] for the first clause, [2] for the second),
    or for its whole sentence; it is kept where it stands when its source supports either. Markers that
    are kept keep their place; a sentence left bare gets its best source's marker before its final stop.
    """
    words_of = {n: set(content_words(t)) for n, t in sources.items()}
    sentences: list[AttributedSentence] = []
    cited: list[int] = []
    removed: list[int] = []
    added: list[int] = []
    seen: list[set[str]] = []
    repeats = 0
    for raw in split_sentences(text):
        if is_code(raw):  # code is not a claim a source can back: kept as written, never cited
            sentences.append(AttributedSentence(raw, [], False, 0.0))
            continue
        bare, _ = _strip_markers(raw)
        if not bare:
            continue
        words = content_words(bare)
        distinct = set(words)
        if distinct and any(len(distinct & s) >= REPEAT_OVERLAP * max(len(distinct), len(s)) for s in seen):
            repeats += 1
            continue
        seen.append(distinct)
        whole = {n: support(words, w) for n, w in words_of.items()}
        kept: list[int] = []
        best = 0.0
        out, last, claim_from = [], 0, 0
        claim: list[str] = []
        for m in MARKER.finditer(raw):
            segment = content_words(raw[claim_from:m.start()])
            if segment:
                claim = segment  # adjacent markers ([1][2]) vouch for the same words
            claim_from = m.end()
            ids = [i for i in dict.fromkeys(marker_ids(m.group(2))) if i is not None]
            good = []
            for n in ids:
                score = max(support(claim, words_of[n]), whole[n]) if n in words_of else 0.0
                if score >= min_support:
                    good.append(n)
                    best = max(best, score)
                elif n not in removed:
                    removed.append(n)
            kept.extend(n for n in good if n not in kept)
            out.append(raw[last:m.start()])
            if good:
                out.append(m.group(0) if good == ids else f"{m.group(1)}[{', '.join(map(str, good))}]")
            last = m.end()
        out.append(raw[last:])
        sentence = re.sub(r"[ \t]+([.,;:!?])", r"\1", "".join(out)).strip()
        # Markers written after the final stop ("... true. [2]") go before it, as everywhere else.
        sentence = _TRAILING_MARKERS.sub(lambda m: f"{m.group(1)} {m.group(3).strip()}{m.group(2)}", sentence)
        if not kept and whole:
            top = max(whole, key=lambda n: (whole[n], -n))
            if whole[top] >= min_support:
                kept, best = [top], whole[top]
                sentence = _with_markers(sentence, kept)
                if top not in added:
                    added.append(top)
        if not kept:
            best = max(whole.values(), default=0.0)
        for n in kept:
            if n not in cited:
                cited.append(n)
        sentences.append(AttributedSentence(sentence, kept, bool(kept), round(best, 4)))
    text = ""
    for i, s in enumerate(sentences):  # code blocks on lines of their own, prose sentences joined by a space
        gap = "\n" if i and (is_code(s.text) or is_code(sentences[i - 1].text)) else (" " if i else "")
        text += gap + s.text
    return Attribution(text, sentences, cited, removed, added, repeats)
