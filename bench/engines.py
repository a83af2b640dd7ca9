"""This project side by side with the engines a RAG team would pick instead, in one run on one machine.

Every engine indexes the same documents of one BEIR dataset (title + text) and answers the same test queries over
HTTP, each behind a small FastAPI app built as its documentation shows (``bench/engine_service.py``):
- **LanceDB**: its native full-text index (BM25, English stemming) and vectors, ``query_type="hybrid"`` fused by its
  default reranker (RRF).
- **Milvus Lite**: a BM25 function on the text (english analyzer) and a FLAT dense field, ``hybrid_search`` with
  ``RRFRanker``.
- **Chroma**: dense only (its local client refuses a sparse index).
- **bm25s** and **Pyserini** (Lucene, k1 0.9, b 0.4): keyword only.
- **This project**: ``python -m deployments`` over its own build of the dataset with every default (MiniLM, chunks
  of 128 words, hybrid), the answer cache off.

The engines' vectors are MiniLM's (all-MiniLM-L6-v2) for whole documents, computed once with sentence-transformers
on torch (``embed``, timed apart) and handed to each engine. An engine with a dense leg is served twice: its query
embedded with sentence-transformers on torch (what its documentation does) and with this project's ONNX query
encoder (the vector handed to the engine), so the engine is also measured with the project's query cost.

For each: nDCG@10 over the test queries (at ``limit`` 100, each document at its best chunk), then closed-loop
load at ``--clients`` for ``limit`` 10 and 100 (``bench.serving.level``: QPS, p50 / p99, server CPU a query = the
machine's busy CPU minus this process's), the peak RSS of the service's processes (each one's high-water mark,
summed), the index's build seconds and its bytes on disk.

The engines are not in this project's environment: ``make bench-engines`` makes their own (``.venv-engines``,
bench/requirements-engines.txt) and runs

    python -m bench.engines --data ../shared/data/scifact --work /tmp/engines --out bench/results/engines.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import load_beir, machine, proc_status, started_service, write_record
from bench.engine_service import DENSE, folder_bytes
from bench.serving import level, partial_body, quality

PEERS = ("lancedb", "milvus", "chroma", "bm25s", "pyserini")
LABELS = {"lancedb": "LanceDB hybrid", "milvus": "Milvus Lite hybrid", "chroma": "Chroma dense",
          "bm25s": "bm25s BM25", "pyserini": "Pyserini BM25 (Lucene)", "raysearch": "raysearch hybrid"}


def tree_peak_rss_mb(pid: int) -> float:
    """The high-water marks of a process and all its descendants, summed (MB): a bound on the service's peak."""
    import psutil

    root = psutil.Process(pid)
    return sum(proc_status(p.pid).get("VmHWM", 0) for p in [root, *root.children(recursive=True)]) / 1024


def run_step(cmd: list[str], what: str) -> dict:
    """A build step in a child process; its last line of output is its JSON record."""
    print(f"{what}: {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build_raysearch(corpus_folder: Path, root: Path) -> dict:
    """This project's build of the dataset with every default; seconds from the start of the command."""
    summary = root.parent / f"{root.name}-build.json"
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "index_build", "--corpus", str(corpus_folder), "--out", str(root), "--no-progress",
           "--summary-json", str(summary)]
    print(f"raysearch build: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    record = {"seconds": time.perf_counter() - t, "summary": json.loads(summary.read_text())}
    (root.parent / f"{root.name}-bench.json").write_text(json.dumps(record))
    return record


def measure(cmd: list[str], port: int, queries, qrels, body: dict, clients: int, seconds: float,
            limits: list[int], env: dict[str, str] | None = None) -> dict:
    texts = list(queries.values())
    out: dict = {}
    with started_service(cmd, port, startup_s=900, env=env) as service:
        level(service.base, texts, body | {"limit": 10}, 2, 10)  # warm: JIT, caches of the engine's files
        out["quality"] = quality(service.base, queries, qrels, body | {"limit": 100})
        for limit in limits:
            out[f"limit_{limit}"] = level(service.base, texts, body | {"limit": limit}, clients, seconds,
                                          partial_body)
        out["peak_rss_mb"] = tree_peak_rss_mb(service.process.pid)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engines", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder (corpus.jsonl, queries, qrels)")
    ap.add_argument("--work", type=Path, required=True,
                    help="where the vectors and every engine's index are kept (reused by a later run)")
    ap.add_argument("--index", type=Path, help="this project's index root to serve, instead of building one in WORK")
    ap.add_argument("--engines-python", type=Path, default=Path(".venv-engines/bin/python"),
                    help="the Python of the engines' environment (make bench-engines makes it)")
    ap.add_argument("--only", nargs="+", choices=[*PEERS, "raysearch"], default=[*PEERS, "raysearch"])
    ap.add_argument("--query-encoders", nargs="+", choices=["torch", "onnx"], default=["torch", "onnx"],
                    help="how the engines with a dense leg embed a query (each one measured)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20, help="each load level")
    ap.add_argument("--limits", type=int, nargs="+", default=[10, 100], help="the page sizes loaded (10 among them)")
    ap.add_argument("--serve-args", default="", help="extra arguments for this project's python -m deployments")
    ap.add_argument("--port", type=int, default=8700)
    ap.add_argument("--out", type=Path, default=Path("bench/out/engines.json"))
    args = ap.parse_args(argv)
    if 10 not in args.limits:
        ap.error("--limits must include 10: the table and the QPS ratios are at limit 10")

    from index_format.encoders import export_onnx, resolve_model_path

    corpus = args.data / "corpus.jsonl"
    queries, qrels = load_beir(args.data)
    model = resolve_model_path("all-MiniLM-L6-v2")
    export_onnx(Path(model))  # the ONNX query encoder the engines' environment loads from the same cache
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    engines_python = str(args.engines_python.absolute()) if args.engines_python.exists() else None
    if engines_python is None and set(args.only) & (set(PEERS) - {"pyserini"}):
        raise SystemExit(f"{args.engines_python} not found: make bench-engines makes the engines' environment")
    repo = str(Path(__file__).resolve().parents[1])
    env = {"PYTHONPATH": repo, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    record: dict = {"machine": machine(), "dataset": args.data.name, "queries": len(queries), "clients": args.clients,
                    "seconds": args.seconds, "engines": {}}

    vectors = work / "vectors.npy"
    if set(args.only) & DENSE:
        if not vectors.exists():
            record["embedding"] = run_step([engines_python, "-m", "bench.engine_service", "embed", "--corpus",
                                            str(corpus), "--model", model, "--out", str(vectors)],
                                           "embedding the documents (sentence-transformers, torch)")
            (work / "embedding.json").write_text(json.dumps(record["embedding"]))
        else:
            record["embedding"] = json.loads((work / "embedding.json").read_text())
        print("embedding", json.dumps(record["embedding"]), flush=True)

    port = args.port
    for engine in args.only:
        python = sys.executable if engine in ("pyserini", "raysearch") else engines_python
        if engine == "raysearch":
            root = args.index or work / "raysearch"
            bench_json = root.parent / f"{root.name}-bench.json"
            if args.index is None and not root.exists():
                built = build_raysearch(args.data, root)
            else:
                built = json.loads(bench_json.read_text()) if bench_json.exists() else {"seconds": None}
            from index_format.versions import resolve_version_dir

            build = {"seconds": built["seconds"], "bytes": folder_bytes(resolve_version_dir(root))}
            variants = {"onnx": [sys.executable, "-m", "deployments", "--index", str(root), "--router.cache-size", "0",
                                 *args.serve_args.split()]}
            body = {"method": "hybrid", "include_citations": False}
        else:
            folder = work / engine
            if not (folder / "build.json").exists():
                cmd = [python, "-m", "bench.engine_service", "build", "--engine", engine, "--corpus", str(corpus),
                       "--work", str(folder)]
                if engine in DENSE:
                    cmd += ["--vectors", str(vectors)]
                run_step(cmd, f"{engine} build")
            build = json.loads((folder / "build.json").read_text())
            serve = [python, "-m", "bench.engine_service", "serve", "--engine", engine, "--work", str(folder)]
            if engine in DENSE:
                variants = {e: [*serve, "--model", model, "--query-encoder", e] for e in args.query_encoders}
            else:
                variants = {"-": serve}
            body = {}
        for encoder, cmd in variants.items():
            name = LABELS[engine] + ("" if encoder == "-" else f", query on {encoder}")
            print(f"{name}: serving", flush=True)
            row = measure([*cmd, "--port", str(port)], port, queries, qrels, body, args.clients, args.seconds, args.limits, env)
            row |= {"engine": engine, "query_encoder": encoder, "build": build}
            record["engines"][name] = row
            print(name, json.dumps(row), flush=True)
            write_record(args.out, record)
            port += 1

    write_record(args.out, record)
    print(table(record))
    return 0


def table(record: dict) -> str:
    """The engines table (markdown), with each engine's QPS against this project's at limit 10."""
    rows = record["engines"]
    ours = next((r for r in rows.values() if r["engine"] == "raysearch"), None)
    lines = [f"{record['dataset']}, {record['queries']} queries, {record['clients']} clients, "
             f"{record['machine']['date']}, {record['machine']['cpu']} x{record['machine']['cores']}, "
             f"commit {record['machine']['git_sha']}", "",
             "| engine | nDCG@10 | QPS limit 10 | QPS limit 100 | p50 / p99 ms (limit 10) | server CPU ms a query "
             "(limit 10) | peak RSS MB | build s | index MB | ours / its QPS (limit 10) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        l10, l100 = r.get("limit_10"), r.get("limit_100")
        ratio = ours["limit_10"]["qps"] / l10["qps"] if ours and l10 and r is not ours else None
        seconds = r["build"]["seconds"]
        lines.append(
            f"| {name} | {r['quality']['nDCG@10']:.4f} | {l10['qps']:.1f} | {l100['qps'] if l100 else 0:.1f} "
            f"| {l10['p50_ms']:.1f} / {l10['p99_ms']:.1f} | {l10['server_cpu_ms_per_query']:.1f} "
            f"| {r['peak_rss_mb']:,.0f} | {'-' if seconds is None else f'{seconds:.1f}'} "
            f"| {r['build']['bytes'] / 2**20:,.1f} | {'-' if ratio is None else f'{ratio:.2f}x'} |")
    if "embedding" in record:
        lines.append(f"\nThe engines' document vectors: {record['embedding']['documents']:,} documents embedded "
                     f"once in {record['embedding']['seconds']:.1f} s (sentence-transformers, torch), not in their "
                     f"build seconds.")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
