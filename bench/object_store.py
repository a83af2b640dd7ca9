"""An index root in object storage against one in a folder: replica starts, downloads, and a fold's upload.

    python -m bench.object_store --index scifact=bench/out/indexes/scifact --index 205k=bench/out/indexes/s205k \\
        --local-s3 --out bench/results/object_store.json

For each index (a folder root, its active version): publish it to ``s3://bench-<name>/idx`` (the upload's MB/s),
then start a shard replica's core (``ShardHost`` over every shard of the version: files checked against their
checksums, FAISS and Lucene opened), each start in a fresh process so each pays the same JVM and import costs:
- from the folder (what a shared filesystem gives),
- from ``s3://`` with an empty node cache (download, then open: the cold start on a new node),
- from ``s3://`` again with that cache (the warm restart: nothing downloaded).
Then one fold through the store: a change log of ``--fold-docs`` new documents, all of one shard, folded into a new
version; its upload bytes against the bytes of the shard it touched and of the whole version.

``--local-s3`` starts moto's S3-compatible server in its own process on loopback; without it, the AWS variables
name the endpoint (the bucket must exist). Numbers from a local moto server measure this code and the server's own
speed (a Python server), not a cloud store's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine, write_record

START = r"""
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from deployments.shard.host import ShardHost
from index_format.versions import read_version_manifest
root, version, folder = sys.argv[1], sys.argv[2], sys.argv[3]
t1 = time.perf_counter()
got = {}
if root.startswith("s3://"):
    from index_format.object_root import ObjectRoot
    m = ObjectRoot(root).manifest(version)
    path, got = ObjectRoot(root).fetch(version, list(m.shards))
else:
    path = Path(folder)
t2 = time.perf_counter()
m = read_version_manifest(path)
host = ShardHost(None, str(path), list(m.shards), {"encoder": m.encoder, "dimension": m.dimension})
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "fetch_s": t2 - t1, "open_s": t3 - t2, "start_s": t3 - t0,
                  "bytes_downloaded": got.get("bytes_downloaded", 0), "bytes": got.get("bytes", 0)}))
"""


def local_s3() -> tuple[subprocess.Popen, str]:
    """moto's server in a process of its own, on a free loopback port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(100):
        try:
            httpx.get(endpoint, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    return proc, endpoint


def use_local_s3() -> subprocess.Popen:
    """``local_s3``, with this process's environment pointed at it (endpoint and credentials, as a user would set
    them), for the commands it starts."""
    proc, endpoint = local_s3()
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_REGION="us-east-1")
    return proc


def start(root: str, version: str, folder: Path, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", START, root, version, str(folder)], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def one_index(name: str, folder_root: Path, repeats: int, fold_docs: int, scratch: Path) -> dict:
    import boto3

    from index_format.object_root import CACHE_DIR_ENV, STATE_ENV, ObjectRoot
    from index_format.versions import active_version, read_version_manifest, versions_dir

    version = active_version(folder_root)
    local = versions_dir(folder_root) / version
    manifest = read_version_manifest(local)
    bucket = f"bench-{name.lower()}-{os.getpid()}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/idx"
    root = ObjectRoot(url, cache_dir=scratch / "publisher")
    sent = root.upload_version(local, version)
    root.activate(version, by="bench")
    record: dict = {"index": str(folder_root), "version": version, "chunks": manifest.counts["chunks"],
                    "shards": manifest.num_shards, "bytes": sent["bytes"],
                    "publish": {**sent, "mb_per_s": sent["bytes_uploaded"] / sent["seconds"] / 1e6}}
    env = dict(os.environ)
    runs: dict[str, list[dict]] = {"folder": [], "s3_cold": [], "s3_warm": []}
    for i in range(repeats):
        runs["folder"].append(start(str(folder_root), version, local, env))
        cache = scratch / f"cache-{i}"
        shutil.rmtree(cache, ignore_errors=True)
        cold = env | {CACHE_DIR_ENV: str(cache)}
        runs["s3_cold"].append(start(url, version, local, cold))
        runs["s3_warm"].append(start(url, version, local, cold))
    for r in runs["s3_cold"]:
        r["download_mb_per_s"] = r["bytes_downloaded"] / r["fetch_s"] / 1e6
    record["starts"] = runs
    record["fold"] = fold_through_store(url, manifest, fold_docs, scratch, {STATE_ENV: str(scratch / "state"),
                                                                            CACHE_DIR_ENV: str(scratch / "fold-cache")})
    return record


def fold_through_store(url: str, manifest, docs: int, scratch: Path, env: dict) -> dict:
    """Fold ``docs`` new documents that all land in shard 0; what the fold uploaded against that shard's bytes."""
    from index_build.fold import fold
    from index_format.collection_log import open_change_log
    from index_format.object_root import ObjectRoot
    from index_format.sharding import shard_of

    os.environ.update(env)
    ids, i = [], 0
    while len(ids) < docs:
        if shard_of(f"bench-fold-{i}", manifest.num_shards) == 0:
            ids.append(f"bench-fold-{i}")
        i += 1
    log = open_change_log(url)
    log.append([{"id": d, "title": "", "text": f"a folded document {d} about quokkas and marmots", "metadata": {}}
                for d in ids], [])
    summary = fold(url)
    files = ObjectRoot(url).files(summary.version)
    touched = sum(f["size"] for rel, f in files.items() if rel.startswith(f"shards/{manifest.shards[0]}/"))
    return {"documents": docs, "version": summary.version, "shards_changed": summary.shards_changed,
            "bytes_uploaded": summary.upload["bytes_uploaded"], "touched_shard_bytes": touched,
            "version_bytes": summary.upload["bytes"], "seconds": summary.seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.object_store", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", action="append", required=True, metavar="NAME=ROOT",
                    help="a folder index root to measure (repeatable)")
    ap.add_argument("--local-s3", action="store_true", help="start moto's S3 server on loopback for the run")
    ap.add_argument("--repeats", type=int, default=2, help="starts of each kind, per index")
    ap.add_argument("--fold-docs", type=int, default=100)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    server = None
    if args.local_s3:
        server, endpoint = local_s3()
        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                          AWS_REGION="us-east-1")
    record = {"machine": machine(), "endpoint": os.environ.get("AWS_ENDPOINT_URL"),
              "server": "moto (local, Python)" if args.local_s3 else "as named", "indexes": {}}
    try:
        for spec in args.index:
            name, _, folder = spec.partition("=")
            with tempfile.TemporaryDirectory(prefix=f"bench-s3-{name}-") as scratch:
                record["indexes"][name] = one_index(name, Path(folder), args.repeats, args.fold_docs, Path(scratch))
            write_record(args.out, record)
            print(json.dumps(record["indexes"][name], indent=1), flush=True)
    finally:
        if server is not None:
            server.terminate()
        from index_build.build import shutdown_ray

        shutdown_ray()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
