"""Citations in a model's reply: markers parsed and checked against the sources, echoed source blocks cut, and
the quoting that keeps a source's text from writing tags of its own.

Which result a number stands for is decided here, never by the model: markers with ids outside 1..n are removed
from the text and listed, and only valid ids become citations.
"""

from __future__ import annotations

import re

from deployments.search.attribution import MARKER, marker_ids


def quote(text: str) -> str:
    """Text safe inside a delimited block: ``<`` and ``>`` escaped, so no tag (ours or the chat template's
    special tokens, e.g. ``<|im_end|>``) can be written by a document."""
    return text.replace("<", "&lt;").replace(">", "&gt;")


# [1]  [1, 3]  [1-3]  [1–3]; spaces allowed inside. Adjacent markers ([1][2]) are separate matches. The
# leading horizontal space is part of the match so that a marker removed entirely takes its space with it.
_CLOSES = set(".,;:!?)]}'\"")


def parse_citations(text: str, valid: set[int]) -> tuple[str, list[int], list[int]]:
    """``(clean_text, cited, removed)`` for a model's reply citing sources as [n].

    Markers: ``[1]``, ``[1, 3]``, ``[1-3]`` (ranges up to MAX_RANGE ids are expanded; longer ones count as
    their two ends), ``[1][2]``. ``cited``: ids in ``valid``, in order of first use, once each.
    ``removed``: the other ids found, in order of first appearance, once each (digit runs longer than
    MAX_ID_DIGITS are removed but not listed). In ``clean_text`` a marker that lost ids is rewritten as
    ``[a, b]``, one that lost all of them disappears with the space before it when punctuation, a space
    or the end follows; markers with only valid ids stay as written. Text without markers comes back as
    it is (stripped). Bracketed numbers that are not citations (``[2024]``) count as markers too. Never raises.
    """
    cited: list[int] = []
    removed: list[int] = []

    def replace(m: re.Match[str]) -> str:
        space, body = m.group(1), m.group(2)
        ids = marker_ids(body)
        kept = [i for i in dict.fromkeys(ids) if i is not None and i in valid]
        for i in ids:
            if i is None:
                continue
            bucket = cited if i in valid else removed
            if i not in bucket:
                bucket.append(i)
        if len(kept) == len(ids):  # nothing removed: leave the marker as the model wrote it
            return m.group(0)
        if kept:
            return f"{space}[{', '.join(map(str, kept))}]"
        after = m.string[m.end(): m.end() + 1]
        return "" if not after or after.isspace() or after in _CLOSES else space[:1]

    clean = MARKER.sub(replace, text)
    return clean.strip(), cited, removed


ECHOED_SOURCE = re.compile(r"</?\s*source\b|&lt;/?\s*source\b", re.IGNORECASE)


def cut_echoed_sources(raw: str) -> str:
    """A small model sometimes goes on to write source blocks of its own, copying the prompt's format:
    everything from the first such tag on is not answer (seen with SmolLM2-135M in the demo)."""
    match = ECHOED_SOURCE.search(raw)
    return raw[: match.start()].rstrip() if match else raw
