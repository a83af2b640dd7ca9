"""Dense search over one shard's FAISS index, optionally restricted to allowed rows.

A filter restricts the search itself (a FAISS ID selector), so a filtered top-k is complete rather than
a post-filtered slice of the unfiltered top-k.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from deployments.shard.certified import CertifiedFlat
from deployments.shard.topk import top_k

EXACT_FILTERED_ROWS = 20_000  # a filter leaving at most this many rows is searched exactly (see DenseShard._top)


class DenseShard:
    """A shard's FAISS index with its search-time options: the defaults its manifest records (``options``:
    ef_search, nprobe, refine), which a request's ``ann`` overrides (ef_search, nprobe, refine, exact).

    HNSW never explores fewer than the k candidates asked for (efSearch = max(ef_search, k)). For quantized
    codes, k x refine candidates are rescored with the shard's stored float vectors (``vectors``, memory-mapped:
    only the rows rescored are read), so the scores returned are exact inner products. ``exact`` scans the
    stored vectors instead of the index: the oracle an approximate answer can be checked against.
    """

    def __init__(self, index, chunk_ids: Sequence[str], shard: int = -1, options: dict | None = None,
                 vectors: np.ndarray | None = None, vector_rows: np.ndarray | None = None):
        import faiss

        options = options or {}
        self.index = index
        # A folded shard's index (``index_build.fold``) was appended to, not rebuilt: its ids are not the chunk
        # table's rows. ``vector_rows`` maps each id to its row, -1 for a vector whose chunk was replaced or
        # deleted (kept in the graph, never answered); None: ids are rows.
        self.vector_rows = None if vector_rows is None else np.asarray(vector_rows, dtype=np.int64)
        self.dead = 0 if vector_rows is None else int((self.vector_rows < 0).sum())
        if vector_rows is not None:
            self.id_of_row = np.full(len(chunk_ids), -1, dtype=np.int64)
            live = self.vector_rows >= 0
            self.id_of_row[self.vector_rows[live]] = np.flatnonzero(live)
        self.chunk_ids = chunk_ids  # a shard's ChunkIds (read where needed), or a test's list
        self.shard = shard
        self.vectors = vectors
        self.is_hnsw = hasattr(index, "hnsw")
        self.by_distance = index.metric_type == faiss.METRIC_L2  # RaBitQ's codes (``faiss_index.metric_of``)
        self.nlist = int(index.nlist) if hasattr(index, "nlist") else 0
        self.ef_search = int(options.get("ef_search") or (index.hnsw.efSearch if self.is_hnsw else 0))
        self.nprobe = int(options.get("nprobe") or (index.nprobe if self.nlist else 0))
        self.refine = int(options.get("refine") or 1) if vectors is not None else 1
        self._faiss = faiss
        self.certified = CertifiedFlat.of(index)  # a flat index's exact top-k from a half-precision scan first
        # Serving searches one query at a time: OpenMP's threads would add nothing to a 0.2 ms scan, and after
        # each search they spin-wait on the other core for milliseconds (measured: ~1 ms of CPU per query).
        faiss.omp_set_num_threads(1)

    @property
    def ntotal(self) -> int:
        """Live vectors: the chunk table's rows."""
        return int(self.index.ntotal) - self.dead

    def _params(self, allowed_rows: np.ndarray | None, k: int, ann: dict | None):
        ann = ann or {}
        if allowed_rows is not None and self.vector_rows is not None:
            allowed_rows = self.id_of_row[np.asarray(allowed_rows, dtype=np.int64)]
        selector = None if allowed_rows is None else \
            self._faiss.IDSelectorBatch(np.ascontiguousarray(allowed_rows, dtype=np.int64))
        if self.is_hnsw:
            ef = max(int(ann.get("ef_search") or self.ef_search), k)
            return self._faiss.SearchParametersHNSW(sel=selector, efSearch=ef) if selector else \
                self._faiss.SearchParametersHNSW(efSearch=ef)
        if self.nlist:
            nprobe = min(int(ann.get("nprobe") or self.nprobe), self.nlist)
            return self._faiss.SearchParametersIVF(sel=selector, nprobe=nprobe) if selector else \
                self._faiss.SearchParametersIVF(nprobe=nprobe)
        return self._faiss.SearchParameters(sel=selector) if selector else None

    def _exact(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        rows = np.arange(self.ntotal) if allowed_rows is None else np.sort(np.asarray(allowed_rows, dtype=np.int64))
        k = min(k, len(rows))
        scores = (np.asarray(self.vectors[rows] if allowed_rows is not None else self.vectors) @ queries.T).T
        best = np.stack([top_k(row_scores, k, rows) for row_scores in scores]) if len(rows) else \
            np.zeros((len(queries), 0), dtype=np.int64)
        return np.take_along_axis(scores, best, axis=1), rows[best]

    def _top(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None,
             ann: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) per query row, FAISS's -1 marking padding (fewer than k candidates).

        Under a filter an approximate index sees only the allowed rows it happens to visit: at 1% of the rows
        HNSW's top-200 held under half of the exact one (bench/README.md, "Approximate search"). So a filter
        that leaves at most EXACT_FILTERED_ROWS rows is answered by scanning them exactly (cheap: they are
        few), and a wider one widens the search by the rows it drops (efSearch, nprobe / allowed fraction)."""
        approximate = self.is_hnsw or self.nlist
        if self.vectors is not None and ((ann and ann.get("exact")) or (
                approximate and allowed_rows is not None and len(allowed_rows) <= EXACT_FILTERED_ROWS)):
            return self._exact(queries, k, allowed_rows)
        k = min(k, self.ntotal)
        refine = max(1, int((ann or {}).get("refine") or self.refine)) if self.vectors is not None else 1
        fetch = min(k * refine, self.index.ntotal)
        if approximate and allowed_rows is not None:
            widen = self.ntotal / max(len(allowed_rows), 1)
            ann = dict(ann or {})
            if self.is_hnsw:
                ann["ef_search"] = min(int(max(int(ann.get("ef_search") or self.ef_search), fetch) * widen), 4096)
            else:
                ann["nprobe"] = int(min(int(ann.get("nprobe") or self.nprobe) * widen, self.nlist))
        if self.vector_rows is None or allowed_rows is not None:  # a filter's selector names live vectors only
            scores, rows = self._search(queries, fetch, allowed_rows, ann)
        else:
            # Dead vectors (a folded shard's replaced chunks) may take places of the top: ask for as many more
            # again, and once for every dead one if that still left a query short.
            wanted = min(fetch, self.ntotal)
            fetch = min(wanted + min(self.dead, wanted), self.index.ntotal)
            scores, rows = self._to_rows(*self._search(queries, fetch, None, ann), wanted)
            if (rows < 0).any() and fetch < min(wanted + self.dead, self.index.ntotal):
                scores, rows = self._to_rows(*self._search(queries, min(wanted + self.dead, self.index.ntotal),
                                                           None, ann), wanted)
        if refine == 1:
            return scores, rows
        return self._rescore(queries, rows, k)

    def _search(self, queries: np.ndarray, fetch: int, allowed_rows, ann) -> tuple[np.ndarray, np.ndarray]:
        """The index's own answer: (scores, ids), ids being rows unless the shard was folded."""
        params = self._params(allowed_rows, fetch, ann)
        found = self.certified.search(queries, fetch) if self.certified is not None and params is None else None
        if found is not None:
            scores, ids = found
        else:
            scores, ids = self.index.search(queries, fetch, params=params) if params else self.index.search(queries, fetch)
        if self.by_distance:  # unit vectors: |q - x|^2 = 2 - 2 q.x
            scores = np.where(ids >= 0, 1 - scores / 2, -np.inf).astype(np.float32)
        if self.vector_rows is not None and allowed_rows is not None:
            ids = np.where(ids >= 0, self.vector_rows[np.maximum(ids, 0)], -1)
        return scores, ids

    def _to_rows(self, scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """FAISS ids as chunk-table rows, dead ones dropped, the first ``k`` kept per query (padding -1)."""
        rows = np.where(ids >= 0, self.vector_rows[np.maximum(ids, 0)], -1)
        out_scores = np.full((len(ids), k), -np.inf, dtype=np.float32)
        out_rows = np.full((len(ids), k), -1, dtype=np.int64)
        for i in range(len(ids)):
            keep = np.flatnonzero(rows[i] >= 0)[:k]
            out_scores[i, :len(keep)] = scores[i, keep]
            out_rows[i, :len(keep)] = rows[i, keep]
        return out_scores, out_rows

    def _rescore(self, queries: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The candidates' exact scores from the stored vectors, best k kept (padding stays -1)."""
        out_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        out_rows = np.full((len(queries), k), -1, dtype=np.int64)
        for i, (q, cand) in enumerate(zip(queries, rows, strict=True)):
            cand = cand[cand >= 0]
            if not len(cand):
                continue
            order = np.argsort(cand)  # read the memory-mapped rows in file order
            exact = np.asarray(self.vectors[cand[order]]) @ q
            best = top_k(exact, k, cand[order])
            out_scores[i, :len(best)] = exact[best]
            out_rows[i, :len(best)] = cand[order][best]
        return out_scores, out_rows

    def search_rows(self, query: np.ndarray, k: int, allowed_rows: np.ndarray | None = None,
                    ann: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(rows, float32 scores) of one query's top-k, best first, without padding: ``search`` for one
        query without a Python object per hit (what a shard group merges)."""
        return _one_query(self, query, k, allowed_rows, ann)

    def search(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None,
               ann: dict | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """(rows, float32 scores) of the top-k per query row, best first; padding (fewer than k candidates) is
        dropped here, once."""
        return _per_query(self, queries, k, allowed_rows, ann)


def _empty(index, k: int, allowed_rows) -> bool:
    return index.ntotal == 0 or k <= 0 or (allowed_rows is not None and len(allowed_rows) == 0)


def _one_query(index, query, k, allowed_rows, ann=None) -> tuple[np.ndarray, np.ndarray]:
    queries = np.ascontiguousarray(np.atleast_2d(query), dtype=np.float32)
    if _empty(index, k, allowed_rows):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    scores, rows = index._top(queries, k, allowed_rows, ann)
    keep = rows[0] >= 0
    return rows[0][keep].astype(np.int64), scores[0][keep].astype(np.float32)


def _per_query(index, queries, k, allowed_rows, ann=None) -> list[tuple[np.ndarray, np.ndarray]]:
    queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
    if _empty(index, k, allowed_rows):
        return [(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)) for _ in range(len(queries))]
    scores, rows = index._top(queries, k, allowed_rows, ann)
    return [(r[r >= 0].astype(np.int64), s[r >= 0].astype(np.float32)) for s, r in zip(scores, rows, strict=True)]


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
        self.chunk_ids = chunk_ids  # a shard's ChunkIds (read where needed), or a test's list
        self.shard = shard

    @property
    def ntotal(self) -> int:
        return int(self.vectors.shape[0])

    def _top(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None,
             ann: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) per query row, rows -1 where a disallowed row filled the top-k (as FAISS pads); exact
        always, so ``ann`` changes nothing."""
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

    def search_rows(self, query: np.ndarray, k: int, allowed_rows: np.ndarray | None = None,
                    ann: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        return _one_query(self, query, k, allowed_rows, ann)

    def search(self, queries: np.ndarray, k: int, allowed_rows: np.ndarray | None = None,
               ann: dict | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        return _per_query(self, queries, k, allowed_rows, ann)
