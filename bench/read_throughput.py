"""Corpus read throughput: one process reading and chunking every record, against the build's read tasks.

The corpus (a BEIR folder's ``corpus.jsonl``, e.g. the 205k-document one of ``bench.scale_corpus``) is
also split into ``--files`` Parquet files. Each timed on its own: one process reading and chunking the
JSONL file, then the Parquet files (``index_build.build.read_and_chunk``: what a driver that reads the
corpus itself costs), and the build's own read stage over the same JSONL file and over the Parquet files:
the splits planned (one streaming pass that also fingerprints), then one Ray task per split parsing,
chunking and writing per-shard fragments (Ray started beforehand, its start timed apart).

    python -m bench.scale_corpus --data ../shared/data/scifact --distractors 200000 --out bench/out/scifact-200k
    python -m bench.read_throughput --corpus bench/out/scifact-200k
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import machine, write_record


def split(corpus: Path, folder: Path, files: int) -> list[Path]:
    records = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
    folder.mkdir(parents=True, exist_ok=True)
    size = -(-len(records) // files)
    out = []
    for i in range(files):
        part = records[i * size:(i + 1) * size]
        for r in part:  # one type per column: metadata objects as JSON text
            if isinstance(r.get("metadata"), dict):
                r["metadata"] = json.dumps(r["metadata"])
        path = folder / f"part-{i:02d}.parquet"
        pq.write_table(pa.Table.from_pylist(part), path)
        out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.read_throughput", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a BEIR folder (its corpus.jsonl is read)")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--split-mb", type=int, default=32, help="the build's --read-split-mb")
    ap.add_argument("--work", type=Path, default=Path("bench/out/read_throughput"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/read_throughput.json"))
    args = ap.parse_args(argv)
    import shutil

    import ray

    from index_build.build import ensure_ray, read_and_chunk
    from index_build.config import BuildConfig
    from index_build.splits import plan_splits, read_split

    jsonl = args.corpus / "corpus.jsonl"
    files = split(jsonl, args.work / "parquet", args.files)
    record: dict = {"machine": machine(), "corpus": str(args.corpus), "files": len(files), "shards": args.shards,
                    "split_mb": args.split_mb}

    def timed(name, fn):
        t = time.perf_counter()
        docs, chunks = fn()
        seconds = time.perf_counter() - t
        record[name] = {"seconds": round(seconds, 2), "documents": docs, "chunks": chunks,
                        "docs_per_s": round(docs / seconds)}
        print(name, record[name], flush=True)

    def one_process(corpus):
        cfg = BuildConfig(corpus=corpus, out=args.work / "unused", shards=args.shards)
        chunks, _ = read_and_chunk(cfg)
        return len({c.doc_id for shard in chunks for c in shard}), sum(len(c) for c in chunks)

    def read_tasks(paths):
        cfg = BuildConfig(corpus=jsonl, out=args.work / "unused", shards=args.shards)
        work = args.work / "fragments"
        shutil.rmtree(work, ignore_errors=True)
        splits, _ = plan_splits(paths, args.split_mb * 2**20)
        task = ray.remote(num_cpus=1)(read_split)
        results = ray.get([task.remote(s, str(work), cfg.shards, cfg.chunk_size, cfg.chunk_overlap, cfg.id_fields,
                                       cfg.text_fields, False) for s in splits])
        record.setdefault("tasks", {})[str(len(paths))] = len(splits)
        return (sum(c["docs"] for r in results for c in r["shards"]),
                sum(c["chunks"] for r in results for c in r["shards"]))

    timed("one process, one JSONL file, read+chunk", lambda: one_process(jsonl))
    timed(f"one process, {len(files)} Parquet files, read+chunk", lambda: one_process(args.work / "parquet"))
    t = time.perf_counter()
    ensure_ray()
    record["ray_start_s"] = round(time.perf_counter() - t, 2)
    timed("build read tasks, one JSONL file", lambda: read_tasks([jsonl]))
    timed(f"build read tasks, {len(files)} Parquet files", lambda: read_tasks(files))
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
