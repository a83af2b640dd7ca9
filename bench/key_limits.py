"""One key at ten times its limit beside a well-behaved key: what the well-behaved key gets, with and without
per-key limits (``security.key_limit``).

Serves ``--index`` twice (``python -m deployments`` with two API keys, ``--router.cache-size 0``): once with no
per-key limits (only ``security.max_inflight``), once with ``key_limit`` (``--rate`` requests a second, a burst of
``--rate``, ``--key-inflight`` in flight). Each time, for ``--seconds``, a noisy key sends ``--factor`` times
``--rate`` and a well-behaved key sends half of ``--rate``, both open loop (arrivals do not wait for answers). The
figures: the well-behaved key's goodput (answered / sent) and p50/p99 of its answers, and what the noisy key got
(statuses). The target: with limits the noisy key's excess gets 429s and the well-behaved key is served as if alone.

    python -m bench.key_limits --index bench/out/indexes/scifact-4 --rate 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.common import machine, percentile_ms, served, write_record
from deployments.edge.guard import new_key

QUERIES = ["telescope galaxy", "bread oven butter", "boat wind anchor", "piano chord", "protein expression cells",
           "gene mutation cancer", "vaccine immune response", "climate ocean temperature"]


async def send(base: str, key: str, rate: float, seconds: float) -> list[tuple[int, float]]:
    """(status, latency s) of requests sent at ``rate`` per second for ``seconds`` (-1: no HTTP answer)."""
    out: list[tuple[int, float]] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits, headers={"x-api-key": key}) as client:
        async def one(i: int) -> None:
            t = time.perf_counter()
            try:
                r = await client.post("/search", json={"query": QUERIES[i % len(QUERIES)], "limit": 10})
                out.append((r.status_code, time.perf_counter() - t))
            except httpx.HTTPError:
                out.append((-1, time.perf_counter() - t))

        start, tasks = time.perf_counter(), []
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return out


def summary(answers: list[tuple[int, float]], seconds: float) -> dict:
    ok = sorted(lat for status, lat in answers if status == 200)
    return {"sent": len(answers), "statuses": {str(k): v for k, v in sorted(Counter(s for s, _ in answers).items())},
            "goodput": round(len(ok) / len(answers), 3) if answers else None,
            "answered_qps": round(len(ok) / seconds, 2),
            "p50_ms": percentile_ms(ok, 0.5), "p99_ms": percentile_ms(ok, 0.99)}


def run(args, limited: bool) -> dict:
    (noisy, noisy_digest), (calm, calm_digest) = new_key(), new_key()
    serve_args = ["--router.cache-size", "0", "--security.max-inflight", str(args.max_inflight),
                  "--security.api-key-digests", noisy_digest, calm_digest]
    if limited:
        serve_args += ["--security.key-limit", json.dumps({"requests_per_s": args.rate, "burst": int(args.rate),
                                                           "max_inflight": args.key_inflight})]
    with served(args.index, args.port, serve_args) as base:
        for q in QUERIES:  # warm-up, within either key's limit
            httpx.post(f"{base}/search", json={"query": q, "limit": 10}, headers={"x-api-key": calm}, timeout=60)
        time.sleep(1.0)  # the warm-up leaves the window before the measured load starts

        async def both():
            return await asyncio.gather(send(base, noisy, args.factor * args.rate, args.seconds),
                                        send(base, calm, args.rate / 2, args.seconds))

        noisy_answers, calm_answers = asyncio.run(both())
    return {"key_limit": limited, "noisy": summary(noisy_answers, args.seconds),
            "well_behaved": summary(calm_answers, args.seconds)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.key_limits", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="index root or version folder to serve")
    ap.add_argument("--rate", type=int, default=10, help="each key's limit, requests a second (and its burst)")
    ap.add_argument("--factor", type=float, default=10.0, help="the noisy key sends this many times --rate")
    ap.add_argument("--key-inflight", type=int, default=4, help="each key's max_inflight under limits")
    ap.add_argument("--max-inflight", type=int, default=32, help="the router replica's max_inflight")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--port", type=int, default=8470)
    ap.add_argument("--out", type=Path, default=Path("bench/out/key_limits.json"))
    args = ap.parse_args(argv)
    runs = [run(args, limited=False), run(args, limited=True)]
    record = {"machine": machine(), "index": str(args.index), "rate": args.rate, "factor": args.factor,
              "key_inflight": args.key_inflight, "max_inflight": args.max_inflight, "seconds": args.seconds,
              "runs": runs}
    write_record(args.out, record)
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
