"""Build one shard's FAISS index: exact, graph (HNSW), inverted lists (IVF), each of the last two with
full vectors or quantized codes (8-bit scalar: a quarter of the bytes, 4-bit an eighth; product quantization: 1/32;
RaBitQ: 1 to 8 bits a dimension and a few floats a vector, 56 bytes at one bit and 212 at four for 384 dimensions).

Vectors are unit length, so inner product is cosine similarity. Row ``i`` of the index is row ``i`` of
the shard's chunk table; FAISS ids are those row numbers. Flat and IVF are built on a GPU when faiss
has one and the device allows it, then moved back to the CPU to be written; HNSW is built on the CPU
(faiss has no GPU HNSW builder).

The search-time knobs (``ef_search`` of HNSW, ``nprobe`` of IVF, ``refine`` for quantized codes: how many
times k candidates are rescored exactly with the shard's stored float vectors) are index options: the
build records them in the shard manifest, a serving collection or a request may override them.
``auto`` picks the type by the shard's size (``auto_kind``); bench/README.md, "Approximate search",
has the figures that chose the rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

KINDS = ("flat", "hnsw", "hnsw_sq8", "ivf", "ivf_sq8", "ivf_sq4", "ivf_pq", "ivf_rabitq")
QUANTIZED = ("hnsw_sq8", "ivf_sq8", "ivf_sq4", "ivf_pq", "ivf_rabitq")
AUTO_FLAT_BELOW = 20_000  # rows of a shard under which ``auto`` stays exact (see auto_kind)
AUTO_CODES_FROM = 1_000_000  # rows of a shard from which ``auto`` holds 4-bit codes rescored from disk (auto_kind)
MIN_TRAIN_ROWS = 1_000  # below this a trained index (IVF, quantizers) is not worth training: built flat


@dataclass(frozen=True)
class FaissSpec:
    kind: str = "flat"  # one of KINDS, or "auto"
    hnsw_m: int = 32
    hnsw_ef_construction: int = 80
    ivf_nlist: int = 0  # 0: pick from the row count
    device: str = "auto"  # auto | cpu | cuda
    ef_search: int = 0  # 0: DEFAULT_EF_SEARCH (never below the k asked for, at search time)
    nprobe: int = 0  # 0: default_nprobe(nlist)
    pq_m: int = 0  # 0: dimension / 8 sub-quantizers (8 bits each)
    refine: int = 0  # 0: DEFAULT_REFINE for quantized types, 1 (none) otherwise
    rabitq_bits: int = 4  # ivf_rabitq: bits a dimension of each code


def spec_of_config(c: dict, kind: str | None = None, device: str = "auto") -> FaissSpec:
    """The FAISS options a build recorded (its ``build_config``), of ``kind`` (default: the build's own)."""
    kind = kind or c.get("faiss_index", "auto")
    return FaissSpec(getattr(kind, "value", kind), int(c.get("hnsw_m", 32)), int(c.get("hnsw_ef_construction", 80)),
                     int(c.get("ivf_nlist", 0)), device, int(c.get("hnsw_ef_search", 0)), int(c.get("ivf_nprobe", 0)),
                     int(c.get("pq_m", 0)), int(c.get("refine", 0)), int(c.get("rabitq_bits", 4)))


DEFAULT_EF_SEARCH = 128
DEFAULT_REFINE = 4


def auto_kind(rows: int) -> str:
    """The index type ``auto`` builds for a shard of ``rows`` vectors: exact below AUTO_FLAT_BELOW rows, HNSW
    above, IVF lists of 4-bit codes (``ivf_sq4``) from AUTO_CODES_FROM rows. Measured on MiniLM vectors of the 205k
    corpus (bench/README.md, "Approximate search"): a flat scan costs about 0.073 us a row (4.2 ms at 57k rows), HNSW
    (M 32, efSearch 200) 1.25 ms at 57k rows for a recall@10 of 0.991 and a hybrid nDCG@10 0.0011 below flat; the
    two cost the same near 20k rows. A served HNSW chunk holds 2.98 KB of memory, an ``ivf_sq4`` one 0.31 KB
    (bench/README.md, "A shard held lean", 1.14M chunks), for more CPU a search: a shard of a million chunks is 3 GB
    of HNSW, which is where the codes' memory is worth their CPU."""
    if rows < AUTO_FLAT_BELOW:
        return "flat"
    return "hnsw" if rows < AUTO_CODES_FROM else "ivf_sq4"


def default_nprobe(nlist: int) -> int:
    """IVF lists scanned by default: an eighth of them, at least 16 (all of them when there are fewer)."""
    return min(nlist, max(16, nlist // 8))


def search_options(spec: FaissSpec, kind: str, index) -> dict:
    """What a shard manifest records for serving: the resolved search-time defaults of this index."""
    out: dict = {}
    if kind.startswith("hnsw"):
        out["ef_search"] = spec.ef_search or DEFAULT_EF_SEARCH
    if hasattr(index, "nlist"):
        out["nprobe"] = spec.nprobe or default_nprobe(int(index.nlist))
    out["refine"] = spec.refine or (DEFAULT_REFINE if kind in QUANTIZED else 1)
    return out


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


def resolved_kind(spec: FaissSpec, rows: int) -> str:
    kind = auto_kind(rows) if spec.kind == "auto" else spec.kind
    if kind not in KINDS:
        raise ValueError(f"unknown faiss index type {spec.kind!r}: expected auto or one of {', '.join(KINDS)}")
    if rows == 0 or (rows < MIN_TRAIN_ROWS and kind not in ("flat", "hnsw")):
        return "flat"  # an empty shard cannot train; a tiny one is scanned exactly as fast
    return kind


def factory_string(kind: str, rows: int, dim: int, spec: FaissSpec) -> str:
    nlist = ivf_nlist_for(rows, spec.ivf_nlist)
    pq_m = spec.pq_m or max(1, dim // 8)
    return {"flat": "Flat", "hnsw": f"HNSW{spec.hnsw_m},Flat", "hnsw_sq8": f"HNSW{spec.hnsw_m},SQ8",
            "ivf": f"IVF{nlist},Flat", "ivf_sq8": f"IVF{nlist},SQ8", "ivf_pq": f"IVF{nlist},PQ{pq_m}x8",
            "ivf_sq4": f"IVF{nlist},SQ4",
            # One bit a dimension with FAISS's fast-scan kernel: at the same CPU as the plain one it found 0.38 of the
            # exact top-10 against 0.06 (hashing vectors, bench/results/codes_1m/). More bits have only the plain
            # kernel, 5x slower than 4-bit scalar codes of the same size (ivf_sq4).
            "ivf_rabitq": f"IVF{nlist},RaBitQ{spec.rabitq_bits}" if spec.rabitq_bits > 1 else f"IVF{nlist},RaBitQfs"}[kind]


def metric_of(kind: str) -> int:
    """FAISS's metric for ``kind``: inner product, except RaBitQ's codes, which estimate an inner product over IVF
    residuals far worse than a distance (one-bit codes, random unit vectors: recall@10 at 4x rescoring 0.33 against
    0.63); on unit vectors the squared distance is 2 - 2 x the inner product, so the order is the same and
    ``DenseShard`` turns the distance back into the inner product."""
    import faiss

    return faiss.METRIC_L2 if kind == "ivf_rabitq" else faiss.METRIC_INNER_PRODUCT


ADD_BATCH = 65_536  # rows copied out of a memory-mapped array and added at a time
TRAIN_ROWS = 262_144  # at most this many rows, spread over the shard, train a quantizer or IVF lists


def _batches(vectors: np.ndarray):
    for start in range(0, len(vectors), ADD_BATCH):
        yield np.ascontiguousarray(vectors[start:start + ADD_BATCH], dtype=np.float32)


def _training_sample(vectors: np.ndarray) -> np.ndarray:
    """Rows spread evenly over the shard (corpus order is not random: the first rows may be one source)."""
    step = max(1, -(-len(vectors) // TRAIN_ROWS))
    return np.ascontiguousarray(vectors[::step], dtype=np.float32)


def build_faiss_index(vectors: np.ndarray, spec: FaissSpec):
    """A trained, filled CPU index over ``vectors`` (float32, unit rows; a memory-mapped array is read a batch at
    a time, so the build holds the index and one batch, never a second copy of the vectors)."""
    import faiss

    rows, dim = vectors.shape
    kind = resolved_kind(spec, rows)
    index = faiss.IndexFlatIP(dim) if kind == "flat" else \
        faiss.index_factory(dim, factory_string(kind, rows, dim, spec), metric_of(kind))
    if kind.startswith("hnsw"):
        index.hnsw.efConstruction = spec.hnsw_ef_construction
        index.hnsw.efSearch = spec.ef_search or DEFAULT_EF_SEARCH
    if hasattr(index, "nprobe"):
        index.nprobe = spec.nprobe or default_nprobe(int(index.nlist))
    if hasattr(index, "do_polysemous_training"):
        index.do_polysemous_training = False  # only for polysemous search, which is not used; 40x the PQ's training

    if not kind.startswith("hnsw") and use_gpu(spec.device):
        resources = faiss.StandardGpuResources()
        gpu_index = faiss.index_cpu_to_gpu(resources, 0, index)
        if not gpu_index.is_trained:
            gpu_index.train(_training_sample(vectors))
        for batch in _batches(vectors):
            gpu_index.add(batch)
        return faiss.index_gpu_to_cpu(gpu_index)

    if not index.is_trained:
        index.train(_training_sample(vectors))
    for batch in _batches(vectors):
        index.add(batch)
    return index


def index_description(index) -> dict:
    import faiss

    out = {"class": type(index).__name__, "ntotal": int(index.ntotal), "dimension": int(index.d),
           "metric": "inner_product" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2",
           "bytes_per_vector": index_bytes_per_vector(index)}
    if hasattr(index, "nlist"):
        out["nlist"] = int(index.nlist)
    if hasattr(index, "hnsw"):
        out["hnsw_m"] = int(index.hnsw.nb_neighbors(1))
        out["ef_construction"] = int(index.hnsw.efConstruction)
    return out


def index_bytes_per_vector(index) -> float:
    """Bytes the index holds per vector (codes, graph links, list ids), from its serialized size."""
    import faiss

    if index.ntotal == 0:
        return 0.0
    return round(len(faiss.serialize_index(index)) / index.ntotal, 1)
