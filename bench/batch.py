"""A batch of 64 searches against the same 64 searches sent one by one: server CPU per query, in one run.

``python -m deployments --index INDEX --router.cache-size 0`` is started once; each way is warmed, then run for
``--seconds`` by ``--clients`` closed-loop clients (a batch is one request of 64 searches), alternating
``--rounds`` times so drift on a shared machine falls on both. Server CPU is the machine's busy CPU minus
this process's, per search answered.

    python -m bench.batch --data ../shared/data/scifact --index bench/out/indexes/scifact-h384 \\
        --out bench/results/batch_scifact.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.common import load_beir, machine, service_process, write_record
from bench.cpu import machine_busy_s, own_cpu_s
from bench.loadgen import closed_loop

BATCH = 64


def measure(base: str, path: str, bodies: list[dict], per_request: int, clients: int, seconds: float) -> dict:
    closed_loop(base, path, bodies[:8], clients, 3.0)  # warm this way
    busy0, own0, t0 = machine_busy_s(), own_cpu_s(), time.perf_counter()
    out = closed_loop(base, path, bodies, clients, seconds)
    wall = time.perf_counter() - t0
    searches = out.answered * per_request
    server = (machine_busy_s() - busy0) - (own_cpu_s() - own0)
    return {"requests": out.answered, "searches": searches, "statuses": {str(k): v for k, v in out.statuses.items()},
            "seconds": round(wall, 2), "searches_per_s": searches / wall,
            "server_cpu_ms_per_search": 1000 * server / searches if searches else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder (its test queries are sent)")
    ap.add_argument("--index", type=Path, required=True, help="an index root to serve")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--port", type=int, default=8670)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    queries, _ = load_beir(args.data)
    singles = [{"query": q, "limit": args.limit} for q in queries.values()]
    batches = [{"searches": singles[i:i + BATCH]} for i in range(0, len(singles) - BATCH + 1, BATCH)]
    cmd = [sys.executable, "-m", "deployments", "--index", str(args.index), "--port", str(args.port),
           "--router.cache-size", "0", "--metrics-port", "0", "--security.max-inflight", "256"]
    runs = []
    with service_process(cmd, args.port) as base:
        for r in range(args.rounds):
            single = measure(base, "/search", singles, 1, args.clients * 8, args.seconds)
            batch = measure(base, "/search/batch", batches, BATCH, args.clients, args.seconds)
            runs.append({"round": r, "single": single, "batch": batch})
            print(f"round {r}: one by one {single['server_cpu_ms_per_search']:.2f} ms CPU a search "
                  f"({single['searches_per_s']:.0f}/s); batches of {BATCH} {batch['server_cpu_ms_per_search']:.2f} "
                  f"({batch['searches_per_s']:.0f}/s)", flush=True)
    record = {"machine": machine(), "index": str(args.index), "batch": BATCH, "limit": args.limit,
              "clients_single": args.clients * 8, "clients_batch": args.clients, "runs": runs}
    if args.out:
        write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
