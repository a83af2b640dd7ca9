"""A shard's chunk ids as a replica holds them: in the chunk table (memory-mapped), found by a sorted hash array.

A million chunks held as Python strings, a list of them and an id -> row dict cost about 200 bytes a chunk, more
than the compressed vectors. Here an id is read from the chunk table when a hit needs it (a page's worth a query),
and a row is found by its id through two arrays: the ids' hashes sorted (8 bytes a chunk) and the row of each (4).
A hash names candidate rows only: each is checked against the id itself, so a collision costs a read, never a wrong
row.

A small shard keeps its ids as strings as well (``LISTED_MAX``). A search reads a few hundred of them (each leg's
candidates) right after the vector scan has swept the caches: from the table they cost about 0.3 ms a leg, from the
list a third of that (bench/README.md, "Ids in memory"). Up to that size the list costs at most a few megabytes; a
large shard keeps the two arrays alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from index_format.chunk_table import ChunkTable

# From this many rows a ``take`` reads ids with Arrow's take (measured: the two ways cost the same at about 16 ids).
ARROW_TAKE = 16
# A shard of at most this many chunks also keeps its ids as a list of strings: 57 bytes and the id's length a chunk
# (67 on SciFact), a few megabytes at the most.
LISTED_MAX = 50_000


def _hashes(ids: Iterable[str], count: int) -> np.ndarray:
    # Python's own string hash: fast, and the same for every lookup in this process (never stored).
    return np.fromiter(map(hash, ids), dtype=np.int64, count=count)


class ChunkIds(Sequence):
    """The ids of a shard's rows, in row order: ``take(rows)`` reads them, ``rows_of(ids)`` finds their rows."""

    def __init__(self, table: ChunkTable):
        self.table = table
        ids = table.column("chunk_id").to_pylist()  # read once, then dropped unless the shard is small
        hashes = _hashes(ids, len(ids))
        self.listed: list[str] | None = ids if len(ids) <= LISTED_MAX else None
        del ids
        order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[order]
        self.rows = order.astype(np.int32 if len(order) < 2**31 else np.int64)
        # Each batch's id column as its two Arrow buffers, viewed in place (the mapping's pages, read when a row
        # is): an id is the bytes between two offsets, the cheapest way to read a few; many are read by the column's
        # own ``take`` (``take``).
        self._offsets, self._data, self._columns = [], [], []
        for batch in table.batches:
            column = batch.column("chunk_id")
            self._columns.append(column)
            buffers = column.buffers()
            self._offsets.append(np.frombuffer(buffers[1], dtype=np.int32)[column.offset:column.offset + len(column) + 1]
                                 if len(column) else np.zeros(1, dtype=np.int32))
            self._data.append(memoryview(buffers[2]) if len(column) and buffers[2] is not None else memoryview(b""))

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, row):  # one id, or a slice's (for a caller that reads a few)
        if isinstance(row, slice):
            return self.take(np.arange(len(self))[row])
        return self.take([row])[0]

    def __iter__(self):
        return iter(self.listed if self.listed is not None else self.table.column("chunk_id").to_pylist())

    def take(self, rows: Sequence[int] | np.ndarray) -> list[str]:
        """The ids of these rows, in the order given: a few read as slices of the buffers, many by Arrow's ``take``
        of each batch's column (a call costs about 25 us, then about 0.1 us an id against 1.2 a slice); a small
        shard's from its list."""
        if self.listed is not None:
            listed = self.listed
            return [listed[r] for r in np.asarray(rows, dtype=np.int64).tolist()]
        batch, at = np.divmod(np.asarray(rows, dtype=np.int64), self.table.batch_rows)
        if len(at) >= ARROW_TAKE:
            if len(self._columns) == 1:
                return self._columns[0].take(at).to_pylist()
            out: list[str] = [""] * len(at)
            for b in np.unique(batch).tolist():
                where = np.flatnonzero(batch == b)
                for i, chunk_id in zip(where.tolist(), self._columns[b].take(at[where]).to_pylist(), strict=True):
                    out[i] = chunk_id
            return out
        out = []
        for b, i in zip(batch.tolist(), at.tolist(), strict=True):
            offsets = self._offsets[b]
            out.append(str(self._data[b][offsets[i]:offsets[i + 1]], "utf-8"))
        return out

    def rows_of(self, ids: Sequence[str]) -> np.ndarray:
        """The row of each id (-1 for an id this shard does not hold), in the order given."""
        ids = list(ids)
        out = np.full(len(ids), -1, dtype=np.int64)
        if not ids or not len(self.hashes):
            return out
        wanted = _hashes(ids, len(ids))
        lo = np.searchsorted(self.hashes, wanted, side="left")
        hi = np.searchsorted(self.hashes, wanted, side="right")
        asked, candidates = [], []
        for i in np.flatnonzero(hi > lo):
            for at in range(lo[i], hi[i]):  # almost always one: a collision of 64-bit hashes is rare
                asked.append(i)
                candidates.append(int(self.rows[at]))
        if candidates:
            for i, row, held in zip(asked, candidates, self.take(candidates), strict=True):
                if held == ids[i]:
                    out[i] = row
        return out

    def __contains__(self, chunk_id) -> bool:
        return isinstance(chunk_id, str) and bool(self.rows_of([chunk_id])[0] >= 0)


def ids_at(ids: Sequence[str], rows: Sequence[int] | np.ndarray) -> list[str]:
    """The ids of ``rows`` of a shard's ids: a ``ChunkIds`` reads them, a plain sequence (a test's) indexes them."""
    return ids.take(rows) if isinstance(ids, ChunkIds) else [ids[int(r)] for r in rows]


def rows_of(ids: Sequence[str], wanted: Sequence[str]) -> np.ndarray:
    """The row of each of ``wanted`` among a shard's ``ids`` (-1 where it holds none), as ``ChunkIds.rows_of``."""
    if isinstance(ids, ChunkIds):
        return ids.rows_of(wanted)
    index = {c: i for i, c in enumerate(ids)}
    return np.array([index.get(c, -1) for c in wanted], dtype=np.int64)
