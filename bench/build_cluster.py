"""A build from object storage on one node against a head and two worker nodes with the same Ray CPUs in total.

    python -m bench.build_cluster --corpus DATA/scifact/corpus.jsonl --files 8 --out bench/results/build_cluster.json

The corpus is cut into ``--files`` JSONL objects in a local S3 server (moto's, on loopback) and built into ``s3://``
with ``python -m index_build`` joined to each cluster (``bench.local_cluster``: every worker in its own mount
namespace with a private disk): one node holding ``--cpus`` CPUs, then a head and two worker nodes holding one each
(the head the rest). Recorded for each side: documents/s over the build's own wall time, and from its summary each
stage's seconds, rows and the nodes it ran on. The machine is shared by the nodes: compare only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from bench.cluster import _commit, on_cluster
from bench.local_cluster import LocalCluster


def upload(corpus: Path, files: int, bucket: str) -> str:
    """The corpus cut into ``files`` objects of about equal lines; returns the URL of their prefix."""
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    lines = corpus.read_text().splitlines(keepends=True)
    step = -(-len(lines) // files)
    for i in range(files):
        s3.put_object(Bucket=bucket, Key=f"corpus/part-{i:02d}.jsonl", Body="".join(lines[i * step:(i + 1) * step]))
    return f"s3://{bucket}/corpus/"


def node_names(cluster: LocalCluster) -> dict[str, str]:
    """Ray node id -> the harness's name of the node (node_head, node_1, ...)."""
    code = ("import json, ray; ray.init(logging_level='ERROR', log_to_driver=False)\n"
            "print(json.dumps({n['NodeID']: next((k for k in n['Resources'] if k.startswith('node_')), '?') "
            "for n in ray.nodes() if n['Alive']}))")
    proc = on_cluster(cluster, ["-c", code], timeout=120)
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}


def build(cluster: LocalCluster, corpus_url: str, out: str, shards: int, encoder: str) -> dict:
    path = cluster.workdir / "summary.json"
    t = time.perf_counter()
    proc = on_cluster(cluster, ["-m", "index_build", "--corpus", corpus_url, "--out", out, "--shards", str(shards),
                                "--encoder", encoder, "--no-progress", "--no-reuse", "--summary-json", str(path)])
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    summary = json.loads(path.read_text())
    names = node_names(cluster)
    stages = {name: {"seconds": stage.get("seconds"), "rows": stage.get("rows"),
                     "nodes": sorted(names.get(n, n[:8]) for n in stage.get("nodes") or [])}
              for name, stage in summary["stages"].items()}
    return {"docs": summary["docs"], "chunks": summary["chunks"], "wall_s": round(wall, 1),
            "docs_per_s": round(summary["docs"] / wall, 1), "seconds": summary["seconds"], "stages": stages,
            "shard_nodes": sorted(names.get(n, n[:8]) for n in summary["nodes"].values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.build_cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus.jsonl (BEIR)")
    ap.add_argument("--files", type=int, default=8, help="objects the corpus is cut into (default: %(default)s)")
    ap.add_argument("--encoder", default="hashing:384", help="the build's encoder (default: %(default)s)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--cpus", type=int, default=3, help="Ray CPUs in total on each side (default: %(default)s)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    from bench.object_store import use_local_s3

    s3 = use_local_s3()
    commit = _commit()
    record = {"command": "python -m bench.build_cluster " + " ".join(argv or []), "commit": commit,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "encoder": args.encoder,
              "shards": args.shards, "cpus": args.cpus, "files": args.files}
    work = Path(tempfile.mkdtemp(prefix="bench-build-cluster-"))
    try:
        corpus_url = upload(args.corpus, args.files, "bench")
        sides = {"one node": dict(workers=0, head_cpus=args.cpus),
                 "head + 2 nodes": dict(workers=2, head_cpus=args.cpus - 2, cpus=1)}
        for side, options in sides.items():
            with LocalCluster(work / side.replace(" ", "-").replace("+", "and"), **options) as cluster:
                record[side] = build(cluster, corpus_url, f"s3://bench/{side.split()[0]}", args.shards, args.encoder)
            print(side, json.dumps(record[side]), flush=True)
    finally:
        s3.kill()
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    for side in ("one node", "head + 2 nodes"):
        r = record[side]
        print(f"\n{side}: {r['docs']:,} documents in {r['wall_s']} s = {r['docs_per_s']:,} documents/s")
        for name, stage in r["stages"].items():
            print(f"  {name:<36} {stage['seconds'] or 0:7.1f} s  on {', '.join(stage['nodes'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
