"""Reindex and activate under load: a new version is built into the served root while clients search.

1. Builds version A of the corpus into ``--work/index`` (skipped when it is already there).
2. Serves that root (``python -m deployments``, 2 replicas per shard) and starts closed-loop clients.
3. Builds version B with another chunk size into the same root (``python -m index_build``, which
   activates it when it finishes): the running service must follow it.
4. Rolls back to A through the admin API, then keeps the load on a few seconds more.

Every response must be a 200, and each of its results must be exactly a chunk (id and text) of the
version it names: A and B chunk documents differently, so a response that mixed them would show it.

    python -m bench.reindex --data ../shared/data --dataset cranfield
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pyarrow.parquet as pq

from bench.common import ClosedLoop, load_beir, machine, percentile_ms, served, write_record
from index_format.versions import active_version, list_versions, versions_dir


def chunk_texts(root: Path, version: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for shard in sorted((versions_dir(root) / version / "shards").iterdir()):
        table = pq.read_table(shard / "chunks.parquet", columns=["chunk_id", "text"])
        out.update(zip(table["chunk_id"].to_pylist(), table["text"].to_pylist(), strict=True))
    return out


def build(corpus: Path, root: Path, version: str, chunk_size: int, overlap: int, shards: int) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "index_build", "--corpus", str(corpus), "--out", str(root),
                    "--shards", str(shards), "--version", version, "--chunk-size", str(chunk_size),
                    "--chunk-overlap", str(overlap), "--no-progress"], check=True)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.reindex", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="folder holding BEIR datasets")
    ap.add_argument("--dataset", default="cranfield")
    ap.add_argument("--work", type=Path, default=Path("bench/out/reindex"))
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--after-s", type=float, default=15, help="load kept on after each switch")
    ap.add_argument("--port", type=int, default=8460)
    ap.add_argument("--out", type=Path, default=Path("bench/out/reindex.json"))
    args = ap.parse_args(argv)

    folder = args.data / args.dataset
    queries = list(load_beir(folder)[0].values())
    root = args.work / "index"
    a, b = "a-chunk128", f"b-chunk96-{time.strftime('%H%M%S')}"
    if a not in list_versions(root):
        print(f"building {a} (before serving) ...", flush=True)
        build(folder, root, a, 128, 24, args.shards)
    subprocess.run([sys.executable, "-m", "index_build.versions", "activate", str(root), a], check=True)

    def search(client: httpx.Client, rng: random.Random) -> dict:
        r = client.post("/search", json={"query": rng.choice(queries), "limit": 10})
        body = r.json() if r.status_code == 200 else {}
        return {"status": r.status_code, "version": body.get("index_version", {}).get("default"),
                "results": [(x["chunk_id"], x["content"]) for x in body.get("results", [])]}

    marks: dict[str, float] = {}
    extra = ["--router.cache-size", "0", "--shards.num-replicas", "2", "--shards.num-cpus", "0.1"]
    with served(root, args.port, extra) as base, ClosedLoop(base, args.clients, search) as load:
        time.sleep(args.after_s)
        print(f"building {b} into the served root under load ...", flush=True)
        marks["build_started"] = time.monotonic()
        build_s = build(folder, root, b, 96, 16, args.shards)
        marks["build_done"] = time.monotonic()
        while httpx.get(f"{base}/admin/versions", timeout=30).json()["collections"]["default"]["serving"] != b:
            time.sleep(0.2)
        marks["serving_b"] = time.monotonic()
        time.sleep(args.after_s)
        r = httpx.post(f"{base}/admin/collections/default/rollback", timeout=300)
        r.raise_for_status()
        marks["rolled_back"] = time.monotonic()
        print(f"rolled back: {r.json()}", flush=True)
        time.sleep(args.after_s)

    texts = {v: chunk_texts(root, v) for v in (a, b)}
    answers = [(started, seconds, kept) for started, seconds, kept in load.answers]
    statuses = Counter(k["status"] for _, _, k in answers)
    mixed = [k for _, _, k in answers if k["status"] == 200
             and any(texts.get(k["version"], {}).get(cid) != text for cid, text in k["results"])]
    per_version = Counter(k["version"] for _, _, k in answers if k["status"] == 200)
    # Responses to requests that started after a switch completed, on the version they should be on.
    late_b = Counter(k["version"] for t, _, k in answers if marks["serving_b"] < t < marks["rolled_back"] - 1)
    after_rollback = Counter(k["version"] for t, _, k in answers if t > marks["rolled_back"])
    latencies = sorted(s for _, s, k in answers if k["status"] == 200)
    during = sorted(s for t, s, k in answers if k["status"] == 200 and marks["build_started"] < t < marks["build_done"])
    record = {
        "machine": machine(), "dataset": args.dataset, "shards": args.shards, "clients": args.clients,
        "versions": {a: len(texts[a]), b: len(texts[b])}, "build_b_seconds": round(build_s, 1),
        "follow_after_build_s": round(marks["serving_b"] - marks["build_done"], 2),
        "requests": len(answers), "statuses": {str(k): v for k, v in statuses.items()},
        "failed": len(answers) - statuses.get(200, 0), "mixed_version_responses": len(mixed),
        "responses_per_version": dict(per_version), "after_switch_to_b": dict(late_b),
        "after_rollback": dict(after_rollback), "active_at_end": active_version(root),
        "p50_ms": percentile_ms(latencies, 0.5), "p99_ms": percentile_ms(latencies, 0.99),
        "p50_ms_during_build": percentile_ms(during, 0.5), "p99_ms_during_build": percentile_ms(during, 0.99),
    }
    write_record(args.out, record)
    print(json.dumps({k: v for k, v in record.items() if k != "machine"}, indent=2))
    return 0 if record["failed"] == 0 and not mixed else 1


if __name__ == "__main__":
    raise SystemExit(main())
