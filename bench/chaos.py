"""Chaos under load: kill a random shard (or reranker) replica every few seconds while clients search.

Starts the service (``python -m deployments``, 2 replicas per shard by default), attaches to its Ray
cluster, runs closed-loop clients for ``--seconds`` and every ``--every`` seconds kills one random
replica of a shard retriever (and of the reranker when one is deployed) with ``ray.kill``; Serve
starts a replacement by itself. Counts answers by status, degraded answers (coverage < 1) and
latency; the target is 0 failed requests.

    python -m bench.chaos --index bench/out/indexes/scifact-4 --data ../shared/data --dataset scifact
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter

import httpx

from bench.common import (
    RERANKER_CPUS,
    ClosedLoop,
    load_beir,
    machine,
    percentile_ms,
    served,
    service_bench_parser,
    write_record,
)


def replicas(ray, pattern: str) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::") and pattern in a["name"]]


def main(argv: list[str] | None = None) -> int:
    ap = service_bench_parser("chaos", __doc__, port=8450)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--every", type=float, default=5)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--shard-num-replicas", type=int, default=2)
    ap.add_argument("--reranker", metavar="MODEL", help="also deploy this cross-encoder (or minilm-l6-arch: its "
                    "architecture with random weights) and kill its replicas too")
    ap.add_argument("--rerank-depth", type=int, default=10)
    args = ap.parse_args(argv)

    queries = list(load_beir(args.data / args.dataset)[0].values())
    extra = ["--router.cache-size", "0", "--shards.num-replicas", str(args.shard_num_replicas), "--shards.num-cpus", "0.1"]
    body: dict = {"limit": 10}
    if args.reranker:
        from bench.reranker_throughput import ARCH, build_minilm_arch

        model = build_minilm_arch(None) if args.reranker == ARCH else args.reranker
        extra += ["--reranker.model", model, "--router.rerank-timeout-s", "10", *RERANKER_CPUS]
        body["rerank_depth"] = args.rerank_depth
    kills: list[dict] = []

    def search(client: httpx.Client, rng: random.Random) -> tuple[int, bool, bool]:
        r = client.post("/search", json={"query": rng.choice(queries), **body})
        ok = r.status_code == 200
        return r.status_code, ok and r.json()["coverage"]["degraded"], ok and not r.json()["reranked"]

    with served(args.index, args.port, extra) as base:
        import ray

        ray.init(address="auto", log_to_driver=False)
        for _ in range(20):  # warm every replica up
            httpx.post(f"{base}/search", json={"query": queries[0], "limit": 10}, timeout=60)
        with ClosedLoop(base, args.clients, search, on_error=lambda e, s: (-1, False, False)) as load:
            rng = random.Random(0)
            t_end = time.time() + args.seconds
            while time.time() < t_end:
                time.sleep(args.every)
                victims = replicas(ray, "-shard-") + replicas(ray, "-group-") + replicas(ray, "#reranker#")
                if victims:
                    victim = rng.choice(victims)
                    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
                    kills.append({"t": round(args.seconds - (t_end - time.time()), 1),
                                  "replica": victim.split("::")[1]})
                    print(f"killed {kills[-1]['replica']} at {kills[-1]['t']} s", flush=True)
        ray.shutdown()

    answers = [(status, degraded, seconds) for _, seconds, (status, degraded, _) in load.answers]
    not_reranked = sum(fallback for *_, (_, _, fallback) in load.answers)
    statuses = Counter(s for s, _, _ in answers)
    latencies = sorted(lat for s, _, lat in answers if s == 200)
    record = {"machine": machine(), "index": str(args.index), "seconds": args.seconds, "every_s": args.every,
              "clients": args.clients, "shard_num_replicas": args.shard_num_replicas, "kills": kills,
              "requests": len(answers), "statuses": {str(k): v for k, v in statuses.items()},
              "failed": len(answers) - statuses.get(200, 0), "degraded": sum(d for _, d, _ in answers),
              "reranker": args.reranker, "rerank_depth": args.rerank_depth if args.reranker else None,
              "not_reranked": not_reranked if args.reranker else None,
              "p50_ms": percentile_ms(latencies, 0.5), "p99_ms": percentile_ms(latencies, 0.99)}
    write_record(args.out, record)
    print(json.dumps({k: v for k, v in record.items() if k != "kills"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
