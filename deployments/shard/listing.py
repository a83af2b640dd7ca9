"""A shard's documents in id order, for listings without a query (``POST /collections/{c}/documents/list``).

Built once from the chunk table's ``doc_id`` column: the distinct ids sorted, each with the row of its first chunk
(a document's chunks share its metadata, so that row decides whether a filter lets the document through) and its
number of chunks. The ids stay an Arrow string array (their bytes and an offset each), not a fixed-width numpy
string array, whose every element is as wide as the longest id in UTF-32: at a million chunks that is the difference
between megabytes and hundreds of them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deployments.shard.query import DocumentsAnswer, DocumentsQuery


class _Sorted:
    """Index access to a sorted Arrow string array as Python strings, for ``bisect`` (a few reads a search)."""

    def __init__(self, ids: pa.Array):
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> str:
        return self.ids[i].as_py()


@dataclass(frozen=True)
class DocumentOrder:
    ids: pa.Array  # distinct document ids, sorted (code point order, as Python sorts strings)
    first: np.ndarray  # int64: the row of each one's first chunk
    chunks: np.ndarray  # int64: its number of chunks

    @classmethod
    def of(cls, doc_ids: pa.ChunkedArray | pa.Array) -> DocumentOrder:
        column = doc_ids.combine_chunks() if isinstance(doc_ids, pa.ChunkedArray) else doc_ids
        if len(column) == 0:
            return cls(pa.array([], pa.string()), np.zeros(0, np.int64), np.zeros(0, np.int64))
        order = pc.sort_indices(column)  # stable: equal ids keep their row order, the first chunk first
        ordered = column.take(order)
        starts = np.concatenate([[0], np.flatnonzero(
            pc.not_equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1)).to_numpy(zero_copy_only=False)) + 1])
        counts = np.diff(np.append(starts, len(ordered)))
        return cls(ordered.take(pa.array(starts)), order.to_numpy()[starts].astype(np.int64), counts.astype(np.int64))

    def page(self, query: DocumentsQuery, allowed: np.ndarray | None, rows: int) -> DocumentsAnswer:
        """The query's page: the ids ``allowed`` (chunk rows a filter and ACL let through; None: all of the ``rows``)
        lets through, among ``query.ids`` when given, less ``query.exclude``, after ``query.after``."""
        matched = np.ones(len(self.ids), dtype=bool)
        if allowed is not None:
            let_through = np.zeros(rows, dtype=bool)
            let_through[allowed] = True
            matched = let_through[self.first]
        if query.ids is not None:
            matched &= self._among(query.ids)
        if query.exclude:
            matched &= ~self._among(query.exclude)
        start = bisect.bisect_right(_Sorted(self.ids), query.after) if query.after is not None else 0
        later = np.flatnonzero(matched[start:])
        page = later[:query.limit] + start
        return DocumentsAnswer(self.ids.take(pa.array(page, pa.int64())).to_pylist(), self.chunks[page].tolist(),
                               int(np.count_nonzero(matched)), len(later))

    def _among(self, ids: tuple[str, ...]) -> np.ndarray:
        return pc.is_in(self.ids, value_set=pa.array(list(ids), pa.string())).to_numpy(zero_copy_only=False)
