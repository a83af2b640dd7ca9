"""A build whose workers are killed: the embedding worker mid-stream, then the whole job after a shard.

1. Starts ``python -m index_build`` and, once an embedding worker (a Ray Data actor) is running,
   SIGKILLs that worker's process: Ray Data restarts the actor and retries its batches.
2. Starts the same build again with ``INDEX_BUILD_CRASH_AFTER_SHARDS=1`` (the job exits like a kill
   after its first shard is committed), then reruns it: the rerun must reuse that shard.
3. Checks the published versions: documents in (valid corpus records) = documents out (manifest),
   every chunk in exactly one shard (``python -m index_build.versions verify``), and both versions
   hold the same chunks and vectors as each other.

    python -m bench.build_kill --data ../shared/data --dataset cranfield
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq

from bench.common import machine, write_record
from index_build.build import CRASH_ENV
from index_format.versions import list_versions, read_version_manifest, versions_dir


def embed_workers() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if cmd.startswith("ray::") and "EmbedBatch" in cmd:
            out.append(p)
    return out


def valid_records(corpus: Path) -> int:
    ids = set()
    with open(corpus) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("_id") and (record.get("text") or record.get("title")):
                ids.add(str(record["_id"]))
    return len(ids)


def shard_content(version_dir: Path) -> tuple[list[str], np.ndarray]:
    ids, vectors = [], []
    for shard in sorted((version_dir / "shards").iterdir()):
        ids += pq.read_table(shard / "chunks.parquet", columns=["chunk_id"])["chunk_id"].to_pylist()
        vectors.append(np.load(shard / "embeddings.npy"))
    return ids, np.concatenate(vectors)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.build_kill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--dataset", default="cranfield")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--kill-after-s", type=float, default=20, help="seconds of embedding before the kill")
    ap.add_argument("--work", type=Path, default=Path("bench/out/build_kill"))
    ap.add_argument("--out", type=Path, default=Path("bench/out/build_kill.json"))
    args = ap.parse_args(argv)

    corpus = args.data / args.dataset / "corpus.jsonl"
    shutil.rmtree(args.work, ignore_errors=True)
    base = [sys.executable, "-m", "index_build", "--corpus", str(corpus), "--shards", str(args.shards), "--no-progress"]
    record: dict = {"machine": machine(), "dataset": args.dataset, "shards": args.shards,
                    "valid_records_in": valid_records(corpus)}

    # 1. An embedding worker killed mid-stream.
    t0 = time.perf_counter()
    proc = subprocess.Popen([*base, "--out", str(args.work / "a")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    killed = None
    while proc.poll() is None and killed is None:
        workers = embed_workers()
        if workers:
            time.sleep(args.kill_after_s)
            workers = embed_workers()
            if workers:
                workers[0].kill()
                killed = {"pid": workers[0].pid, "at_s": round(time.perf_counter() - t0, 1)}
                print(f"killed embedding worker {killed}", flush=True)
        time.sleep(0.5)
    output = proc.communicate()[0]
    record["worker_kill"] = {"killed": killed, "exit_code": proc.returncode,
                             "seconds": round(time.perf_counter() - t0, 1), "tail": output.splitlines()[-8:]}
    if proc.returncode != 0:  # the job failed: its rerun must resume
        t1 = time.perf_counter()
        rerun = subprocess.run([*base, "--out", str(args.work / "a")], capture_output=True, text=True)
        record["worker_kill"]["rerun"] = {"exit_code": rerun.returncode, "seconds": round(time.perf_counter() - t1, 1),
                                          "tail": rerun.stdout.splitlines()[-8:]}

    # 2. The whole job killed after its first committed shard, then rerun.
    t1 = time.perf_counter()
    crashed = subprocess.run([*base, "--out", str(args.work / "b")], capture_output=True, text=True,
                             env=dict(os.environ, **{CRASH_ENV: "1"}))
    t2 = time.perf_counter()
    resumed = subprocess.run([*base, "--out", str(args.work / "b")], capture_output=True, text=True)
    record["job_kill"] = {"first_exit_code": crashed.returncode, "first_seconds": round(t2 - t1, 1),
                          "rerun_exit_code": resumed.returncode, "rerun_seconds": round(time.perf_counter() - t2, 1),
                          "rerun_tail": resumed.stdout.splitlines()[-8:]}

    # 3. What was published.
    versions = {}
    for name in ("a", "b"):
        root = args.work / name
        published = list_versions(root)
        if len(published) != 1:
            versions[name] = {"published": published}
            continue
        folder = versions_dir(root) / published[0]
        manifest = read_version_manifest(folder)
        verify = subprocess.run([sys.executable, "-m", "index_build.versions", "verify", str(root)],
                                capture_output=True, text=True)
        versions[name] = {"docs_out": manifest.counts["docs"], "chunks_out": manifest.counts["chunks"],
                          "bad_records": manifest.counts.get("bad_records"), "verify": verify.stdout.strip(),
                          "folder": folder}
    record["versions"] = {k: {x: y for x, y in v.items() if x != "folder"} for k, v in versions.items()}
    same = None
    if all("folder" in v for v in versions.values()):
        (ids_a, vec_a), (ids_b, vec_b) = (shard_content(versions[k]["folder"]) for k in ("a", "b"))
        order_a, order_b = np.argsort(ids_a), np.argsort(ids_b)
        same = sorted(ids_a) == sorted(ids_b) and bool(np.allclose(vec_a[order_a], vec_b[order_b], atol=1e-5))
    record["both_versions_equal"] = same
    record["docs_in_equals_out"] = all(v.get("docs_out") == record["valid_records_in"] for v in versions.values())
    write_record(args.out, record)
    print(json.dumps({k: v for k, v in record.items() if k != "machine"}, indent=2))
    return 0 if record["docs_in_equals_out"] and same else 1


if __name__ == "__main__":
    raise SystemExit(main())
