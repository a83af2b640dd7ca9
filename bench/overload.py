"""Overload: requests arriving at several times what the service can answer.

Starts the service (``python -m deployments --router.cache-size 0 --security.max-inflight N``), measures its capacity with
``--capacity-clients`` closed-loop clients (QPS and p99 at capacity), then sends an open-loop stream at
``--factor`` times that rate (arrivals do not wait for answers, as real traffic does not) and counts
answers by status, latency of the answered ones, goodput (answered QPS over capacity), and the resident
memory of the service's processes (the service and every Ray process) sampled each second. The target:
the excess is shed with 503 + Retry-After, goodput stays near capacity, memory stays bounded, and the
service still answers afterwards. Both loads come from ``bench.loadgen`` (raw HTTP/1.1 on asyncio): at
hundreds of arrivals a second an HTTP library's own CPU would take a core from the service.

    python -m bench.overload --index bench/out/indexes/scifact-4 --data ../shared/data --dataset scifact
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import httpx
import psutil

from bench.common import (
    load_beir,
    machine,
    percentile_ms,
    served,
    service_bench_parser,
    write_record,
)
from bench.cpu import machine_busy_s, own_cpu_s
from bench.loadgen import closed_loop, open_loop


def service_rss_by_process() -> dict[str, float]:
    """Resident MB of the service's processes (the service and every Ray process), by process title."""
    out: dict[str, float] = {}
    for p in psutil.process_iter(["cmdline", "memory_info"]):
        cmd = " ".join(p.info["cmdline"] or [])
        ours = "deployments" in cmd or "ray" in cmd.lower() or "gcs_server" in cmd
        if ours and p.info["memory_info"] is not None:
            # "ray::ServeController.listen_for_change": the part after the dot is the method now running.
            title = f"{cmd.split(' ')[0].rsplit('/', 1)[-1].split('.')[0][:60]} [{p.pid}]"
            out[title] = round(p.info["memory_info"].rss / 2**20, 1)
    return out


def service_rss_mb() -> float:
    return sum(service_rss_by_process().values())


def capacity(base: str, queries: list[str], seconds: float, clients: int) -> tuple[float, float]:
    """(QPS, p99 ms) of closed-loop clients: what the service answers when kept busy."""
    bodies = [{"query": q, "limit": 10} for q in queries]
    closed_loop(base, "/search", bodies, clients, 5)  # warm-up
    out = closed_loop(base, "/search", bodies, clients, seconds)
    return out.answered / seconds, percentile_ms(sorted(out.latencies_s), 0.99)


def main(argv: list[str] | None = None) -> int:
    ap = service_bench_parser("overload", __doc__, port=8460)
    ap.add_argument("--factor", type=float, default=4.0)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--max-inflight", type=int, default=8)
    ap.add_argument("--capacity-clients", type=int, default=8)
    ap.add_argument("--serve-args", default="", help="extra arguments for python -m deployments")
    args = ap.parse_args(argv)
    queries = list(load_beir(args.data / args.dataset)[0].values())

    with served(args.index, args.port, ["--router.cache-size", "0", "--security.max-inflight", str(args.max_inflight),
                                        *args.serve_args.split()]) as base:
        for _ in range(20):
            httpx.post(f"{base}/search", json={"query": queries[0], "limit": 10}, timeout=60)
        cap, p99_at_capacity = capacity(base, queries, 15, args.capacity_clients)
        by_process_before = service_rss_by_process()
        rss = [service_rss_mb()]
        sampling = threading.Event()

        series: list[dict[str, float]] = [by_process_before]

        def sample() -> None:
            while not sampling.wait(1.0):
                rss.append(service_rss_mb())
                if len(rss) % 10 == 1:
                    series.append(service_rss_by_process())

        sampler = threading.Thread(target=sample)
        sampler.start()
        own0, busy0 = own_cpu_s(), machine_busy_s()
        arrivals = open_loop(base, "/search", [{"query": q, "limit": 10} for q in queries], args.factor * cap,
                             args.seconds)
        client_cores, machine_cores = (own_cpu_s() - own0) / args.seconds, (machine_busy_s() - busy0) / args.seconds
        results = [(a.status, a.latency_s, a.retry_after) for a in arrivals]
        sampling.set()
        sampler.join()
        by_process_after = service_rss_by_process()
        after = httpx.post(f"{base}/search", json={"query": queries[1], "limit": 10}, timeout=60).status_code
        health = httpx.get(f"{base}/health", timeout=30).status_code

    statuses = Counter(s for s, _, _ in results)
    ok = sorted(lat for s, lat, _ in results if s == 200)
    record = {
        "machine": machine(), "index": str(args.index), "max_inflight": args.max_inflight, "serve_args": args.serve_args,
        "capacity_qps": round(cap, 2), "capacity_clients": args.capacity_clients,
        "p99_ms_at_capacity": p99_at_capacity, "offered_qps": round(args.factor * cap, 2), "seconds": args.seconds,
        "requests": len(results), "statuses": {str(k): v for k, v in statuses.items()},
        "answered_qps": round(statuses.get(200, 0) / args.seconds, 2),
        "goodput_vs_capacity": round(statuses.get(200, 0) / args.seconds / cap, 3),
        # On 2 cores the load generator competes with the service: how much of the machine it took.
        "load_generator_cores": round(client_cores, 3), "machine_busy_cores": round(machine_cores, 3),
        "shed_with_retry_after": sum(1 for s, _, ra in results if s == 503 and ra),
        "p50_ms_answered": percentile_ms(ok, 0.5), "p99_ms_answered": percentile_ms(ok, 0.99),
        "p99_answered_vs_at_capacity": round(percentile_ms(ok, 0.99) / p99_at_capacity, 2) if ok else None,
        "rss_mb_before": round(rss[0]), "rss_mb_max": round(max(rss)), "rss_mb_end": round(rss[-1]),
        # Bounded means flat once warm: the second half of the run should add (almost) nothing.
        "rss_mb_mid": round(rss[len(rss) // 2]), "rss_mb_every_10s": [round(x) for x in rss[::10]],
        # The processes that grew most, each sampled every 10 s: does each one level off?
        "rss_mb_every_10s_by_process": {k: [snap.get(k) for snap in series] for k in sorted(
            by_process_after, key=lambda k: by_process_before.get(k, 0) - by_process_after[k])[:8]},
        "rss_mb_growth_by_process": dict(sorted(
            ((k, round(v - by_process_before.get(k, 0), 1)) for k, v in by_process_after.items()),
            key=lambda kv: -kv[1])[:8]),
        "after_overload_search_status": after, "after_overload_health_status": health,
    }
    write_record(args.out, record)
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
