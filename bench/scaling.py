"""Throughput against the number of shard and reranker replicas, on the cores this machine has.

For each configuration the service is started afresh (``--router.cache-size 0``) and measured with closed-loop
clients over HTTP (QPS, p50 / p99, server CPU per query), hybrid search with ``limit: 10``:

- ``shards xR``: every shard deployment with R replicas, no reranker;
- ``rerank xN``: 1 replica per shard plus N cross-encoder replicas rescoring ``--rerank-depth`` candidates
  (``minilm-l6-arch``: ms-marco-MiniLM-L-6-v2's architecture with random weights, the real model's cost).

The per-replica figures feed the cluster model in bench/README.md.

    python -m bench.scaling --index bench/out/indexes/scifact-4 --data ../shared/data --dataset scifact
"""

from __future__ import annotations

import json

from bench.common import RERANKER_CPUS, load_beir, machine, served, service_bench_parser, write_record
from bench.speed import load_level


def main(argv: list[str] | None = None) -> int:
    ap = service_bench_parser("scaling", __doc__, port=8480)
    ap.add_argument("--shard-num-replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reranker-num-replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reranker", default="minilm-l6-arch")
    ap.add_argument("--rerank-depth", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args(argv)

    texts = list(load_beir(args.data / args.dataset)[0].values())
    configs = [(f"shards x{r}", ["--shards.num-replicas", str(r), "--shards.num-cpus", "0.1"], {})
               for r in args.shard_num_replicas if r > 0]
    if args.reranker_num_replicas:
        from bench.reranker_throughput import ARCH, build_minilm_arch

        model = build_minilm_arch(None) if args.reranker == ARCH else args.reranker
        configs += [(f"rerank x{n} (depth {args.rerank_depth})",
                     ["--reranker.model", model, "--reranker.autoscaling.min-replicas", str(n),
                      "--reranker.autoscaling.max-replicas", str(n), "--router.rerank-timeout-s", "60",
                      "--shards.num-cpus", "0.1", *RERANKER_CPUS],
                     {"rerank_depth": args.rerank_depth}) for n in args.reranker_num_replicas]
    rows = []
    for name, extra, body in configs:
        with served(args.index, args.port, ["--router.cache-size", "0", *extra]) as base:
            load_level(base, texts, {"limit": 10} | body, args.concurrency, 5)  # warm-up
            row = load_level(base, texts, {"limit": 10} | body, args.concurrency, args.seconds)
        rows.append({"config": name} | row)
        print(json.dumps(rows[-1]), flush=True)
    write_record(args.out, {"machine": machine(), "index": str(args.index), "concurrency": args.concurrency,
                            "rows": rows})
    print(f"\n{'config':26} {'QPS':>7} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/q':>9} {'errors':>6}")
    for r in rows:
        print(f"{r['config']:26} {r['qps']:7.1f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} "
              f"{1000 * r['server_cpu_s_per_query']:9.1f} {r['errors']:6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
