"""Approximate dense search measured against exact: every index type, its search options, under filters.

Reads the vectors written by ``bench.minilm_vectors`` (MiniLM vectors of the 205k corpus, real and a checked
proxy), shards the rows as the build does (by document id), builds every index type per shard with the
build's own code (``index_build.faiss_index``) and searches through the serving code
(``deployments.shard.dense.DenseShard``: the same efSearch floor, nprobe bound and exact rescoring). For
each type and setting, unfiltered and under filters that keep 10% and 1% of the rows (a document's bucket by
hash, as a metadata filter selects rows), over the split's queries:

- recall@10 and recall@200 of the merged top-200 against ``flat`` (exact) with the same filter;
- CPU per shard search (process time of one single-threaded search of one shard, top-200);
- bytes per chunk (the serialized index over its rows) and build seconds (all shards, one thread);
- nDCG@10 of the dense leg and, with ``--index`` (a version of the same corpus and chunking: its BM25 leg),
  of the hybrid the service ranks by default (weighted fusion, 0.5 / 0.5 over min-max scores, 200 a leg).

``--check-proxy`` measures the rows embedded for real twice, with their real vectors and with the proxies
substituted for the real distractors: how far the proxy's recall is from the real one's.

    python -m bench.ann --vectors bench/out/minilm-205k --corpus bench/out/scifact-200k \\
        --index bench/out/indexes/scifact-200k-4 --out bench/results/ann_205k.json
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as in a replica (Ray gives it one thread): no spinning BLAS
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from bench.common import load_beir, machine, write_record

SETTINGS = {  # HNSW never explores fewer than the k = 200 asked for, so efSearch below 200 is efSearch 200
    "flat": [{}],
    "version": [{}, {"refine": 8}, {"refine": 16}],  # the version's own index (--from-index), as built
    "hnsw": [{"ef_search": e} for e in (128, 256, 512)],
    "hnsw_sq8": [{"ef_search": e} for e in (128, 256)],
    "ivf": [{"nprobe": p} for p in (16, 32, 64, 128)],
    "ivf_sq8": [{"nprobe": p} for p in (32, 64)],
    "ivf_sq4": [{"nprobe": p} for p in (32, 64, 128)],
    "ivf_pq": [{"nprobe": p} for p in (32, 64, 128)],
    "ivf_rabitq": [{"nprobe": p, "refine": r} for p in (32, 64, 128) for r in (2, 4, 8)],
    "ivf_rabitq:1": [{"nprobe": 64, "refine": r} for r in (4, 8, 16)],  # one bit a dimension
    "ivf_rabitq:2": [{"nprobe": 64, "refine": r} for r in (4, 8, 16)],
}
FILTERS = {"none": None, "10%": 10, "1%": 1}
K = 200


def bucket(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=4).digest(), "big") % 100


class Shards:
    """The rows split as the build splits them, each shard's vectors and its allowed rows per filter."""

    def __init__(self, vectors: np.ndarray, chunk_ids: list[str], doc_ids: list[str], shards: int):
        from index_format.sharding import shard_of

        of = np.array([shard_of(d, shards) for d in doc_ids])
        buckets = np.array([bucket(d) for d in doc_ids])
        self.rows = [np.flatnonzero(of == s) for s in range(shards)]
        self.vectors = [np.ascontiguousarray(vectors[r]) for r in self.rows]
        self.ids = [[chunk_ids[i] for i in r] for r in self.rows]
        self.allowed = {name: [None if keep is None else np.flatnonzero(buckets[r] < keep) for r in self.rows]
                        for name, keep in FILTERS.items()}
        self.folders: list[Path] = []

    @classmethod
    def of_version(cls, folder: Path) -> Shards:
        """A built version's own shards: each one's stored vectors (memory-mapped) and chunk ids."""
        from index_format.manifest import CHUNKS_FILE, EMBEDDINGS_FILE
        from index_format.versions import read_version_manifest

        self = cls.__new__(cls)
        self.folders = [folder / "shards" / name for name in read_version_manifest(folder).shards]
        self.vectors = [np.load(f / EMBEDDINGS_FILE, mmap_mode="r") for f in self.folders]
        tables = [pq.read_table(f / CHUNKS_FILE, columns=["chunk_id", "doc_id"]) for f in self.folders]
        self.ids = [t["chunk_id"].to_pylist() for t in tables]
        buckets = [np.array([bucket(d) for d in t["doc_id"].to_pylist()]) for t in tables]
        self.allowed = {name: [None if keep is None else np.flatnonzero(b < keep) for b in buckets]
                        for name, keep in FILTERS.items()}
        return self


def build(shards: Shards, kind: str) -> tuple[list, float, float]:
    """(DenseShards, build seconds over all shards, bytes per vector)."""
    import faiss

    from deployments.shard.dense import DenseShard
    from index_build.faiss_index import FaissSpec, build_faiss_index, resolved_kind, search_options
    from index_format.manifest import FAISS_FILE, read_shard_manifest

    faiss.omp_set_num_threads(1)
    name, _, bits = kind.partition(":")  # ivf_rabitq:1 is ivf_rabitq at one bit a dimension
    spec = FaissSpec(kind=name, device="cpu", **({"rabitq_bits": int(bits)} if bits else {}))
    out, seconds, size, rows = [], 0.0, 0, 0
    for s, (vectors, ids) in enumerate(zip(shards.vectors, shards.ids, strict=True)):
        t = time.process_time()
        if kind == "version":
            index = faiss.read_index(str(shards.folders[s] / FAISS_FILE))
            options = read_shard_manifest(shards.folders[s]).faiss
        else:
            index = build_faiss_index(vectors, spec)
            options = search_options(spec, resolved_kind(spec, len(vectors)), index)
        seconds += time.process_time() - t
        size += len(faiss.serialize_index(index))
        rows += index.ntotal
        out.append(DenseShard(index, ids, options=options, vectors=vectors))
    return out, seconds, size / rows


def search(dense: list, queries: np.ndarray, allowed: list, ann: dict,
           share: bool = False) -> tuple[list[list[tuple[str, float]]], float, float, int]:
    """Merged top-K (chunk id, score) per query, CPU ms per shard search, CPU ms per query (all shards), and how
    many shards were asked again. ``share``: each shard is asked for its likely share of the top K and again for
    K where that may not be enough, as a shard group asks (``deployments.shard.shares.shard_depth``)."""
    from deployments.shard.group import LegPart, complete_legs
    from deployments.shard.shares import shard_depth

    results, cpu, calls, asked_again = [], 0.0, 0, 0
    depth = shard_depth(K, len(dense)) if share else K

    def one(i: int, q: np.ndarray, k: int) -> LegPart:
        nonlocal cpu, calls
        t = time.process_time()
        rows, scores = dense[i].search_rows(q, k, allowed[i], ann or None)
        cpu += time.process_time() - t
        calls += 1
        return LegPart(rows, scores, 0.0)

    for q in queries:
        parts = [one(i, q, depth) for i in range(len(dense))]
        t = time.process_time()
        asked_again += complete_legs(parts, K, depth, lambda i, q=q: one(i, q, K))
        cpu += time.process_time() - t
        merged = []
        for shard, part in zip(dense, parts, strict=True):
            merged += [(shard.chunk_ids[r], float(s)) for r, s in zip(part.rows, part.scores, strict=True)]
        merged.sort(key=lambda h: (-h[1], h[0]))
        results.append(merged[:K])
    return results, cpu * 1000 / max(calls, 1), cpu * 1000 / max(len(queries), 1), asked_again


def exact_by_blocks(shards: Shards, queries: np.ndarray, allowed: list,
                    block: int = 1 << 18) -> tuple[list[list[tuple[str, float]]], float]:
    """Exact top-K of every query at once, each shard's stored vectors read once in blocks (a version's shards at
    ten million chunks hold more float vectors than memory would hold as flat indexes). Returns the merged top-K
    per query and the CPU seconds it took."""
    t = time.process_time()
    q = np.ascontiguousarray(queries, dtype=np.float32)
    held = [np.empty((len(q), 0), dtype=np.float32), np.empty((len(q), 0), dtype=np.int64)]
    for s, vectors in enumerate(shards.vectors):
        keep = allowed[s]
        for start in range(0, len(vectors), block):
            rows = np.arange(start, min(start + block, len(vectors)))
            if keep is not None:
                rows = keep[(keep >= rows[0]) & (keep <= rows[-1])]
                if not len(rows):
                    continue
            scores = q @ np.asarray(vectors[rows], dtype=np.float32).T
            top = np.argpartition(-scores, min(K, scores.shape[1] - 1), axis=1)[:, :K]
            codes = rows[top] + (s << 40)  # shard and row in one number
            held = [np.concatenate([held[0], np.take_along_axis(scores, top, 1)], 1),
                    np.concatenate([held[1], codes], 1)]
            order = np.argsort(-held[0], axis=1, kind="stable")[:, :K]
            held = [np.take_along_axis(held[0], order, 1), np.take_along_axis(held[1], order, 1)]
    results = []
    for scores, codes in zip(*held, strict=True):
        hits = [(shards.ids[int(c) >> 40][int(c) & ((1 << 40) - 1)], float(x)) for x, c in zip(scores, codes,
                                                                                                   strict=True)]
        hits.sort(key=lambda h: (-h[1], h[0]))
        results.append(hits[:K])
    return results, time.process_time() - t


def recall(got: list[list[tuple[str, float]]], exact: list[list[tuple[str, float]]], k: int) -> float:
    values = []
    for g, e in zip(got, exact, strict=True):
        truth = {c for c, _ in e[:k]}
        if truth:
            values.append(len(truth & {c for c, _ in g[:k]}) / len(truth))
    return float(np.mean(values)) if values else 1.0


def ndcg(runs: list[list[tuple[str, float]]], qids: list[str], qrels: dict, bm25: dict | None) -> dict:
    from deployments.search.fusion import weighted
    from deployments.search.hits import Hit
    from relevance.metrics import ndcg_at
    from relevance.tuning import doc_ranking

    dense_total = hybrid_total = 0.0
    for qid, run in zip(qids, runs, strict=True):
        dense_total += ndcg_at(doc_ranking(run, limit=10), qrels[qid], 10)
        if bm25 is not None:
            fused = weighted([[Hit(c, s) for c, s in run], [Hit(c, s) for c, s in bm25[qid]]], [0.5, 0.5])
            hybrid_total += ndcg_at(doc_ranking([(h.chunk_id, h.score) for h in fused], limit=10), qrels[qid], 10)
    out = {"ndcg10_dense": round(dense_total / len(qids), 4)}
    if bm25 is not None:
        out["ndcg10_hybrid"] = round(hybrid_total / len(qids), 4)
    return out


def measure(shards: Shards, queries: np.ndarray, qids: list[str], qrels: dict, bm25: dict | None,
            kinds: list[str], label: str, depths: tuple[str, ...] = ("k",)) -> list[dict]:
    exact: dict[str, list] = {}
    rows = []
    for kind in kinds:
        t = time.perf_counter()
        if kind == "flat" and shards.folders:  # a built version: its stored vectors read once, not held
            row = {"vectors": label, "kind": kind, "setting": {}, "shard_depth": "k", "build_cpu_s": 0.0,
                   "bytes_per_chunk": float(shards.vectors[0].shape[1] * 4), "class": "exact_by_blocks"}
            for fname in FILTERS:
                exact[fname], cpu_s = exact_by_blocks(shards, queries, shards.allowed[fname])
                row[fname] = {"recall@10": 1.0, "recall@200": 1.0, "cpu_ms_per_query_batched":
                              round(cpu_s * 1000 / len(queries), 3)}
                if fname == "none" and qrels:
                    row[fname] |= ndcg(exact[fname], qids, qrels, bm25)
            rows.append(row)
            print(f"[{label}] flat (exact, by blocks): {json.dumps(row)} ({time.perf_counter() - t:.0f} s)", flush=True)
            continue
        dense, build_s, bytes_per = build(shards, kind)
        print(f"[{label}] {kind}: built in {build_s:.1f} s of CPU, {bytes_per:.0f} bytes a vector", flush=True)
        for ann in SETTINGS[kind]:
            for depth in depths:
                row = {"vectors": label, "kind": kind, "setting": ann, "shard_depth": depth,
                       "build_cpu_s": round(build_s, 2), "bytes_per_chunk": round(bytes_per, 1),
                       "class": type(dense[0].index).__name__}
                for fname in FILTERS:
                    results, cpu_ms, query_ms, asked_again = search(dense, queries, shards.allowed[fname], ann,
                                                                    share=depth == "share")
                    if kind == "flat" and depth == "k":
                        exact[fname] = results
                    row[fname] = {"recall@10": round(recall(results, exact[fname], 10), 4),
                                  "recall@200": round(recall(results, exact[fname], K), 4),
                                  "cpu_ms_per_shard_search": round(cpu_ms, 3),
                                  "cpu_ms_per_query": round(query_ms, 3), "shards_asked_again": asked_again}
                    if fname == "none" and qrels:
                        row[fname] |= ndcg(results, qids, qrels, bm25)
                rows.append(row)
                print(f"  {json.dumps(row)}", flush=True)
        del dense
        print(f"  ({time.perf_counter() - t:.0f} s)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ann", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vectors", type=Path, help="a folder written by bench.minilm_vectors")
    ap.add_argument("--from-index", type=Path, help="instead of --vectors: a built version (or an index root: its "
                    "active one), measured on its own shards and stored vectors, the queries embedded with its "
                    "encoder; the kind 'version' is its own index as built")
    ap.add_argument("--corpus", type=Path, required=True, help="the BEIR folder (queries and qrels)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--index", type=Path, help="a built version of the same corpus and chunking: its BM25 leg")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--kinds", nargs="+", choices=list(SETTINGS), default=None,
                    help="index types to measure (default: all; 'version' only with --from-index)")
    ap.add_argument("--check-proxy", action="store_true", help="also: real against proxy vectors, same rows")
    ap.add_argument("--shard-depth", nargs="+", choices=["k", "share"], default=["k"],
                    help="what each shard is asked for: all K (k), or its likely share of K and again for K where "
                    "that may not be enough (share: what a shard group asks); both to compare")
    ap.add_argument("--settings", nargs="+", metavar="JSON",
                    help="the ann settings to measure each kind but flat with, e.g. '{}' '{\"nprobe\": 532}' "
                    "(default: each kind's own list)")
    ap.add_argument("--filters", nargs="+", choices=list(FILTERS), default=list(FILTERS),
                    help="the filters to search under (default: all; 'none' alone at ten million chunks, where each "
                    "setting of each filter takes minutes)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/ann.json"))
    args = ap.parse_args(argv)
    for name in list(FILTERS):
        if name not in args.filters:
            del FILTERS[name]
    for kind in SETTINGS if args.settings else ():
        if kind != "flat":
            SETTINGS[kind] = [json.loads(s) for s in args.settings]

    if not args.vectors and not args.from_index:
        ap.error("give --vectors or --from-index")
    args.kinds = args.kinds or [k for k in SETTINGS if k != "version" or args.from_index]
    if "flat" not in args.kinds:
        args.kinds = ["flat", *args.kinds]  # the exact answer every recall is measured against
    if args.from_index:
        return _from_index(args)
    vectors = np.load(args.vectors / "vectors.npy")
    table = pq.read_table(args.vectors / "chunks.parquet")
    chunk_ids, doc_ids = table["chunk_id"].to_pylist(), table["doc_id"].to_pylist()
    kinds = np.array(table["vector"].to_pylist())
    queries = np.load(args.vectors / "queries.npy")
    qids = json.loads((args.vectors / "queries.json").read_text())
    _, qrels = load_beir(args.corpus, args.split)
    bm25 = None
    if args.index:
        from deployments.search.inprocess import LocalIndex

        texts, _ = load_beir(args.corpus, args.split)
        index = LocalIndex(args.index)
        bm25 = {qid: [(h.chunk_id, h.score) for h in index.bm25(texts[qid], K)] for qid in qids}
        del index
    record = {"machine": machine(), "vectors": str(args.vectors), "chunks": len(chunk_ids), "shards": args.shards,
              "queries": len(qids), "k": K, "filters": {k: v for k, v in FILTERS.items()},
              "check": json.loads((args.vectors / "check.json").read_text()), "rows": []}
    if args.check_proxy:
        subset = np.flatnonzero(kinds != "proxy")
        real = vectors[subset]
        proxied = real.copy()
        proxied[np.flatnonzero(kinds[subset] == "real")] = np.load(args.vectors / "proxy.npy")
        ids, docs = [chunk_ids[i] for i in subset], [doc_ids[i] for i in subset]
        for label, v in (("subset real", real), ("subset proxy", proxied)):
            record["rows"] += measure(Shards(v, ids, docs, args.shards), queries, qids, {}, None, args.kinds, label)
    record["rows"] += measure(Shards(vectors, chunk_ids, doc_ids, args.shards), queries, qids, qrels, bm25, args.kinds,
                              "all", tuple(args.shard_depth))
    write_record(args.out, record)
    _table(record)
    return 0


def _from_index(args) -> int:
    """The measurement on a built version's own shards (``--from-index``)."""
    from index_format.encoders import encode_queries, load_encoder
    from index_format.versions import read_version_manifest, resolve_version_dir

    folder = resolve_version_dir(args.from_index)
    manifest = read_version_manifest(folder)
    texts, qrels = load_beir(args.corpus, args.split)
    qids = sorted(qrels)
    queries = encode_queries(load_encoder(manifest.encoder), [texts[q] for q in qids], manifest.query_prompt or "")
    bm25 = None
    if args.index:
        from deployments.search.inprocess import LocalIndex

        index = LocalIndex(args.index)
        bm25 = {qid: [(h.chunk_id, h.score) for h in index.bm25(texts[qid], K)] for qid in qids}
        del index
    shards = Shards.of_version(folder)
    record = {"machine": machine(), "version": str(folder), "encoder": manifest.encoder,
              "chunks": int(sum(len(i) for i in shards.ids)), "shards": len(shards.ids), "queries": len(qids), "k": K,
              "filters": dict(FILTERS), "rows": measure(shards, queries, qids, qrels, bm25, args.kinds, "version",
                                                        tuple(args.shard_depth))}
    write_record(args.out, record)
    _table(record)
    return 0


def _table(record: dict) -> None:
    print("| vectors | type | setting | shard depth | bytes/chunk | build CPU s | recall@10 (none / 10% / 1%) | "
          "recall@200 (none / 10% / 1%) | CPU ms a query, 4 shards (none / 10% / 1%) | nDCG@10 dense | hybrid |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in record["rows"]:
        f = [r[name] for name in FILTERS]
        setting = ", ".join(f"{k} {v}" for k, v in r["setting"].items()) or ("exact" if r["kind"] == "flat" else "as built")
        print(f"| {r['vectors']} | {r['kind']} | {setting} | {r['shard_depth']} | {r['bytes_per_chunk']:.0f} | "
              f"{r['build_cpu_s']} | {' / '.join(str(x['recall@10']) for x in f)} | "
              f"{' / '.join(str(x['recall@200']) for x in f)} | "
              f"{' / '.join(str(x.get('cpu_ms_per_query', '-')) for x in f)} | {f[0].get('ndcg10_dense', '')} | "
              f"{f[0].get('ndcg10_hybrid', '')} |")


if __name__ == "__main__":
    raise SystemExit(main())
