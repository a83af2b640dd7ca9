"""QPS and p99 as the load ramps, shard groups fixed against autoscaled, on the multi-node harness.

    python -m bench.autoscale_ramp --corpus DATA/scifact/corpus.jsonl --queries DATA/scifact/queries.jsonl \\
        --out bench/results/autoscale_ramp.json

A head and two workers (``bench.local_cluster``: private disks, one machine), each worker offering ``search_node``;
the corpus built into a local S3 server (as ``bench.cluster`` does it); then, for each side in one run (a fresh
cluster each, the corpus built again into it), the same service with the shard groups placed by capacity, one replica a group at the start:

- fixed: ``shards.num_replicas: 1``;
- autoscaled: ``shards.autoscaling: {min_replicas: 1, max_replicas: 2, target_ongoing_requests: 2}``,
  ``max_replicas_per_node: 1``;

and closed-loop search load at 1, 2, 4, 8 and 16 clients in turn (``--seconds`` each, after a warm-up that is
discarded), the replicas of each group counted after each step. On one machine the workers share its cores, so what
this shows is the mechanism (replicas follow the load, and what a replica more costs or gives here), not what a
cluster of separate machines would gain.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench.cluster import Service, build, load, placement, read_queries
from bench.common import machine
from bench.local_cluster import LocalCluster

STEPS = (1, 2, 4, 8, 16)
BASE = {"placement": "deployment", "group_size": 1, "num_cpus": 0.1, "warmup_searches": 200, "lucene_heap": "256m",
        "resources": {"search_node": 0.1}, "max_replicas_per_node": 1}
SIDES = {
    "fixed": {"shards": BASE | {"num_replicas": 1}},
    "autoscaled": {"shards": BASE | {"autoscaling": {"min_replicas": 1, "max_replicas": 2,
                                                     "target_ongoing_requests": 2, "upscale_delay_s": 2,
                                                     "downscale_delay_s": 30}}},
}
ROUTER = {"num_replicas": 1, "num_cpus": 0.1, "resources": {"router": 1}}


def replicas(cluster: LocalCluster) -> dict[str, int]:
    counts: dict[str, int] = {}
    for names in placement(cluster).values():
        for name in names:
            if "shard" in name or "group" in name:
                counts[name] = counts.get(name, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.autoscale_ramp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus.jsonl (BEIR)")
    ap.add_argument("--queries", type=Path, required=True, help="a queries.jsonl (BEIR)")
    ap.add_argument("--encoder", default="hashing:384", help="the build's encoder (default: %(default)s)")
    ap.add_argument("--shards", type=int, default=2, help="shards, one group each (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=15, help="load window of each step (default: %(default)s)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import boto3

    from bench.object_store import use_local_s3

    s3 = use_local_s3()
    record = {"command": "python -m bench.autoscale_ramp", "machine": machine(),
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "steps": STEPS, "sides": {}}
    work = Path(tempfile.mkdtemp(prefix="bench-ramp-"))
    queries = read_queries(args.queries, 300)
    try:
        boto3.client("s3").create_bucket(Bucket="bench")
        boto3.client("s3").upload_file(str(args.corpus), "bench", "corpus/corpus.jsonl")
        resources = {"node_head": {"router": 1}, "node_1": {"search_node": 1}, "node_2": {"search_node": 1}}
        for side, config in SIDES.items():  # a cluster each: Serve's HTTP port is the first app's for the cluster's life
            with LocalCluster(work / side, workers=2, head_cpus=1, cpus=1, resources=resources) as cluster:
                root = f"s3://bench/ramp-{side}"
                record.setdefault("build", {})[side] = build(cluster, "s3://bench/corpus/corpus.jsonl", root,
                                                             args.shards, args.encoder)
                service = Service(cluster, root, config | {"router": ROUTER}, cluster.workdir)
                steps = []
                try:
                    for clients in STEPS:
                        got = load(service, cluster, queries, args.seconds, clients)
                        got["replicas"] = replicas(cluster)
                        steps.append(got)
                        print(side, clients, "clients:", {k: got[k] for k in ("qps", "p50_ms", "p99_ms", "failed",
                                                                               "replicas")}, flush=True)
                finally:
                    service.stop()
                record["sides"][side] = steps
    finally:
        s3.kill()
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
