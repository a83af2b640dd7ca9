"""A shard's documents in id order (``deployments.shard.listing.DocumentOrder``) against brute force: random chunk
tables (documents of several chunks, ids beyond ASCII), random filters' rows, ids asked, ids excluded, ``after`` and
``limit``; pages in Python's string order, each document once, counted."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.shard.listing import DocumentOrder
from deployments.shard.query import DocumentsQuery

ID_POOL = ["a", "b", "ab", "a b", "Z", "z9", "é", "éa", "日本", "x#y", "10", "9", "", "ß"]


@st.composite
def tables(draw):
    docs = draw(st.lists(st.sampled_from(ID_POOL), min_size=0, max_size=10, unique=True))
    rows = [d for d in docs for _ in range(draw(st.integers(1, 3)))]
    order = draw(st.permutations(range(len(rows))))
    return [rows[i] for i in order]


@settings(max_examples=300, deadline=None)
@given(rows=tables(), data=st.data())
def test_a_page_is_what_brute_force_lists(rows, data):
    n = len(rows)
    allowed = data.draw(st.one_of(st.none(), st.sets(st.integers(0, max(0, n - 1)), max_size=n).map(
        lambda s: np.array(sorted(s), dtype=np.int64)))) if n else None
    asked = data.draw(st.one_of(st.none(), st.lists(st.sampled_from(ID_POOL), max_size=4)))
    exclude = data.draw(st.lists(st.sampled_from(ID_POOL), max_size=3))
    after = data.draw(st.one_of(st.none(), st.sampled_from(ID_POOL)))
    limit = data.draw(st.integers(0, 6))
    first = {}
    for i, d in enumerate(rows):
        first.setdefault(d, i)
    matched = sorted(d for d, row in first.items() if (allowed is None or row in set(allowed.tolist()))
                     and (asked is None or d in asked) and d not in exclude)
    later = [d for d in matched if after is None or d > after]
    query = DocumentsQuery(ids=tuple(asked) if asked is not None else None, exclude=tuple(exclude), after=after,
                           limit=limit)
    got = DocumentOrder.of(pa.chunked_array([pa.array(rows[:2], pa.string()), pa.array(rows[2:], pa.string())])
                           ).page(query, allowed, n)
    assert got.ids == later[:limit]
    assert got.chunks == [rows.count(d) for d in got.ids]
    assert (got.total, got.remaining) == (len(matched), len(later))
