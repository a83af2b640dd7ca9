"""Build one shard's FAISS index: exact inner product by default, HNSW or IVF when asked.

Vectors are unit length, so inner product is cosine similarity. Row ``i`` of the index is row ``i`` of
the shard's chunk table; FAISS ids are those row numbers. Flat and IVF are built on a GPU when faiss
has one and the device allows it, then moved back to the CPU to be written; HNSW is built on the CPU
(faiss has no GPU HNSW builder).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FaissSpec:
    kind: str = "flat"  # flat | hnsw | ivf
    hnsw_m: int = 32
    hnsw_ef_construction: int = 80
    ivf_nlist: int = 0  # 0: pick from the row count
    device: str = "auto"  # auto | cpu | cuda


def gpu_count() -> int:
    import faiss

    get = getattr(faiss, "get_num_gpus", None)
    return int(get()) if get else 0


def use_gpu(device: str) -> bool:
    """Whether to build on a GPU: ``auto`` when faiss sees one, ``cuda`` demands one."""
    if device == "cpu":
        return False
    gpus = gpu_count()
    if device == "cuda" and gpus == 0:
        raise RuntimeError(
            "device=cuda was asked for but faiss sees no GPU (is faiss-gpu-cu12 installed? `pip install .[gpu]`)"
        )
    return gpus > 0


def ivf_nlist_for(rows: int, requested: int) -> int:
    """Lists for IVF: the requested count, else about 4*sqrt(rows); never more than rows / 39.

    FAISS wants ~39 training points per centroid; below that k-means warns and clusters badly.
    """
    nlist = requested or int(4 * math.sqrt(max(rows, 1)))
    return max(1, min(nlist, rows // 39 or 1))


def build_faiss_index(vectors: np.ndarray, spec: FaissSpec):
    """A trained, filled CPU index over ``vectors`` (float32, unit rows)."""
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    rows, dim = vectors.shape
    if spec.kind == "flat" or rows == 0:  # an empty shard cannot train IVF; flat answers "no hits" alike
        index = faiss.IndexFlatIP(dim)
    elif spec.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = spec.hnsw_ef_construction
    elif spec.kind == "ivf":
        nlist = ivf_nlist_for(rows, spec.ivf_nlist)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
    else:
        raise ValueError(f"unknown faiss index type {spec.kind!r}: expected flat, hnsw or ivf")

    if spec.kind != "hnsw" and use_gpu(spec.device):
        resources = faiss.StandardGpuResources()
        gpu_index = faiss.index_cpu_to_gpu(resources, 0, index)
        if not gpu_index.is_trained:
            gpu_index.train(vectors)
        gpu_index.add(vectors)
        return faiss.index_gpu_to_cpu(gpu_index)

    if not index.is_trained:
        index.train(vectors)
    if rows:
        index.add(vectors)
    return index


def index_description(index) -> dict:
    import faiss

    out = {"class": type(index).__name__, "ntotal": int(index.ntotal), "dimension": int(index.d),
           "metric": "inner_product" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2"}
    if hasattr(index, "nlist"):
        out["nlist"] = int(index.nlist)
    if hasattr(index, "hnsw"):
        out["hnsw_m"] = int(index.hnsw.nb_neighbors(1))
        out["ef_construction"] = int(index.hnsw.efConstruction)
    return out
