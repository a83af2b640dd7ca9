"""Serving cost and throughput in one run: this service against the LangChain peer, and against its own
in-process pipeline.

Phases, one after another (nothing else should run meanwhile):

1. **In-process**: the pipeline as deployed (one shard group, the ONNX query encoder) called directly,
   without Ray or HTTP, one request at a time: CPU ms per hybrid query at ``limit`` 10.
2. **This service** (``python -m deployments --router.cache-size 0`` from ``--code``, default this checkout):
   warm-up, then nDCG@10 of every test query at ``limit`` 100 (counting partial answers: degraded
   coverage or a warning), then closed-loop load at ``--clients`` for ``limit`` 100 and 10, and at one
   client for ``limit`` 10: QPS, p50 / p99, partial answers, server CPU per answered request (machine
   busy CPU minus this process's), and that CPU split by process.
   Before the loads, what the service costs at rest (``--rest-seconds`` with no request: machine busy CPU a
   second, and by process): Ray's and Serve's own processes and the replicas' followers, paid whatever the load.
   With ``--also NAME=ARGS``, the same again for the service started with those extra arguments; with
   ``--also-env NAME=VAR=VALUE,...``, with those environment variables (Serve's and Ray's own settings).
3. **The LangChain peer** (``bench/langchain_service.py``, EnsembleRetriever of BM25 + FAISS under
   uvicorn): the same loads with the same client. Skipped with ``--no-peer``.

With ``--profile``, one more ``limit`` 10 level runs with py-spy sampling every Python process of the
app (not measured: the profiler costs CPU); the raw stacks go to ``bench/results/profiles/`` and a table
of ms per query by component is printed and recorded.

    python -m bench.serving --data ../shared/data --index bench/out/indexes/scifact-3 --profile
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

from bench.common import load_beir, machine, service_process, write_record
from bench.cpu import by_process, cpu_by_thread, machine_busy_s, own_cpu_s, pid_of, process_cpu
from bench.loadgen import closed_loop, open_loop
from bench.quality import evaluate, rank_run

ROUTER = "replica router"  # bench.cpu.process_label's name for the router replica
ENCODER_THREADS = "query-encoder"  # its query encoder's pool (deployments.threads names them for the system)


def partial_body(body: bytes) -> bool:
    """A partial answer of this service: a late shard (degraded coverage) or a warning (late encoder)."""
    return b'"degraded":true' in body or b'"warnings":["' in body


def level(base: str, texts: list[str], body: dict, clients: int, seconds: float, check=None,
          rate: float | None = None) -> dict:
    """One load level: ``clients`` closed-loop connections (the capacity they reach), or, with ``rate``, requests
    arriving at that many a second whatever the answers (``loadgen.open_loop``). At a fixed rate two configurations
    are compared at the same throughput, so what the machine spends per second whatever the load (Ray's and Serve's
    own processes) weighs the same on each request of both; closed loops run the cheaper one faster and spread
    that over more requests. ``check`` (closed loop only) flags a partial answer."""
    bodies = [{"query": t} | body for t in texts]
    closed_loop(base, "/search", bodies[-50:], clients, min(5.0, seconds / 2), check)  # warm this level
    router = pid_of(ROUTER)
    threads0 = cpu_by_thread(router)
    busy0, own0, procs0, t0 = machine_busy_s(), own_cpu_s(), process_cpu(), time.perf_counter()
    if rate is None:
        out = closed_loop(base, "/search", bodies, clients, seconds, check)
        latencies, statuses, partial, kb = out.latencies_s, out.statuses, out.flagged, out.bytes_in
    else:
        arrivals = open_loop(base, "/search", bodies, rate, seconds)
        latencies = [a.latency_s for a in arrivals if a.status == 200]
        statuses = dict(Counter(a.status for a in arrivals))
        partial, kb = None, None
    wall = time.perf_counter() - t0
    server_cpu = (machine_busy_s() - busy0) - (own_cpu_s() - own0)
    procs = by_process(procs0, process_cpu())
    threads = cpu_by_thread(router)
    lat = np.sort(np.array(latencies)) * 1000
    n = len(latencies)
    by_thread = {k: 1000 * (v - threads0.get(k, 0.0)) / n for k, v in threads.items()} if n else {}
    return {
        "clients": clients if rate is None else None, "rate": rate, "limit": body.get("limit"),
        "seconds": round(wall, 2), "answered": n, "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "partial": partial, "qps": n / wall, "p50_ms": float(np.percentile(lat, 50)) if n else None,
        "p99_ms": float(np.percentile(lat, 99)) if n else None,
        "server_cpu_ms_per_query": 1000 * server_cpu / n if n else None,
        "client_cpu_ms_per_query": 1000 * (own_cpu_s() - own0) / n if n else None,
        "cpu_ms_per_query_by_process": {k: round(1000 * v / n, 3) for k, v in list(procs.items())[:12]} if n else {},
        # the router replica's threads (the query encoder's pool, the index thread, the event loop ...): the
        # encoder's share of the same requests' CPU, measured with them (``encoder_ms_per_query``)
        "router_cpu_ms_per_query_by_thread": {k: round(v, 3) for k, v in sorted(by_thread.items(),
                                                                                   key=lambda kv: -kv[1]) if v > 0},
        "encoder_ms_per_query": round(by_thread[ENCODER_THREADS], 3) if ENCODER_THREADS in by_thread else None,
        "kb_per_response": None if kb is None else kb / max(1, sum(statuses.values())) / 1024,
    }


def at_rest(seconds: float) -> dict:
    """The machine's busy CPU while the service answers nothing, a second, and split by process (ms a second)."""
    busy0, own0, procs0, t0 = machine_busy_s(), own_cpu_s(), process_cpu(), time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - t0
    busy = (machine_busy_s() - busy0) - (own_cpu_s() - own0)
    procs = by_process(procs0, process_cpu())
    return {"seconds": round(wall, 2), "server_cpu_ms_per_s": 1000 * busy / wall,
            "cpu_ms_per_s_by_process": {k: round(1000 * v / wall, 2) for k, v in list(procs.items())[:12]}}


def quality(base: str, queries: dict[str, str], qrels, body: dict) -> dict:
    """nDCG@10 etc. over every query, each asked once; partial answers are counted, not retried."""
    run, partial, failed = {}, 0, 0
    with httpx.Client(timeout=120) as http:
        for qid, text in queries.items():
            r = http.post(f"{base}/search", json={"query": text} | body)
            if r.status_code != 200:
                failed += 1
                continue
            data = r.json()
            cov = data.get("coverage") or {}
            partial += bool(cov.get("degraded") or data.get("warnings"))
            best: dict[str, float] = {}
            for hit in data["results"]:
                best.setdefault(hit["doc_id"], hit["score"])
            run[qid] = rank_run(list(best.items()))
    return evaluate(qrels, run) | {"partial": partial, "failed": failed, "queries": len(queries)}


def in_process(index: Path, texts: list[str], body: dict, n: int) -> dict:
    from deployments.config import RouterSettings
    from deployments.edge.schemas import SearchRequest
    from deployments.search.inprocess import inprocess_pipeline
    from deployments.serve.heap import settle_heap

    pipe = inprocess_pipeline({"default": index}, RouterSettings(cache_size=0))

    async def go(k, offset=0):
        for i in range(k):
            response = await pipe.search(SearchRequest(query=texts[(offset + i) % len(texts)], **body))
            response.model_dump_json(exclude_none=True)  # the served path answers JSON too

    asyncio.run(go(3000))  # JIT of the JVM: Lucene's hot paths compile over the first thousands of searches
    settle_heap()  # as a replica does once its version is open
    c0, t0 = own_cpu_s(), time.perf_counter()
    asyncio.run(go(n, 7))
    return {"requests": n, "cpu_ms_per_query": 1000 * (own_cpu_s() - c0) / n,
            "latency_ms": 1000 * (time.perf_counter() - t0) / n}


# Where a sampled stack's time goes: the first frame from the leaf up whose file matches decides.
COMPONENTS = [
    ("embedding", ("onnxruntime", "encoders.py", "query_encoder.py", "sentence_transformers", "torch/")),
    ("BM25 (Lucene)", ("lucene_shard.py", "shard/lucene.py", "jnius")),
    ("dense (FAISS)", ("dense_shard.py", "shard/dense.py", "faiss/")),
    ("filters", ("filters.py",)),
    ("JSON and validation", ("json/", "orjson", "pydantic", "fastapi/encoders.py")),
    ("fusion, merge, pipeline", ("fusion.py", "hits.py", "mmr.py", "pipeline.py", "context.py", "shard_group.py",
                                 "shard_service.py", "shard_searcher.py", "shard/group.py", "shard/service.py",
                                 "router.py", "shard_retriever.py", "guard.py")),
    ("FastAPI/Starlette", ("fastapi/", "starlette/")),
]


def classify(stack: str) -> str:
    for frame in reversed(stack.split(";")):
        for name, markers in COMPONENTS:
            if any(m in frame for m in markers):
                return name
    return "Serve plumbing (Ray, asyncio)"


def profile(base: str, texts: list[str], body: dict, clients: int, seconds: float, out_dir: Path) -> dict:
    """py-spy on every Python process of the app during one load level; ms per query by component."""
    import psutil

    from bench.cpu import process_label

    out_dir.mkdir(parents=True, exist_ok=True)
    targets = {}
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        label = process_label(p.info["cmdline"] or [], p.info["name"] or "")
        if label.startswith(("replica ", "ServeController", "ProxyActor")) or label == "python -m deployments":
            targets[p.info["pid"]] = label
    spies = {}
    for pid, label in targets.items():
        path = out_dir / f"{label.replace(' ', '_')}-{pid}.txt"
        spies[pid] = (label, path, subprocess.Popen(
            [shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid), "--rate", "100", "--format", "raw", "--nonblocking",
             "--duration", str(int(seconds) + 2), "--output", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1)
    lv = level(base, texts, body, clients, seconds)
    for _, _, proc in spies.values():
        proc.wait(timeout=120)
    components: dict[str, float] = {}
    per_process_ms = lv["cpu_ms_per_query_by_process"]
    for label, path, _ in spies.values():
        if not path.is_file():
            continue
        counts: dict[str, int] = {}
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if stack:
                counts[classify(stack)] = counts.get(classify(stack), 0) + int(n)
        total = sum(counts.values())
        ms = per_process_ms.get(label, 0.0)
        for name, c in counts.items():
            components[name] = components.get(name, 0.0) + ms * c / total if total else 0.0
    python_ms = sum(per_process_ms.get(label, 0.0) for label in {t[0] for t in spies.values()})
    other = {k: v for k, v in per_process_ms.items() if k not in {t[0] for t in spies.values()}}
    return {"level": lv, "components_ms_per_query": dict(sorted(components.items(), key=lambda kv: -kv[1])),
            "profiled_processes_ms_per_query": python_ms, "other_processes_ms_per_query": other,
            "files": sorted(str(p) for _, p, _ in spies.values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="folder holding BEIR datasets")
    ap.add_argument("--dataset", default="scifact")
    ap.add_argument("--index", type=Path, required=True, help="index root built by index_build")
    ap.add_argument("--code", type=Path, default=Path("."), help="checkout whose python -m deployments is served "
                    "(another commit's worktree measures before/after in one run)")
    ap.add_argument("--label", default="this checkout", help="name of the served code in the record")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--port", type=int, default=8600)
    ap.add_argument("--no-peer", action="store_true", help="skip the LangChain service")
    ap.add_argument("--no-in-process", action="store_true", help="skip the in-process baseline")
    ap.add_argument("--profile", action="store_true", help="py-spy the app during one more limit-10 level")
    ap.add_argument("--profile-dir", type=Path, default=Path("bench/results/profiles"))
    ap.add_argument("--serve-args", default="", help="extra arguments for python -m deployments")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=ARGS",
                    help="measure the service again with these extra arguments, in the same run (repeatable), "
                         "e.g. --also 'int8=--encoder.backend onnx-int8'")
    ap.add_argument("--also-code", action="append", default=[], metavar="NAME=DIR",
                    help="measure another checkout's service too, in the same run (repeatable): a worktree of "
                         "the commit before a change gives before and after on one machine in one run")
    ap.add_argument("--also-env", action="append", default=[], metavar="NAME=VAR=VALUE,...",
                    help="measure the service again started with these environment variables, in the same run "
                         "(repeatable), e.g. --also-env 'serve-0.1s=RAY_SERVE_CONTROL_LOOP_INTERVAL_S=0.1'")
    ap.add_argument("--rest-seconds", type=float, default=20,
                    help="how long the service's CPU at rest is measured before its loads (0: not measured)")
    ap.add_argument("--out", type=Path, default=Path("bench/out/serving.json"))
    args = ap.parse_args(argv)
    also_env = {}
    for variant in args.also_env:
        name, _, assignments = variant.partition("=")
        pairs = [a.partition("=") for a in assignments.split(",") if a]
        if not name or not pairs or any(not var or not sep for var, sep, _ in pairs):
            ap.error(f"--also-env {variant!r}: expected NAME=VAR=VALUE[,VAR=VALUE...]")
        also_env[name] = {var: value for var, _, value in pairs}

    queries, qrels = load_beir(args.data / args.dataset)
    texts = list(queries.values())
    hybrid = {"method": "hybrid", "include_citations": False}
    record = {"machine": machine(), "dataset": args.dataset, "index": str(args.index), "code": args.label,
              "clients": args.clients, "seconds": args.seconds}
    code = args.code.resolve()
    record["code_sha"] = subprocess.run(["git", "-C", str(code), "rev-parse", "--short=12", "HEAD"],
                                        capture_output=True, text=True).stdout.strip()

    if not args.no_in_process:
        record["in_process"] = in_process(args.index.resolve(), texts, hybrid | {"limit": 10}, n=600)
        print("in-process", json.dumps(record["in_process"]), flush=True)

    def measure(serve_args: str, label: str, profile_too: bool, code: Path = code,
                env: dict[str, str] | None = None) -> dict:
        cmd = [sys.executable, "-m", "deployments", "--index", str(args.index.resolve()), "--port", str(args.port),
               "--router.cache-size", "0", *serve_args.split()]
        env_cwd = os.getcwd()
        os.chdir(code)
        ours: dict = {"serve_args": serve_args, "env": env or {}, "code_sha": subprocess.run(
            ["git", "-C", str(code), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()}
        try:
            with service_process(cmd, args.port, env=env) as base:
                os.chdir(env_cwd)
                closed_loop(base, "/search", [{"query": t} | hybrid | {"limit": 10} for t in texts], 2, 40)  # JIT
                if args.rest_seconds > 0:
                    time.sleep(5)  # the warm-up's last requests and their logs settled
                    ours["at_rest"] = at_rest(args.rest_seconds)
                    print(label, "at rest", json.dumps(ours["at_rest"]), flush=True)
                ours["quality_limit_100"] = quality(base, queries, qrels, hybrid | {"limit": 100})
                print(label, "quality", json.dumps(ours["quality_limit_100"]), flush=True)
                for name, clients, limit in (("limit_100", args.clients, 100), ("limit_10", args.clients, 10),
                                             ("limit_10_one_client", 1, 10)):
                    ours[name] = level(base, texts, hybrid | {"limit": limit}, clients, args.seconds, partial_body)
                    print(label, name, json.dumps(ours[name]), flush=True)
                if profile_too:
                    tag = args.label.replace(" ", "-")
                    ours["profile"] = profile(base, texts, hybrid | {"limit": 10}, args.clients, args.seconds,
                                              args.profile_dir / tag)
                    print("profile", json.dumps(ours["profile"]), flush=True)
        finally:
            os.chdir(env_cwd)
        return ours

    record["service"] = measure(args.serve_args, "service", args.profile)
    for variant in args.also:
        name, _, serve_args = variant.partition("=")
        record.setdefault("variants", {})[name] = measure(serve_args, name, False)
    for name, env in also_env.items():
        record.setdefault("variants", {})[name] = measure(args.serve_args, name, False, env=env)
    for variant in args.also_code:
        name, _, other = variant.partition("=")
        record.setdefault("variants", {})[name] = measure(args.serve_args, name, False, Path(other).resolve())

    if not args.no_peer:
        from index_format.versions import read_version_manifest, resolve_version_dir

        encoder = read_version_manifest(resolve_version_dir(args.index)).encoder
        peer_cmd = [sys.executable, "-m", "bench.langchain_service", "--corpus",
                    str(args.data / args.dataset / "corpus.jsonl"), "--port", str(args.port + 1),
                    "--vectors-from", str(args.index), "--model", encoder]
        peer = record["langchain"] = {}
        with service_process(peer_cmd, args.port + 1, startup_s=1800) as base:
            peer["quality_limit_100"] = quality(base, queries, qrels, {"limit": 100})
            for name, clients, limit in (("limit_100", args.clients, 100), ("limit_10", args.clients, 10)):
                peer[name] = level(base, texts, {"limit": limit}, clients, args.seconds)
                print("langchain", name, json.dumps(peer[name]), flush=True)

    write_record(args.out, record)
    print(f"\n{args.dataset}, {record['machine']['date']}, {record['machine']['cpu']} x{record['machine']['cores']}, "
          f"served code {args.label} ({record['code_sha']})\n")
    print("| service | level | QPS | p50 ms | p99 ms | server CPU ms/query | the encoder's ms/query (x) | partial "
          "| non-200 |")
    print("|---|---|---|---|---|---|---|---|---|")
    measured = {"service": record["service"], **record.get("variants", {}), "langchain": record.get("langchain", {})}
    for who, rec in measured.items():
        for name in ("limit_100", "limit_10", "limit_10_one_client"):
            lv = rec.get(name)
            if lv:
                bad = sum(v for k, v in lv["statuses"].items() if k != "200")
                enc = lv.get("encoder_ms_per_query")
                share = f"{enc:.1f} ({lv['server_cpu_ms_per_query'] / enc:.2f}x)" if enc else "-"
                print(f"| {who} | {lv['clients']} clients, limit {lv['limit']} | {lv['qps']:.1f} | {lv['p50_ms']:.1f} "
                      f"| {lv['p99_ms']:.1f} | {lv['server_cpu_ms_per_query']:.1f} | {share} | {lv['partial']} | {bad} |")
    for who, rec in measured.items():
        if "at_rest" in rec:
            print(f"{who} at rest: {rec['at_rest']['server_cpu_ms_per_s']:.1f} ms of CPU a second")
    if "in_process" in record:
        ip = record["in_process"]["cpu_ms_per_query"]
        http = record["service"]["limit_10"]["server_cpu_ms_per_query"]
        print(f"\nin-process {ip:.1f} ms CPU/query; HTTP at {args.clients} clients {http:.1f}: ratio {http / ip:.2f}")
    if "langchain" in record:
        for who, rec in measured.items():
            if who == "langchain":
                continue
            for name in ("limit_100", "limit_10"):
                ratio = rec[name]["qps"] / record["langchain"][name]["qps"]
                rec[f"qps_ratio_{name}"] = ratio
                print(f"{who}: QPS ratio at {name.replace('_', ' ')}: {ratio:.2f}x the LangChain service")
        for who, rec in measured.items():
            print(f"nDCG@10 {who}: {rec['quality_limit_100']['nDCG@10']:.4f}")
    if "profile" in record.get("service", {}):
        print("\n| component | ms per query |\n|---|---|")
        for name, ms in record["service"]["profile"]["components_ms_per_query"].items():
            print(f"| {name} | {ms:.2f} |")
        for name, ms in record["service"]["profile"]["other_processes_ms_per_query"].items():
            print(f"| process: {name} | {ms:.2f} |")
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
