"""Build throughput into object storage against into a local folder: the same corpus, the same options, one run.

For each shard count, three builds of the corpus, each into a fresh root: into a local folder; into
``s3://BUCKET/<run>/<shards>`` (staged on this node, each shard uploaded by its task, the rest published by the
driver); and the same corpus again into that root (what a rebuild of an unchanged corpus uploads: the manifests).
Records documents/s and chunks/s of each, its stages, and what it uploaded (bytes, and seconds: the driver's publish,
the shard tasks' uploads summed). With ``--repeat N`` the local and the first remote build alternate which goes first.

The store is ``AWS_ENDPOINT_URL`` with its credentials, or, with ``--s3-local``, an S3-compatible server (moto's)
started in this process on 127.0.0.1 (its bucket created here): that measures the build's own cost of staging,
uploading and publishing, not a network's. Ray is started before the first build, so no build pays for it.
Writes JSON (``--out``) and prints a Markdown table for bench/README.md.

    python -m bench.build_s3 --corpus ../shared/data/scifact --s3-local --shards 1 4
    python -m bench.build_s3 --corpus data/corpus.jsonl --bucket my-bucket --shards 4     # AWS_ENDPOINT_URL, keys
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import time
from pathlib import Path

from bench.common import machine, write_record


def start_local_s3(bucket: str):
    """An S3-compatible server on a free local port, named in the environment before Ray starts (its workers
    upload the shards), with ``bucket`` created."""
    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    boto3.client("s3").create_bucket(Bucket=bucket)
    return server


def run(cfg, label: str) -> dict:
    from index_build.build import build_index

    summary = build_index(cfg)
    total = summary.total_s
    row = {"target": label, "shards": cfg.shards, "docs": summary.docs, "chunks": summary.chunks,
           "seconds": {k: round(v, 3) for k, v in summary.seconds.items()}, "docs_per_s": summary.docs / total,
           "chunks_per_s": summary.chunks / total, "publish": summary.publish, "fetched": summary.fetched,
           "shards_linked": len(summary.reuse.get("shards_linked", {})) if summary.reuse else 0}
    print(f"{label}, {cfg.shards} shards: {total:.1f}s, {row['docs_per_s']:.1f} docs/s"
          + (f", {summary.publish['bytes_uploaded'] / 1e6:.2f} MB uploaded" if summary.publish else ""), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.build_s3", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="a corpus (BEIR folder, .jsonl or .parquet file)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--s3-local", action="store_true", help="start a local S3-compatible server (moto) here")
    where.add_argument("--bucket", help="an existing bucket at AWS_ENDPOINT_URL (its credentials from the environment)")
    parser.add_argument("--shards", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--repeat", type=int, default=1, help="builds of each kind per shard count")
    parser.add_argument("--encoder", default="all-MiniLM-L6-v2")
    parser.add_argument("--chunk-size", type=int, default=128)
    parser.add_argument("--chunk-overlap", type=int, default=24)
    parser.add_argument("--work", type=Path, default=Path("bench/out/build_s3"),
                        help="local roots and this bench's node cache (emptied first)")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/build_s3_<corpus>.json")
    args = parser.parse_args(argv)

    run_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    bucket = args.bucket or "bench-build-s3"
    server = start_local_s3(bucket) if args.s3_local else None
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    from index_format import object_root

    # The node cache (mirrors of the roots, blobs) in the work folder, apart from this machine's own: the driver is
    # the only process that reads it (the shard tasks only upload).
    object_root.default_cache_dir = lambda: args.work / "node-cache"
    from index_build.build import ensure_ray, shutdown_ray
    from index_build.config import BuildConfig

    ensure_ray()
    rows = []
    try:
        for shards in args.shards:
            for repeat in range(args.repeat):
                options = {"corpus": args.corpus, "shards": shards, "encoder": args.encoder, "progress": False,
                           "chunk_size": args.chunk_size, "chunk_overlap": args.chunk_overlap}
                url = f"s3://{bucket}/bench-{run_id}/{shards}-{repeat}"
                local = BuildConfig(out=args.work / f"local-{shards}-{repeat}", **options)
                remote = BuildConfig(out=url, version="first", **options)
                pair = [(local, "local folder"), (remote, "s3")]
                for cfg, label in pair if repeat % 2 == 0 else pair[::-1]:
                    rows.append(run(cfg, label) | {"repeat": repeat})
                again = BuildConfig(out=url, version="again", **options)
                rows.append(run(again, "s3, same corpus again") | {"repeat": repeat})
    finally:
        shutdown_ray()
        if server is not None:
            server.stop()
    record = {"machine": machine(), "corpus": str(args.corpus), "encoder": args.encoder,
              "chunk_size": args.chunk_size, "chunk_overlap": args.chunk_overlap,
              "store": "local S3 server (moto, in process)" if args.s3_local else os.environ.get("AWS_ENDPOINT_URL",
                                                                                                 "AWS S3"),
              "runs": rows}
    out = args.out or Path(f"bench/results/build_s3_{args.corpus.stem}.json")
    write_record(out, record)
    print(f"\n{record['machine']['date']}, {record['machine']['cpu']}, {record['machine']['cores']} cores, "
          f"encoder {args.encoder}, store: {record['store']}\n")
    print("| into | shards | docs | chunks | build s | docs/s | chunks/s | MB in the version | MB uploaded "
          "| publish s (driver) | upload s (shard tasks, sum) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["publish"]
        mb = (f"{p['bytes'] / 1e6:.2f} | {p['bytes_uploaded'] / 1e6:.2f} | {p['seconds']:.2f} | "
              f"{p['shard_upload_seconds']:.2f}") if p else "- | - | - | -"
        print(f"| {r['target']} | {r['shards']} | {r['docs']:,} | {r['chunks']:,} | {r['seconds']['total']:.1f} "
              f"| {r['docs_per_s']:.1f} | {r['chunks_per_s']:.1f} | {mb} |")
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
