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

    def _params(self, allowed_rows: np.ndarray | None):
        if allowed_rows is None:
            return None
        selector = self._faiss.IDSelectorBatch(np.ascontiguousarray(allowed_rows, dtype=np.int64))
        if hasattr(self.index, "hnsw"):
            return self._faiss.SearchParametersHNSW(sel=selector, efSearch=self.index.hnsw.efSearch)
        if hasattr(self.index, "nprobe"):
            return self._faiss.SearchParametersIVF(sel=selector, nprobe=self.index.nprobe)
        return self._faiss.SearchParameters(sel=selector)

    def search_rows(self, query: np.ndarray, k: int,
                    allowed_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(rows, float32 scores) of one query's top-k, best first, without padding: what ``search`` does
        for one query, without a Python object per hit."""
        queries = np.ascontiguousarray(np.atleast_2d(query), dtype=np.float32)
        if self.index.ntotal == 0 or k <= 0 or (allowed_rows is not None and len(allowed_rows) == 0):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        k = min(k, self.index.ntotal)
        params = self._params(allowed_rows)
        scores, rows = self.index.search(queries, k, params=params) if params else self.index.search(queries, k)
        keep = rows[0] >= 0
        return rows[0][keep], scores[0][keep]

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

    def search_rows(self, query: np.ndarray, k: int,
                    allowed_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        row_of = {c: i for i, c in enumerate(self.chunk_ids)} if not hasattr(self, "_row_of") else self._row_of
        self._row_of = row_of
        (hits,) = self.search(query, k, allowed_rows)
        return (np.array([row_of[h.chunk_id] for h in hits], dtype=np.int64),
                np.array([h.score for h in hits], dtype=np.float32))

    def search(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None) -> list[list[Hit]]:
        torch = self.torch
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        if self.ntotal == 0 or (allowed_rows is not None and len(allowed_rows) == 0):
            return [[] for _ in range(len(queries))]
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
        return [
            [Hit(self.chunk_ids[r], float(s), self.shard) for s, r in zip(srow, rrow, strict=True) if np.isfinite(s)]
            for srow, rrow in zip(top, rows, strict=True)
        ]
