"""Dense search over one shard's FAISS index, optionally restricted to allowed rows.

A filter restricts the search itself (a FAISS ID selector), so a filtered top-k is complete rather than
a post-filtered slice of the unfiltered top-k.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from deployments.search.hits import Hit


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
        # Serving searches one query at a time: OpenMP's threads would add nothing to a 0.2 ms scan, and after
        # each search they spin-wait on the other core for milliseconds (measured: ~1 ms of CPU per query).
        faiss.omp_set_num_threads(1)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def _params(self, allowed_rows: np.ndarray | None):
        if allowed_rows is None:
            return None
        selector = self._faiss.IDSelectorBatch(np.ascontiguousarray(allowed_rows, dtype=np.int64))
        if hasattr(self.index, "hnsw"):
            return self._faiss.SearchParametersHNSW(sel=selector, efSearch=self.index.hnsw.efSearch)
        if hasattr(self.index, "nprobe"):
            return self._faiss.SearchParametersIVF(sel=selector, nprobe=self.index.nprobe)
        return self._faiss.SearchParameters(sel=selector)

    def _top(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) per query row, FAISS's -1 marking padding (fewer than k candidates)."""
        k = min(k, self.index.ntotal)
        params = self._params(allowed_rows)
        return self.index.search(queries, k, params=params) if params else self.index.search(queries, k)

    def search_rows(self, query: np.ndarray, k: int,
                    allowed_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(rows, float32 scores) of one query's top-k, best first, without padding: ``search`` for one
        query without a Python object per hit (what a shard group merges)."""
        return _one_query(self, query, k, allowed_rows)

    def search(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None) -> list[list[Hit]]:
        """Top-k hits per query row; padding (fewer than k candidates) is dropped here, once."""
        return _hits(self, queries, k, allowed_rows)


def _empty(index, k: int, allowed_rows) -> bool:
    return index.ntotal == 0 or k <= 0 or (allowed_rows is not None and len(allowed_rows) == 0)


def _one_query(index, query, k, allowed_rows) -> tuple[np.ndarray, np.ndarray]:
    queries = np.ascontiguousarray(np.atleast_2d(query), dtype=np.float32)
    if _empty(index, k, allowed_rows):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    scores, rows = index._top(queries, k, allowed_rows)
    keep = rows[0] >= 0
    return rows[0][keep].astype(np.int64), scores[0][keep].astype(np.float32)


def _hits(index, queries, k, allowed_rows) -> list[list[Hit]]:
    queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
    if _empty(index, k, allowed_rows):
        return [[] for _ in range(len(queries))]
    scores, rows = index._top(queries, k, allowed_rows)
    return [
        [Hit(index.chunk_ids[r], float(s), index.shard) for s, r in zip(srow, rrow, strict=True) if r >= 0]
        for srow, rrow in zip(scores, rows, strict=True)
    ]


class TorchDenseShard:
    """Exact inner-product search with torch on a chosen device: the GPU path of a shard replica.

    On a GPU a shard's vectors fit in memory as float16 and one matrix product over all of them is
    faster than any CPU index, so the replica keeps them there and needs no approximate index. The same
    code runs on CPU (where it is tested against FAISS); ``DenseShard`` stays the CPU default.
    """

    def __init__(self, vectors: np.ndarray, chunk_ids: Sequence[str], shard: int = -1, device: str = "cuda",
                 dtype: str = "float16"):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype) if self.device.type == "cuda" else torch.float32
        self.vectors = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(self.device, self.dtype)
        self.chunk_ids = list(chunk_ids)
        self.shard = shard

    @property
    def ntotal(self) -> int:
        return int(self.vectors.shape[0])

    def _top(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) per query row, rows -1 where a disallowed row filled the top-k (as FAISS pads)."""
        torch = self.torch
        with torch.inference_mode():
            q = torch.from_numpy(queries).to(self.device, self.dtype)
            scores = (q @ self.vectors.T).float()
            if allowed_rows is not None:
                keep = torch.full((self.ntotal,), float("-inf"), device=self.device)
                keep[torch.from_numpy(np.asarray(allowed_rows, dtype=np.int64)).to(self.device)] = 0.0
                scores = scores + keep
            k = min(k, self.ntotal if allowed_rows is None else len(allowed_rows))
            top, rows = torch.topk(scores, k, dim=1)
        top, rows = top.cpu().numpy(), rows.cpu().numpy()
        return top, np.where(np.isfinite(top), rows, -1)

    def search_rows(self, query: np.ndarray, k: int,
                    allowed_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        return _one_query(self, query, k, allowed_rows)

    def search(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None) -> list[list[Hit]]:
        return _hits(self, queries, k, allowed_rows)
