"""Dense search over one shard's FAISS index, optionally restricted to allowed rows.

A filter restricts the search itself (a FAISS ID selector), so a filtered top-k is complete rather than
a post-filtered slice of the unfiltered top-k.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .hits import Hit


class DenseShard:
    def __init__(self, index, chunk_ids: Sequence[str], shard: int = -1, ef_search: int = 128, nprobe: int = 16):
        import faiss

        self.index = index
        self.chunk_ids = list(chunk_ids)
        self.shard = shard
        if hasattr(index, "hnsw"):
            index.hnsw.efSearch = ef_search
        if hasattr(index, "nprobe"):
            index.nprobe = min(nprobe, index.nlist)
        self._faiss = faiss

    def _params(self, allowed_rows: np.ndarray | None):
        if allowed_rows is None:
            return None
        selector = self._faiss.IDSelectorBatch(np.ascontiguousarray(allowed_rows, dtype=np.int64))
        if hasattr(self.index, "hnsw"):
            return self._faiss.SearchParametersHNSW(sel=selector, efSearch=self.index.hnsw.efSearch)
        if hasattr(self.index, "nprobe"):
            return self._faiss.SearchParametersIVF(sel=selector, nprobe=self.index.nprobe)
        return self._faiss.SearchParameters(sel=selector)

    def search(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None) -> list[list[Hit]]:
        """Top-k hits per query row; FAISS's -1 padding (fewer than k candidates) is dropped here, once."""
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        if self.index.ntotal == 0 or (allowed_rows is not None and len(allowed_rows) == 0):
            return [[] for _ in range(len(queries))]
        k = min(k, self.index.ntotal)
        params = self._params(allowed_rows)
        scores, rows = self.index.search(queries, k, params=params) if params else self.index.search(queries, k)
        return [
            [Hit(self.chunk_ids[r], float(s), self.shard) for s, r in zip(srow, rrow, strict=True) if r >= 0]
            for srow, rrow in zip(scores, rows, strict=True)
        ]
