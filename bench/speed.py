"""Speed over HTTP on loopback: QPS, latency percentiles and CPU per query at rising concurrency,
next to the in-process cost of the same retrieval work without Ray and HTTP.

The service is started here (``python -m deployments --router.cache-size 0``: every request does the full work).
Each concurrency level runs closed-loop clients for ``--seconds`` after a discarded warm-up. CPU per
query is the machine's busy CPU time over the level (``/proc/stat``), minus this load generator's own
CPU time, divided by the requests served. The in-process baseline runs the same pipeline
(``deployments.search.inprocess``) over the same index in this process, one request at a time, and counts
this process's CPU time per query.

    python -m bench.speed --data ../shared/data --dataset scifact --index bench/out/indexes/scifact-4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.common import load_beir, machine, served
from bench.cpu import machine_busy_s, own_cpu_s


def load_level(base: str, texts: list[str], body: dict, concurrency: int, seconds: float) -> dict:
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    lock = threading.Lock()
    counter = iter(range(10**9))

    def client():
        nonlocal errors
        with httpx.Client(timeout=30) as http:
            while time.perf_counter() < stop_at:
                with lock:
                    i = next(counter)
                t = time.perf_counter()
                try:
                    r = http.post(f"{base}/search", json={"query": texts[i % len(texts)]} | body)
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                dt = time.perf_counter() - t
                with lock:
                    if ok:
                        latencies.append(dt)
                    else:
                        errors += 1

    busy0, own0, t0 = machine_busy_s(), own_cpu_s(), time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    server_cpu = (machine_busy_s() - busy0) - (own_cpu_s() - own0)
    lat = np.array(latencies) * 1000
    n = len(latencies)
    return {
        "concurrency": concurrency, "requests": n, "errors": errors, "seconds": wall, "qps": n / wall,
        "p50_ms": float(np.percentile(lat, 50)) if n else None,
        "p95_ms": float(np.percentile(lat, 95)) if n else None,
        "p99_ms": float(np.percentile(lat, 99)) if n else None,
        "server_cpu_s_per_query": server_cpu / n if n else None,
    }


def in_process(index: Path, texts: list[str], body: dict, n: int) -> dict:
    from deployments.config import RouterSettings
    from deployments.edge.schemas import SearchRequest
    from deployments.search.inprocess import inprocess_pipeline

    pipe = inprocess_pipeline({"default": index}, RouterSettings(cache_size=0))

    async def go(k):
        for i in range(k):
            await pipe.search(SearchRequest(query=texts[i % len(texts)], **body))

    asyncio.run(go(20))  # warm-up: JVM, model
    c0, t0 = own_cpu_s(), time.perf_counter()
    asyncio.run(go(n))
    return {"requests": n, "cpu_s_per_query": (own_cpu_s() - c0) / n, "latency_ms": (time.perf_counter() - t0) / n * 1000}


def plot(levels: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    qps = [lv["qps"] for lv in levels]
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        ax.plot(qps, [lv[key] for lv in levels], marker="o", label=key.replace("_ms", ""))
    for lv in levels:
        ax.annotate(f"c={lv['concurrency']}", (lv["qps"], lv["p50_ms"]), fontsize=7)
    ax.set_xlabel("throughput (requests/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--method", default="hybrid")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--warmup", type=int, default=200, help="requests discarded first (JIT of 4 JVMs, caches)")
    parser.add_argument("--port", type=int, default=8500)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    queries, _ = load_beir(args.data / args.dataset)
    texts = list(queries.values())
    body = {"method": args.method, "limit": 10, "include_citations": False}
    out = args.out or Path(f"bench/out/speed_{args.dataset}_{args.method}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": machine(), "dataset": args.dataset, "index": str(args.index), "request": body, "levels": []}

    # The in-process baseline first, on a quiet machine (a stopping Ray cluster would still use CPU).
    record["in_process"] = in_process(args.index, texts, body, n=min(300, len(texts)))
    print(json.dumps(record["in_process"]), flush=True)
    with served(args.index, args.port, ["--router.cache-size", "0"]) as base:
        with httpx.Client(timeout=60) as http:
            for i in range(args.warmup):
                http.post(f"{base}/search", json={"query": texts[-(i + 1)]} | body)
        for c in args.concurrency:
            level = load_level(base, texts, body, c, args.seconds)
            record["levels"].append(level)
            print(json.dumps(level), flush=True)
    best = min((lv for lv in record["levels"] if lv["server_cpu_s_per_query"]), key=lambda lv: lv["server_cpu_s_per_query"])
    record["cpu_ratio_http_vs_in_process"] = best["server_cpu_s_per_query"] / record["in_process"]["cpu_s_per_query"]
    out.write_text(json.dumps(record, indent=2))
    plot(record["levels"], out.with_suffix(".png"),
         f"{args.dataset} {args.method}, {record['machine']['cpu']} x{record['machine']['cores']}, {record['machine']['date']}")
    print(f"\n{args.dataset}, method {args.method}, {record['machine']['date']}, {record['machine']['cpu']}, "
          f"{record['machine']['cores']} cores\n")
    print("| concurrency | requests | errors | QPS | p50 ms | p95 ms | p99 ms | server CPU ms/query |")
    print("|---|---|---|---|---|---|---|---|")
    for lv in record["levels"]:
        print(f"| {lv['concurrency']} | {lv['requests']} | {lv['errors']} | {lv['qps']:.1f} | {lv['p50_ms']:.1f} "
              f"| {lv['p95_ms']:.1f} | {lv['p99_ms']:.1f} | {lv['server_cpu_s_per_query'] * 1000:.1f} |")
    ip = record["in_process"]
    print(f"\nin-process (no Ray, no HTTP): {ip['cpu_s_per_query'] * 1000:.1f} ms CPU/query, "
          f"{ip['latency_ms']:.1f} ms/query; HTTP/in-process CPU ratio {record['cpu_ratio_http_vs_in_process']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
