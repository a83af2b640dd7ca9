"""Build throughput: what an index build costs beyond embedding, and BM25 next to Pyserini's own indexer.

For each dataset (a BEIR folder under --data) and each shard count, runs the real build job and records
docs/s and chunks/s, next to (a) the bare embedding throughput of the same model on the same chunk
texts in one plain process (the floor the build cannot beat on this machine), and (b) the time of
Anserini's own ``IndexCollection`` over the same chunks (what Pyserini's CLI indexer runs), beside the
Lucene part of our build. Writes JSON (``--out``) and prints a Markdown table for bench/README.md.

    python -m bench.build_throughput --data ../shared/data --datasets scifact cranfield --shards 1 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import machine


def bare_embedding(contents: list[str], encoder: str, sample: int, batch_size: int) -> dict:
    """Plain SentenceTransformer.encode over a sample of the same chunk texts, all cores, one process."""
    import torch

    from index_format.encoders import load_encoder

    torch.set_num_threads(os.cpu_count() or 1)
    enc = load_encoder(encoder, "cpu")
    texts = contents[:sample]
    enc.encode(texts[:batch_size], batch_size)  # warm-up
    t = time.perf_counter()
    enc.encode(texts, batch_size)
    seconds = time.perf_counter() - t
    return {"chunks": len(texts), "seconds": seconds, "chunks_per_s": len(texts) / seconds}


def anserini_alone(rows: list[tuple[str, str]]) -> float:
    """Seconds for Anserini's IndexCollection (1 thread) over the chunks, as Pyserini's CLI runs it."""
    from index_format.lucene import build_lucene_index, write_collection

    tmp = Path(tempfile.mkdtemp(prefix="bench-lucene-"))
    try:
        write_collection(rows, tmp / "coll")
        t = time.perf_counter()
        build_lucene_index(tmp / "coll", tmp / "index", heap="1g", threads=1)
        return time.perf_counter() - t
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.build_throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="folder holding BEIR dataset folders")
    parser.add_argument("--datasets", nargs="+", default=["scifact", "cranfield"])
    parser.add_argument("--shards", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--encoder", default="all-MiniLM-L6-v2")
    parser.add_argument("--chunk-size", type=int, default=128, help="words per chunk (1024: BEIR docs stay whole)")
    parser.add_argument("--chunk-overlap", type=int, default=24)
    parser.add_argument("--bare-sample", type=int, default=1024, help="chunks embedded for the bare figure")
    parser.add_argument("--work", type=Path, default=Path("bench/out/indexes"))
    parser.add_argument("--out", type=Path, default=Path("bench/out/build_throughput.json"))
    args = parser.parse_args(argv)

    from index_build.build import build_index, read_and_chunk
    from index_build.config import BuildConfig

    record = {"machine": machine(), "encoder": args.encoder, "chunk_size": args.chunk_size,
              "chunk_overlap": args.chunk_overlap, "runs": []}
    for name in args.datasets:
        corpus = args.data / name
        base = BuildConfig(corpus=corpus, out=args.work / name, shards=1, encoder=args.encoder, progress=False,
                           chunk_size=args.chunk_size, chunk_overlap=args.chunk_overlap)
        chunks_by_shard, _ = read_and_chunk(base)
        chunks = chunks_by_shard[0]
        contents = [c.contents(base.prepend_title) for c in chunks]
        bare = bare_embedding(contents, args.encoder, args.bare_sample, base.embed_batch_size)
        lucene_alone = anserini_alone([(c.chunk_id, text) for c, text in zip(chunks, contents, strict=True)])
        print(f"{name}: bare embedding {bare['chunks_per_s']:.1f} chunks/s; Anserini alone {lucene_alone:.1f}s", flush=True)
        for shards in args.shards:
            cfg = BuildConfig(**(base.model_dump() | {"shards": shards, "out": args.work / f"{name}-{shards}"}))
            shutil.rmtree(cfg.out, ignore_errors=True)
            summary = build_index(cfg)
            total = summary.total_s
            run = {
                "dataset": name, "shards": shards, "docs": summary.docs, "chunks": summary.chunks,
                "seconds": summary.seconds, "docs_per_s": summary.docs / total, "chunks_per_s": summary.chunks / total,
                "bare_embedding_chunks_per_s": bare["chunks_per_s"],
                "build_vs_bare_embedding": (summary.chunks / total) / bare["chunks_per_s"],
                "lucene_task_seconds": summary.seconds.get("lucene (sum of shard tasks)"),
                "anserini_alone_seconds": lucene_alone,
            }
            record["runs"].append(run)
            print(json.dumps(run), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"\n{record['machine']['date']}, {record['machine']['cpu']}, {record['machine']['cores']} cores, "
          f"encoder {args.encoder}\n")
    print("| dataset | shards | docs | chunks | build s | docs/s | chunks/s | bare embed chunks/s | build/bare "
          "| Lucene tasks s (sum) | Anserini alone s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in record["runs"]:
        lt = r["lucene_task_seconds"]
        print(f"| {r['dataset']} | {r['shards']} | {r['docs']:,} | {r['chunks']:,} | {r['seconds']['total']:.1f} "
              f"| {r['docs_per_s']:.1f} | {r['chunks_per_s']:.1f} | {r['bare_embedding_chunks_per_s']:.1f} "
              f"| {r['build_vs_bare_embedding']:.2f} | {lt:.1f} | {r['anserini_alone_seconds']:.1f} |"
              if lt is not None else f"| {r['dataset']} | {r['shards']} | ... |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
