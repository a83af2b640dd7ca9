"""A shard's words as spell correction sees them: what it may suggest (``deployments.search.spelling``) is counted
here, over the shard's own texts, so only ids and counts leave the shard."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?|\w+", re.UNICODE)


def words(text: str) -> list[str]:
    """Lower-cased words, as the vocabulary and the corrector both see them."""
    return [m.group(0).lower() for m in WORD.finditer(text)]


def document_frequencies(texts: Iterable[str]) -> Counter:
    """Word -> how many of the texts contain it."""
    df: Counter = Counter()
    for text in texts:
        df.update(set(words(text)))
    return df
