"""Multi-node on one machine: shards placed by resources on a Ray test cluster, a node removed under load.

Starts Ray's own multi-node test cluster (``ray.cluster_utils.Cluster``: a head and ``--workers``
worker nodes, each its own raylet), gives the worker nodes a ``search_node`` resource and serves the
index with ``shards: {resources: {search_node: 1}}`` and 2 replicas per shard, so shards land only on the
worker nodes and Serve spreads each shard's replicas over them. Then clients search while one worker
node is removed; the answers are counted by status and coverage.

    python -m bench.multinode --index bench/out/indexes/cranfield-4
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.common import machine, write_record

QUERIES = ["boundary layer flow", "heat transfer", "shock wave", "supersonic wing", "pressure distribution",
           "telescope galaxy", "bread oven", "lucene shard"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.multinode", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20, help="load after the node is removed")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--port", type=int, default=8470)
    ap.add_argument("--out", type=Path, default=Path("bench/out/multinode.json"))
    args = ap.parse_args(argv)
    for name, value in (("RAY_AUTH_MODE", "disabled"), ("HF_HUB_OFFLINE", "1"), ("OPENAI_API_KEY", "unused")):
        os.environ.setdefault(name, value)
    import ray
    import ray.util.state
    from ray import serve
    from ray.cluster_utils import Cluster

    from deployments.serve.app import build_app

    t0 = time.perf_counter()
    # The router (the ingress) stays on the head beside the proxy: a node that is removed takes the requests
    # in flight on its replicas with it, and Serve's proxy answers those with 500.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"ingress_node": 4}})
    workers = [cluster.add_node(num_cpus=1, resources={"search_node": 8}) for _ in range(args.workers)]
    ray.init(address=cluster.address, log_to_driver=False)
    base = f"http://127.0.0.1:{args.port}"
    answers: list[tuple[int, float | None]] = []
    errors: list[str] = []
    try:
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": args.port})
        serve.run(build_app({"index": str(args.index),
                             "shards": {"num_replicas": 2, "num_cpus": 0.1, "resources": {"search_node": 1}},
                             "encoder": {"placement": "deployment", "num_replicas": 2, "num_cpus": 0.25},
                             "router": {"resources": {"ingress_node": 1}, "shard_timeout_s": 10, "cache_size": 0}}),
                  name="multinode", route_prefix="/")
        ready_s = time.perf_counter() - t0
        placement: dict[str, list[str]] = {}
        for actor in ray.util.state.list_actors(filters=[("state", "=", "ALIVE")]):
            name = actor.get("name") or ""
            if name.startswith("SERVE_REPLICA::"):
                placement.setdefault(actor["node_id"], []).append(name.split("#")[-2])
        worker_ids = [w.node_id for w in workers]
        stop = threading.Event()

        def client(i: int) -> None:
            with httpx.Client(base_url=base, timeout=60) as c:
                n = i
                while not stop.is_set():
                    try:
                        r = c.post("/search", json={"query": QUERIES[n % len(QUERIES)], "limit": 5})
                        ratio = r.json()["coverage"]["ratio"] if r.status_code == 200 else None
                        answers.append((r.status_code, ratio))
                        if r.status_code != 200:
                            errors.append(r.text[:300])
                    except httpx.HTTPError as e:
                        answers.append((-1, None))
                        errors.append(repr(e))
                    n += args.clients

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(3)
        before = len(answers)
        cluster.remove_node(workers[0])
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()

    statuses = Counter(s for s, _ in answers)
    record = {
        "machine": machine(), "index": str(args.index), "nodes": 1 + args.workers, "ready_s": round(ready_s, 1),
        "replicas_per_node": {(f"worker-{worker_ids.index(n)}" if n in worker_ids else "head"): sorted(v)
                            for n, v in placement.items()},
        "requests_before_removal": before, "requests": len(answers),
        "statuses": {str(k): v for k, v in statuses.items()}, "failed": len(answers) - statuses.get(200, 0),
        "partial": sum(1 for s, r in answers if s == 200 and r is not None and r < 1),
        "errors": errors[:5],
    }
    write_record(args.out, record)
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
