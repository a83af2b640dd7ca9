"""What a shard slot is asked and what it answers: the one form of a shard search, from the router's fan-out
to a Serve handle, a shard group, a host's two threads and the fresh segment of written documents.

Between deployments only ids and scores travel (Ray Serve's cost grows with payload); rows go along only
for the few best hits, where a round trip would cost more than the bytes (``rows_for_top``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

# Distinct terms a keyword leg searches, over all its fields (Lucene's BooleanQuery clause limit): a long query keeps
# its rarest (``bounded_terms``).
MAX_QUERY_CLAUSES = 1024


def bounded_terms(terms: list[str], df: Callable[[str], int], fields: int = 1) -> tuple[list[str], int, int]:
    """A query's analyzed ``terms`` with at most ``MAX_QUERY_CLAUSES // fields`` distinct ones the corpus holds,
    the rarest kept (by corpus document frequency, the query's order breaking ties: the terms BM25 weighs most),
    each with every occurrence, in the query's order; and (kept, distinct) counts of the terms the corpus holds.
    Terms it never saw score nothing either way. Corpus statistics, not a shard's: every shard and the fresh
    segment keep the same terms, so their scores still add up as one index's."""
    limit = max(1, MAX_QUERY_CLAUSES // max(1, fields))
    known = [(df(t), i, t) for i, t in enumerate(dict.fromkeys(terms))]
    known = [k for k in known if k[0] > 0]
    if len(known) <= limit:
        return terms, len(known), len(known)
    kept = {t for _, _, t in sorted(known)[:limit]}
    return [t for t in terms if t in kept], limit, len(known)


@dataclass(frozen=True, eq=False)
class ShardQuery:
    """One search of a shard slot: both retrieval legs, filters and ACL applied inside the engines.

    A leg is searched only when asked for: the dense leg needs a ``vector`` and ``k_dense > 0``, the keyword
    leg a ``text`` and ``k_keyword > 0``. ``acl`` = (field, principals): only chunks whose field holds one of
    the principals exist for this search. ``ann`` overrides the index's approximate search options
    (``ef_search``, ``nprobe``, ``exact``). ``rows_for_top``: the chunk rows of each leg's best that many hits
    are sent along with the answer. ``field_weights`` {Lucene field: weight}: the keyword leg scores their
    weighted sum of BM25 (None: ``contents`` alone; checked against the version by the router). ``encoder``: the
    named encoder ``vector`` was embedded with, whose index the dense leg searches (None: the version's own)."""

    vector: np.ndarray | None = None
    text: str | None = None
    k_dense: int = 0
    k_keyword: int = 0
    filters: dict[str, Any] | None = None
    rows_for_top: int = 0
    acl: tuple[str, list[str]] | None = None
    ann: dict[str, Any] | None = None
    field_weights: dict[str, float] | None = None
    encoder: str | None = None

    @property
    def dense(self) -> bool:
        return self.vector is not None and self.k_dense > 0

    @property
    def keyword(self) -> bool:
        return bool(self.text) and self.k_keyword > 0

    @property
    def restricted(self) -> bool:
        """Whether some rows may be left out (a filter or an ACL)."""
        return bool(self.filters) or self.acl is not None

    def at_depth(self, k_dense: int, k_keyword: int) -> ShardQuery:
        """The same search, each leg asked for another depth (0: the leg is not searched)."""
        return replace(self, k_dense=k_dense, k_keyword=k_keyword)


@dataclass
class ShardAnswer:
    """A shard slot's answer: each leg's best (chunk id, score) pairs, score descending then chunk id
    ascending, and what the caller needs to judge them (rows allowed by the filter, time taken)."""

    shard: str
    dense: list[tuple[str, float]] = field(default_factory=list)
    keyword: list[tuple[str, float]] = field(default_factory=list)
    allowed: int | None = None  # rows passing the filter (None: no filter)
    filter_error: str | None = None
    took_ms: float = 0.0
    rows: list[dict] = field(default_factory=list)  # chunk rows of the best hits, sent along to save a hop
    shards: int = 1  # shards this answer covers (a shard group answers for several)
    shard_ms: dict[str, float] = field(default_factory=dict)  # a group's time per shard
    terms: tuple[int, int] | None = None  # (searched, distinct) where a long query's terms were cut (bounded_terms)


@dataclass(frozen=True)
class DocumentsQuery:
    """One page of a collection's documents listed without a query, in id order: those ``filters`` and ``acl`` let
    through (as a search's), among ``ids`` when given, after the id ``after``, ``limit`` of them (0: the count
    alone). ``exclude``: ids the fresh segment decides (written or deleted through the API since the version), which
    the version's copy must not answer for."""

    filters: dict[str, Any] | None = None
    acl: tuple[str, list[str]] | None = None
    ids: tuple[str, ...] | None = None
    after: str | None = None
    limit: int = 100
    exclude: tuple[str, ...] = ()


@dataclass
class DocumentsAnswer:
    """A slot's page: document ids in id order with their chunk counts, how many documents match in all, and how many
    of those come after ``after`` (the page's among them: more than the page holds, and there is a next page)."""

    ids: list[str] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    total: int = 0
    remaining: int = 0
    filter_error: str | None = None


def merged_pages(answers: list[DocumentsAnswer], limit: int) -> DocumentsAnswer:
    """Pages of slots holding disjoint documents as one: the first ``limit`` ids of all, in id order, and the totals
    added (a filter error of any is the answer's)."""
    errors = [a.filter_error for a in answers if a.filter_error]
    pairs = sorted((i, c) for a in answers for i, c in zip(a.ids, a.chunks, strict=True))[:limit]
    return DocumentsAnswer([i for i, _ in pairs], [c for _, c in pairs], sum(a.total for a in answers),
                           sum(a.remaining for a in answers), errors[0] if errors else None)
