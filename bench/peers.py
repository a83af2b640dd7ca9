"""Peers side by side, same corpus, same machine, same embedding model, one run.

(a) Pyserini: ``LuceneSearcher`` BM25 (k1=0.9, b=0.4) in-process over one unsharded index, one
    thread: what a single Lucene searcher does without any service around it.
(b) LangChain: ``EnsembleRetriever`` of ``BM25Retriever`` + FAISS (weights 0.7 dense / 0.3 BM25, or
    ``--langchain-dense-weight``) behind FastAPI
    (``bench/langchain_service.py``, in its own process).
(c) This project over HTTP (``python -m deployments``), hybrid search with its defaults.

For each: nDCG@10 over the dataset's test queries (ir_measures), then closed-loop load for
``--seconds`` at ``--concurrency`` clients: QPS, p50 / p99 latency and server CPU seconds per query
(the machine's busy time minus this client's own). The services run one at a time.

    python -m bench.peers --data ../shared/data --datasets scifact cranfield \\
        --index scifact=bench/out/indexes/scifact-4 --index cranfield=bench/out/indexes/cranfield-4

The LangChain packages are not part of this project's environment: ``make bench-peers`` installs
bench/requirements-peers.txt first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench.common import load_beir, machine, served, service_process, write_record
from bench.cpu import own_cpu_s
from bench.quality import evaluate, pyserini_reference, run_config
from bench.speed import load_level


def pyserini_speed(index: Path, texts: list[str], seconds: float) -> dict:
    from pyserini.search.lucene import LuceneSearcher

    searcher = LuceneSearcher(str(index))
    searcher.set_bm25(0.9, 0.4)
    for t in texts[:20]:
        searcher.search(t, k=10)
    latencies = []
    c0, t0 = own_cpu_s(), time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < seconds:
        t = time.perf_counter()
        searcher.search(texts[i % len(texts)], k=10)
        latencies.append(time.perf_counter() - t)
        i += 1
    wall = time.perf_counter() - t0
    latencies.sort()
    return {"concurrency": 1, "requests": i, "errors": 0, "seconds": wall, "qps": i / wall,
            "p50_ms": 1000 * latencies[len(latencies) // 2], "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
            "server_cpu_s_per_query": (own_cpu_s() - c0) / i}


def over_http(base: str, queries: dict[str, str], qrels, body: dict, concurrency: int, seconds: float) -> dict:
    run, _, _, errors, _ = run_config(base, queries, body)
    texts = list(queries.values())
    load_level(base, texts, {"limit": 10} | body, concurrency, 5)  # warm-up
    speed = load_level(base, texts, {"limit": 10} | body, concurrency, seconds)
    return {"quality": evaluate(qrels, run), "quality_errors": errors, "speed": speed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--datasets", nargs="+", default=["scifact", "cranfield"])
    ap.add_argument("--index", action="append", default=[], metavar="DATASET=ROOT",
                    help="this project's index of each dataset (whole documents, the same encoder)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--work", type=Path, default=Path("bench/out/peers"))
    ap.add_argument("--out", type=Path, default=Path("bench/out/peers.json"))
    ap.add_argument("--langchain-dense-weight", type=float, default=0.7,
                    help="the LangChain EnsembleRetriever's FAISS weight (BM25 gets the rest)")
    ap.add_argument("--port", type=int, default=8470)
    ap.add_argument("--only", nargs="+", choices=["pyserini", "langchain", "raysearch"],
                    default=["pyserini", "langchain", "raysearch"])
    args = ap.parse_args(argv)
    indexes = dict(item.split("=", 1) for item in args.index)

    record = {"machine": machine(), "concurrency": args.concurrency, "seconds": args.seconds, "datasets": {}}
    if args.out.exists():  # runs of other datasets or peers are kept
        record["datasets"] = json.loads(args.out.read_text()).get("datasets", {})
    for dataset in args.datasets:
        folder = args.data / dataset
        queries, qrels = load_beir(folder)
        texts = list(queries.values())
        rows = record["datasets"].setdefault(dataset, {})
        work = args.work / dataset
        work.mkdir(parents=True, exist_ok=True)
        if "pyserini" in args.only:
            run = pyserini_reference(folder / "corpus.jsonl", queries, work)
            from bench.quality import rank_run

            quality = evaluate(qrels, {q: rank_run(hits) for q, hits in run.items()})
            rows["pyserini bm25 (in-process)"] = {"quality": quality,
                                                   "speed": pyserini_speed(work / "pyserini-flat", texts, args.seconds)}
            print(dataset, "pyserini", json.dumps(rows["pyserini bm25 (in-process)"]), flush=True)
        if "langchain" in args.only:
            cmd = [sys.executable, "-m", "bench.langchain_service", "--corpus", str(folder / "corpus.jsonl"),
                   "--port", str(args.port + 1), "--dense-weight", str(args.langchain_dense_weight)]
            w = args.langchain_dense_weight
            peer = f"langchain ensemble bm25 {1 - w:.1f} / dense {w:.1f} (FastAPI)"
            if dataset in indexes:  # the same encoder as this project's index, and its document vectors
                from index_format.versions import read_version_manifest, resolve_version_dir

                encoder = read_version_manifest(resolve_version_dir(Path(indexes[dataset]))).encoder
                cmd += ["--vectors-from", indexes[dataset], "--model", encoder]
            with service_process(cmd, args.port + 1, startup_s=1800) as base:
                rows[peer] = over_http(base, queries, qrels, {}, args.concurrency, args.seconds)
            print(dataset, "langchain", json.dumps(rows[peer]), flush=True)
        if "raysearch" in args.only:
            with served(Path(indexes[dataset]), args.port, ["--router.cache-size", "0"]) as base:
                rows["raysearch hybrid (HTTP)"] = over_http(base, queries, qrels, {"method": "hybrid"},
                                                            args.concurrency, args.seconds)
            print(dataset, "raysearch", json.dumps(rows["raysearch hybrid (HTTP)"]), flush=True)
        write_record(args.out, record)

    print(f"\n{'dataset':10} {'peer':46} {'nDCG@10':>8} {'QPS':>7} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/q':>9}")
    for dataset, rows in record["datasets"].items():
        for name, row in rows.items():
            sp = row["speed"]
            print(f"{dataset:10} {name:46} {row['quality']['nDCG@10']:8.4f} {sp['qps']:7.1f} {sp['p50_ms']:8.1f} "
                  f"{sp['p99_ms']:8.1f} {1000 * sp['server_cpu_s_per_query']:9.1f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
