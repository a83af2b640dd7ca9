"""Serving as the index grows: the same service, the same queries, a small and a large index in one run.

For each ``--index NAME=ROOT`` in turn, ``python -m deployments --index ROOT --router.cache-size 0`` (the default serving
command, the cache off so every request is searched) is started and measured:

- seconds from the command to the first healthy answer (every shard opened, verified and warmed);
- peak and current RSS of every process of the app (VmHWM and VmRSS from /proc), by process;
- closed-loop load at ``limit`` 10, hybrid, ``--clients`` clients: QPS, p50 / p99, server CPU per answered
  query (machine busy CPU minus this process's), by process;
- with ``--activate NAME=VERSION``: seconds from ``python -m index_build.versions activate`` to the first
  answer from the new version (then the old one is activated again).

The queries are the split's queries of ``--data`` (SciFact's test queries are in both the 5k corpus and the
205k / 1M corpora of ``bench.scale_corpus``).

    python -m bench.serving_scale --data ../shared/data/scifact --index small=bench/out/indexes/scifact-h384 \\
        --index large=bench/out/indexes/scifact-1m --activate large=v2 --out bench/results/serving_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import load_beir, machine, proc_status, service_process, write_record
from bench.serving import level


def memory_by_process() -> dict[str, dict[str, float]]:
    """label -> {"hwm_mb", "rss_mb", "anon_mb", "file_mb"} of every ray and python process on the machine but this
    one. RSS splits into anonymous memory (what the process holds: its heap, the JVM's, decoded tables) and
    file-backed pages (memory-mapped index files it has read: the kernel's page cache, dropped under pressure)."""
    import psutil

    from bench.cpu import process_label

    out: dict[str, dict[str, float]] = {}
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        if p.info["pid"] == os.getpid():
            continue
        label = process_label(p.info["cmdline"] or [], p.info["name"] or "?")
        if not (label.startswith(("replica", "python -m deployments", "raylet", "gcs_server")) or "Serve" in label):
            continue
        fields = proc_status(p.info["pid"], ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"))
        if not fields:
            continue
        entry = out.setdefault(label, {"hwm_mb": 0.0, "rss_mb": 0.0, "anon_mb": 0.0, "file_mb": 0.0, "processes": 0})
        entry["hwm_mb"] = round(entry["hwm_mb"] + fields.get("VmHWM", 0) / 1024, 1)
        entry["rss_mb"] = round(entry["rss_mb"] + fields.get("VmRSS", 0) / 1024, 1)
        entry["anon_mb"] = round(entry["anon_mb"] + fields.get("RssAnon", 0) / 1024, 1)
        entry["file_mb"] = round(entry["file_mb"] + (fields.get("RssFile", 0) + fields.get("RssShmem", 0)) / 1024, 1)
        entry["processes"] += 1
        for kind, mb in mapped_files(p.info["pid"]).items():
            entry.setdefault("file_mb_by_kind", {})
            entry["file_mb_by_kind"][kind] = round(entry["file_mb_by_kind"].get(kind, 0.0) + mb, 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["hwm_mb"]))


def mapped_files(pid: int) -> dict[str, float]:
    """MB of file-backed pages a process has resident, by what the file is: an index file by its name in the shard
    (``embeddings.npy``, ``lucene/.doc``), else ``libraries`` (.so), ``jars`` or ``other``; from /proc/PID/smaps."""
    out: dict[str, float] = {}
    kind = None
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not line.endswith(" kB"):  # a mapping's header
            path = head[5] if len(head) == 6 else ""
            if not path.startswith("/"):
                kind = None
            elif "/shards/shard-" in path:
                rel = path.split("/shards/shard-", 1)[1].split("/", 1)[1]
                kind = f"lucene/{Path(rel).suffix}" if rel.startswith("lucene/") else rel
            elif ".so" in Path(path).name:
                kind = "libraries"
            else:
                kind = "jars" if path.endswith(".jar") else "other"
        elif kind and line.startswith("Rss:"):
            out[kind] = out.get(kind, 0.0) + int(line.split()[1]) / 1024
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v >= 0.1}


def served_version(base: str) -> str:
    body = httpx.post(f"{base}/search", json={"query": "probe", "limit": 1}, timeout=60).json()
    return next(iter(body["index_version"].values()))


def search_during(base: str, texts: list[str], stop) -> dict:
    """One client searching while a version loads: answers, errors and the slowest answer."""
    out = {"answered": 0, "errors": 0, "partial": 0, "max_ms": 0.0}
    i = 0
    while not stop.is_set():
        t = time.perf_counter()
        try:
            r = httpx.post(f"{base}/search", json={"query": texts[i % len(texts)], "limit": 10}, timeout=60)
            body = r.text
            out["answered" if r.status_code == 200 else "errors"] += 1
            out["partial"] += '"degraded":true' in body
        except httpx.HTTPError:
            out["errors"] += 1
        out["max_ms"] = max(out["max_ms"], (time.perf_counter() - t) * 1000)
        i += 1
    return out


def activation_seconds(base: str, root: Path, version: str, texts: list[str], timeout_s: float = 600) -> dict:
    """Seconds from the activate command to the first answer from ``version``, and what a client searching
    meanwhile got."""
    import threading

    stop = threading.Event()
    during: dict = {}
    client = threading.Thread(target=lambda: during.update(search_during(base, texts, stop)), daemon=True)
    client.start()
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "index_build.versions", "activate", str(root), version], check=True,
                   capture_output=True)
    try:
        while served_version(base) != version:
            if time.perf_counter() - t > timeout_s:
                raise TimeoutError(f"{version} not served after {timeout_s}s")
            time.sleep(0.2)
        seconds = round(time.perf_counter() - t, 1)
    finally:
        stop.set()
        client.join()
    return {"seconds": seconds} | during


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.serving_scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder (its queries are sent)")
    ap.add_argument("--index", action="append", required=True, metavar="NAME=ROOT")
    ap.add_argument("--activate", action="append", default=[], metavar="NAME=VERSION",
                    help="time the switch of index NAME to VERSION (an inactive version of its root)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--port", type=int, default=8650)
    ap.add_argument("--serve-args", default="", help="extra arguments for python -m deployments")
    ap.add_argument("--fresh-cache", action="append", default=[], metavar="NAME",
                    help="serve this --index with an empty $RAYSEARCH_CACHE, as a node that never saw its files: every "
                    "checksum read from the bytes (repeat for several)")
    ap.add_argument("--request", default="{}", help="more of every search's body, as JSON (e.g. '{\"ann\": "
                    "{\"nprobe\": 1580}}')")
    ap.add_argument("--out", type=Path, default=Path("bench/results/serving_scale.json"))
    args = ap.parse_args(argv)
    queries, _ = load_beir(args.data)
    texts = list(queries.values())
    switch = dict(a.split("=", 1) for a in args.activate)
    record: dict = {"machine": machine(), "clients": args.clients, "seconds": args.seconds, "runs": []}
    for spec in args.index:
        name, root = spec.split("=", 1)
        cmd = [sys.executable, "-m", "deployments", "--index", root, "--port", str(args.port), "--router.cache-size", "0",
               *args.serve_args.split()]
        fresh = name in args.fresh_cache
        env = {"RAYSEARCH_CACHE": tempfile.mkdtemp(prefix="raysearch-cache-")} if fresh else None
        t = time.perf_counter()
        with service_process(cmd, args.port, startup_s=1200, env=env) as base:
            run = {"index": name, "root": root, "start_s": round(time.perf_counter() - t, 1),
                   "checksums": "read from the bytes (a fresh cache)" if fresh else "as this node remembers them"}
            run["version"] = served_version(base)
            run["memory_after_start"] = memory_by_process()
            run["request"] = {"limit": 10, "method": "hybrid"} | json.loads(args.request)
            run["load"] = level(base, texts, run["request"], args.clients, args.seconds)
            run["memory_after_load"] = memory_by_process()
            record["runs"].append(run)
            write_record(args.out, record)
            print(f"{name}: started in {run['start_s']} s; {run['load']['qps']:.1f} QPS, "
                  f"{run['load']['server_cpu_ms_per_query']:.1f} ms server CPU a query, p99 "
                  f"{run['load']['p99_ms']:.0f} ms", flush=True)
            if name in switch:
                run["activate"] = activation_seconds(base, Path(root), switch[name], texts)
                run["activate_back"] = activation_seconds(base, Path(root), run["version"], texts)
                run["memory_after_activations"] = memory_by_process()
                print(f"{name}: activated {switch[name]}: {run['activate']}; back: {run['activate_back']}", flush=True)
            write_record(args.out, record)
        time.sleep(5)
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
