"""A flat inner-product index's exact top-k for less than its full scan: half-precision copies scanned first, a
bound on their error proving the full-precision answer to be among the few they rank best.

One query against a flat index reads every stored float32 vector, a scan bound by memory: about 2 ms for SciFact's
11,598 MiniLM vectors on a 2-core EPYC, the largest single cost of a hybrid search after the query encoder. The same
vectors in float16 are half the bytes. Their scores are not the index's, but how far each can be from it is known:
``|q.x - q.x16| <= |q| |x - x16|``, plus float32 rounding in either sum. So the ``k'`` best by the float16 scan (a
few more than ``k``) are searched again in the flat index itself, restricted to them (FAISS's own scan over a bitmap
of ids: the same arithmetic, so the same float32 scores and order as the full scan). If the k-th of those beats the
best any vector left out could reach (the ``k'``-th float16 score plus the bound), no vector left out belongs in the
top k, and the answer is the full scan's. Otherwise the full scan runs: the answer is always exact; only its cost
varies. bench/README.md has the figures ("A flat scan in half precision, proven exact").
"""

from __future__ import annotations

import numpy as np

BLOCK = 65_536  # vectors read at a time to build the copy
# Candidates scanned in full precision beyond k: k + max(MIN_EXTRA, k // EXTRA_FRACTION).
MIN_EXTRA = 32
EXTRA_FRACTION = 4
# Below this many vectors a flat scan is already cheap: no half-precision copy is kept (``CertifiedFlat.of``).
MIN_VECTORS = 2_000
# ... nor used for a k whose candidates are more than a quarter of the vectors.
MIN_VECTORS_PER_CANDIDATE = 4


class CertifiedFlat:
    """The exact top-k of a flat inner-product ``index`` for one query, or None where the bound cannot prove it
    (then the caller scans the index in full). Keeps a float16 copy of the index's vectors: 2 bytes a dimension."""

    def __init__(self, index):
        import faiss

        self.index, self._faiss = index, faiss
        self.codes = faiss.IndexScalarQuantizer(index.d, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        # |q.x - q.x16| <= |q| * error; each float32 sum of d products is within gamma_d * |q| |x| of the true one
        # (Higham's bound, u = 2^-24), for the index's score and for the float16 scan's alike. Read a block of
        # vectors at a time: a copy of them all would briefly double a large flat index's memory.
        error = largest = 0.0
        for start in range(0, index.ntotal, BLOCK):
            vectors = index.reconstruct_n(start, min(BLOCK, index.ntotal - start))
            self.codes.add(vectors)
            decoded = self.codes.sa_decode(self.codes.sa_encode(vectors))
            error = max(error, float(np.linalg.norm(vectors - decoded, axis=1).max()))
            largest = max(largest, float(np.linalg.norm(vectors, axis=1).max()),
                          float(np.linalg.norm(decoded, axis=1).max()))
        unit = 2.0 ** -24
        gamma = index.d * unit / (1 - index.d * unit)
        self.bound = 2 * (error + 2 * gamma * largest)  # twice the proven bound, per unit of |q|
        self.proven = 0
        self.scanned = 0  # searches the bound could not prove, answered by the full scan

    @classmethod
    def of(cls, index) -> CertifiedFlat | None:
        """One for a flat inner-product index of at least ``MIN_VECTORS``; None for any other index."""
        import faiss

        if not isinstance(index, faiss.IndexFlat) or index.metric_type != faiss.METRIC_INNER_PRODUCT:
            return None
        return cls(index) if index.ntotal >= MIN_VECTORS else None

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(scores, ids) as ``index.search(query, k)`` answers for one query row, or None when not proven (or when
        the candidates would be too many of the vectors to save anything)."""
        wanted = candidates(k)
        if query.shape[0] != 1 or self.index.ntotal < MIN_VECTORS_PER_CANDIDATE * wanted:
            return None
        rough, ids = self.codes.search(query, wanted)
        ids = ids[0]
        chosen = np.zeros(self.index.ntotal, dtype=bool)
        chosen[ids] = True
        bits = np.packbits(chosen, bitorder="little")  # FAISS's bitmap: id i is bit i % 8 of byte i // 8
        among = self._faiss.SearchParameters(sel=self._faiss.IDSelectorBitmap(self.index.ntotal,
                                                                               self._faiss.swig_ptr(bits)))
        scores, found = self.index.search(query, k, params=among)
        reachable = float(rough[0, -1]) + float(np.linalg.norm(query[0])) * self.bound
        if found[0, -1] >= 0 and float(scores[0, -1]) > reachable:
            self.proven += 1
            return scores, found
        self.scanned += 1
        return None


def candidates(k: int) -> int:
    """How many of the float16 scan's best are searched in full precision for a top ``k``."""
    return k + max(MIN_EXTRA, k // EXTRA_FRACTION)
