"""Incremental reindexing in one run: a full build, then the same corpus with a few documents changed,
then again with no change, each into the same root; and a full build of the changed corpus into another
root with ``--no-reuse``, the oracle the incremental version must equal.

The changed corpus (written under ``--work``) has ``--changed`` of the documents with their text edited
(a sentence appended), ``--deleted`` removed and ``--added`` new ones (copies of other documents' texts
under new ids, with a new sentence), picked with a fixed seed. Every build is ``python -m index_build``
as a user runs it; its wall time is measured around the command.

Equality: every test query of the dataset is searched on both versions in-process, BM25 and dense
legs separately (top 100 each, chunk ids and scores), and the stored vectors, chunk tables and
corpus-wide BM25 statistics are compared.

    python -m bench.incremental --data ../shared/data --dataset scifact --shards 3

At scale, the 205k-document corpus of ``bench.scale_corpus`` read from 8 Parquet files (``--files 8``: each
corpus is split into that many files, so every build reads a folder in parallel); ``--encoder hashing:384``
leaves the embedding out, so what is timed is everything else an incremental build does (a full MiniLM
build of 205k documents takes about 2.5 hours on 2 cores; with MiniLM add the changed chunks' embedding):

    python -m bench.incremental --data bench/out --dataset scifact-200k --files 8 --encoder hashing:384 \
        --work bench/out/incremental-200k --out bench/results/incremental_200k_hashing.json
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from bench.common import load_beir, machine, write_record
from bench.read_throughput import split


def build(corpus: Path, root: Path, version: str, shards: int, *extra: str) -> tuple[float, str]:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "index_build", "--corpus", str(corpus), "--out", str(root),
                           "--shards", str(shards), "--version", version, "--no-progress", *extra],
                          check=True, capture_output=True, text=True)
    return time.perf_counter() - t, done.stdout


def changed_corpus(source: Path, target: Path, changed: float, deleted: float, added: float, seed: int = 0) -> dict:
    docs = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    rng = random.Random(seed)
    ids = [d["_id"] for d in docs]
    n_changed, n_deleted, n_added = (max(1, round(len(docs) * f)) for f in (changed, deleted, added))
    picked = rng.sample(ids, n_changed + n_deleted)
    edit, drop = set(picked[:n_changed]), set(picked[n_changed:])
    out = []
    for d in docs:
        if d["_id"] in drop:
            continue
        if d["_id"] in edit:
            d = {**d, "text": d["text"] + " This abstract was revised after publication."}
        out.append(d)
    for i, d in enumerate(rng.sample(docs, n_added)):
        out.append({**d, "_id": f"added-{i:04d}", "text": d["text"] + " A new record added for this benchmark."})
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(json.dumps(d) + "\n" for d in out))
    return {"documents": len(out), "changed": n_changed, "deleted": n_deleted, "added": n_added}


def compare(a: Path, b: Path, queries: list[str]) -> dict:
    """How two versions differ: stored data, and every query's top 100 of each leg."""
    from deployments.search.inprocess import LocalIndex
    from index_format.bm25_stats import read_stats
    from index_format.versions import read_version_manifest

    out = {"tables_equal": True, "max_vector_diff": 0.0}
    for shard in read_version_manifest(a).shards:
        ta = pq.read_table(a / "shards" / shard / "chunks.parquet").drop(["source"])
        tb = pq.read_table(b / "shards" / shard / "chunks.parquet").drop(["source"])
        out["tables_equal"] &= ta.equals(tb)
        va, vb = np.load(a / "shards" / shard / "embeddings.npy"), np.load(b / "shards" / shard / "embeddings.npy")
        out["max_vector_diff"] = max(out["max_vector_diff"], float(np.abs(va - vb).max()) if len(va) else 0.0)
    sa, sb = read_stats(a / "bm25"), read_stats(b / "bm25")
    out["bm25_stats_equal"] = sa[0] == sb[0] and sa[1].equals(sb[1])
    ia, ib = LocalIndex(a), LocalIndex(b)
    vectors = ia.embed(queries)
    same_bm25 = same_dense = 0
    for q, v in zip(queries, vectors, strict=True):
        same_bm25 += [(h.chunk_id, round(h.score, 4)) for h in ia.bm25(q, 100)] == \
                     [(h.chunk_id, round(h.score, 4)) for h in ib.bm25(q, 100)]
        same_dense += [h.chunk_id for h in ia.dense(v, 100)] == [h.chunk_id for h in ib.dense(v, 100)]
    out.update(queries=len(queries), bm25_top100_identical=same_bm25, dense_top100_identical=same_dense)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.incremental", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="folder holding BEIR datasets")
    ap.add_argument("--dataset", default="scifact")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--changed", type=float, default=0.01, help="share of documents with their text edited")
    ap.add_argument("--deleted", type=float, default=0.001)
    ap.add_argument("--added", type=float, default=0.001)
    ap.add_argument("--files", type=int, default=0,
                    help="split each corpus into this many Parquet files, read in parallel (0: one JSONL file)")
    ap.add_argument("--encoder", default=None, help="the builds' --encoder (default: the build's own default)")
    ap.add_argument("--work", type=Path, default=Path("bench/out/incremental"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/incremental.json"))
    args = ap.parse_args(argv)

    shutil.rmtree(args.work, ignore_errors=True)
    corpus = args.data / args.dataset / "corpus.jsonl"
    edited = args.work / "changed" / "corpus.jsonl"
    delta = changed_corpus(corpus, edited, args.changed, args.deleted, args.added)
    if args.files:
        corpus = split(corpus, args.work / "original-files", args.files)[0].parent
        edited = split(edited, args.work / "changed-files", args.files)[0].parent
    root, oracle = args.work / "index", args.work / "full"
    common = ["--encoder", args.encoder] if args.encoder else []
    record: dict = {"machine": machine(), "dataset": args.dataset, "shards": args.shards, "files": args.files,
                    "encoder": args.encoder or "default", "delta": delta, "builds": {}}
    steps = [("full", corpus, root, []), ("incremental", edited, root, []), ("no change", edited, root, []),
             ("full of the changed corpus (oracle, --no-reuse)", edited, oracle, ["--no-reuse"])]
    for i, (name, source, into, extra) in enumerate(steps):
        seconds, summary = build(source, into, f"v{i}", args.shards, *common, *extra)
        record["builds"][name] = {"seconds": round(seconds, 1), "summary": summary}
        print(f"--- {name}: {seconds:.1f} s\n{summary}", flush=True)
    full_s = record["builds"]["full"]["seconds"]
    for name in ("incremental", "no change"):
        record["builds"][name]["share_of_full"] = round(record["builds"][name]["seconds"] / full_s, 4)
    queries, _ = load_beir(args.data / args.dataset)
    record["incremental_vs_oracle"] = compare(root / "versions" / "v1", oracle / "versions" / "v3",
                                              list(queries.values()))
    record["no_change_vs_oracle"] = compare(root / "versions" / "v2", oracle / "versions" / "v3",
                                            list(queries.values()))
    write_record(args.out, record)
    print(json.dumps({k: v for k, v in record.items() if k != "builds"}, indent=1))
    print("| build | seconds | share of the full build |\n|---|---|---|")
    for name, b in record["builds"].items():
        print(f"| {name} | {b['seconds']} | {b.get('share_of_full', '')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
