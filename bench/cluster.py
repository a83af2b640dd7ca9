"""Figures of a cluster of nodes that share no disk (``bench.local_cluster``) against one node, on this machine.

    python -m bench.cluster --corpus DATA/scifact/corpus.jsonl --queries DATA/scifact/queries.jsonl \\
        --out bench/results/cluster.json

Both sides get the same Ray CPUs in total (``--cpus``, 3 by default): one node holding them all, against a head and
two worker nodes holding one each, every worker in its own mount namespace. The corpus is uploaded to a local S3
server (moto's, on loopback) and each side builds it into ``s3://`` with ``python -m index_build`` joined to its
cluster, then serves it with ``python -m deployments --via-proxy`` (the two-node side: shard group i on worker i,
routers on the head and worker 1). Measured on each side:

- the build's documents/s (its own summary's wall time);
- search QPS at ``--concurrency`` closed-loop clients for ``--seconds``, with p50/p99 latency, and the server's CPU
  seconds per query: the CPU time of every process of the cluster and of the serving driver over the window
  (``psutil``), divided by the queries answered;
- on the cluster only: write visibility, from a write's acknowledgement to its first answer from the other router
  (p50/p99 over ``--writes`` writes); and a worker node killed under load (searches and writes), restarted 4 s later
  with an empty disk: answered, partial and failed requests, and the time until every group is served again.

The machine is shared: the load generator runs on the same cores as the nodes. Compare only within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.local_cluster import LocalCluster, free_port

ROUTERS = {"node_head": {"router": 1}, "node_1": {"router": 1}}


def cluster_config(groups: int, on_nodes: bool) -> dict:
    """The app's config for ``groups`` shard groups of one shard each: group i on worker node i+1 (``on_nodes``),
    else anywhere; two routers where the ``router`` resource is."""
    shards = {"placement": "deployment", "group_size": 1, "num_cpus": 0.1, "warmup_searches": 200,
              "lucene_heap": "256m"}
    if on_nodes:
        shards["groups"] = {str(g): {"resources": {f"node_{g + 1}": 0.1}} for g in range(groups)}
    return {"shards": shards, "router": {"num_replicas": 2, "num_cpus": 0.1, "resources": {"router": 1}}}


class Service:
    """``python -m deployments --via-proxy`` joined to ``cluster``, serving ``root`` with ``config``."""

    def __init__(self, cluster: LocalCluster, root: str, config: dict, workdir: Path, timeout_s: float = 300):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        path = workdir / f"serve-{self.port}.yaml"
        path.write_text(json.dumps(config))  # (JSON is YAML)
        self.log = cluster.logs / f"serve-{self.port}.log"
        env = cluster_env(cluster)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "deployments", "--via-proxy", "--port", str(self.port), "--index", root,
                 "--config", str(path)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
                start_new_session=True)
        deadline = time.monotonic() + timeout_s
        # Ready once the command says it serves (the application RUNNING: every replica of every deployment up, not
        # only a router that answers /health) and its proxy answers.
        while not ("Ctrl-C to stop" in self.log.read_text() and self.healthy()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited: {self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not healthy after {timeout_s:.0f}s: {self.log.read_text()[-3000:]}")
            time.sleep(1)

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def search(self, query: str, limit: int = 10, client: httpx.Client | None = None) -> httpx.Response:
        return (client or httpx).post(f"{self.base}/search", json={"query": query, "limit": limit}, timeout=30)

    def write(self, doc_id: str, text: str, client: httpx.Client | None = None) -> httpx.Response:
        return (client or httpx).put(f"{self.base}/collections/default/documents", timeout=30,
                                     json={"documents": [{"id": doc_id, "text": text}]})

    def stop(self, drain: bool = True) -> None:
        """Stop as a supervisor does (SIGTERM: the app drains, up to Serve's 20 s), or at once (``drain=False``,
        when the cluster goes with it)."""
        if not drain:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def cluster_env(cluster: LocalCluster) -> dict[str, str]:
    """The environment of a driver of the cluster (on the head node)."""
    return cluster.node_env() | {"RAY_ADDRESS": cluster.address}


def on_cluster(cluster: LocalCluster, argv: list[str], timeout: float = 3600) -> subprocess.CompletedProcess:
    """A product command run as a driver of the cluster (on the head node)."""
    return subprocess.run([sys.executable, *argv], env=cluster_env(cluster), capture_output=True, text=True, timeout=timeout,
                          cwd=cluster.workdir)


def placement(cluster: LocalCluster) -> dict[str, list[str]]:
    """Live Serve replicas (deployment names) by the node they run on (node_head, node_1, ...)."""
    code = ("import json, ray; ray.init(logging_level='ERROR', log_to_driver=False)\n"
            "nodes = {n['NodeID']: next(k for k in n['Resources'] if k.startswith('node_')) for n in ray.nodes() "
            "if n['Alive']}\n"
            "out = {}\n"
            "for a in ray._private.state.state.actor_table(None).values():\n"
            "    if a['State'] == 'ALIVE' and (a.get('Name') or '').startswith('SERVE_REPLICA'):\n"
            "        out.setdefault(nodes.get(a['Address']['NodeID'], '?'), []).append(a['Name'].split('#')[1])\n"
            "print(json.dumps(out))")
    proc = on_cluster(cluster, ["-c", code], timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    # Ray may print a line of its own after ours (a node it saw die): ours is the last JSON one.
    return json.loads(next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("{")))


def serve_state(cluster: LocalCluster, deployment: str, app: str = "raysearch") -> dict:
    """One deployment as Serve's controller reports it: status and message, target replicas, and each replica's
    state with its node (node_head, node_1, ...), for a failure to say where a change of layout stood."""
    code = ("import json, sys, ray; ray.init(logging_level='ERROR', log_to_driver=False)\n"
            "from deployments.settings import _client\n"
            "nodes = {n['NodeID']: next(k for k in n['Resources'] if k.startswith('node_')) for n in ray.nodes() "
            "if n['Alive']}\n"
            "d = _client().get_serve_details()['applications'][sys.argv[1]]['deployments'][sys.argv[2]]\n"
            "print(json.dumps({'status': d.get('status'), 'message': d.get('message'), "
            "'target': d.get('target_num_replicas'), 'replicas': [(r.get('state'), nodes.get(r.get('node_id'), "
            "r.get('node_id'))) for r in d.get('replicas') or []]}))")
    proc = on_cluster(cluster, ["-c", code, app, deployment], timeout=120)
    if proc.returncode != 0:
        return {"unknown": proc.stderr[-1000:]}
    return json.loads(next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("{")))


def override(cluster: LocalCluster, deployment: str, options: dict | None, app: str = "raysearch") -> None:
    """Deploy the running app's config again with ``options`` over one deployment's (Serve's per-deployment
    override, applied in place: nothing restarts), or without that override (None), as an operator's ``serve
    deploy`` of an edited config does."""
    code = ("import json, sys\n"
            "from deployments.rebalance.mover import ServeApp\n"
            "from deployments.settings import _client\n"
            "app, name, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])\n"
            "served = ServeApp(app, [], _client())\n"
            "config = served.read()[2]\n"
            "others = [d for d in config.get('deployments') or [] if d.get('name') != name]\n"
            "config['deployments'] = others + ([{'name': name, **options}] if options is not None else [])\n"
            "served.deploy(config)\n")
    proc = on_cluster(cluster, ["-c", code, app, deployment, json.dumps(options)], timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])


def visibility(service: Service, writes: int, prefix: str = "zebrafinch") -> dict:
    """Each write's time from acknowledgement to its first answer from a router other than the one that took it.
    Every request opens its own connection: a proxy sends requests to the router replica on its own node, and the
    nodes' proxies share the port (``SO_REUSEPORT``), so new connections spread over the proxies and so over the
    routers, as clients behind a load balancer do."""
    seconds, writers = [], set()
    for _ in range(10):  # every router has searched before (its first search is not a write's visibility)
        service.search(f"{prefix} warm up", 1)
    for i in range(writes):
        doc_id, token = f"{prefix}-{i:04d}", f"{prefix}{i:04d}"
        r = service.write(doc_id, f"{token} was written here")
        r.raise_for_status()
        acked, writer = time.monotonic(), r.headers["x-served-by"]
        writers.add(writer)
        while True:
            s = service.search(token, 1)
            hits = s.json()["results"]
            if s.headers["x-served-by"] != writer and hits and hits[0]["doc_id"] == doc_id:
                seconds.append(time.monotonic() - acked)
                break
            if time.monotonic() - acked > 10:
                seconds.append(float("inf"))
                break
    # The first write after a start also pays for the first search with a fresh segment on the other router (about
    # a second once; warm() at the replica's start loads the rest): reported apart, not in the percentiles.
    rest = seconds[1:]
    return {"writes": writes, "writers": sorted(writers), "seconds": seconds, "first_ms": round(seconds[0] * 1000, 1),
            "p50_ms": _ms(rest, 50), "p99_ms": _ms(rest, 99), "max_ms": round(max(rest) * 1000, 1)}


@contextlib.contextmanager
def searching(service: Service, query: str = "telescope galaxy", client: str = "http") -> Iterator[dict]:
    """One client searching without pause while the body runs, each search on a new connection (so they spread over
    every node's proxy): a bare HTTP client (``http``: a failure is the caller's), or the project's own
    (``raysearch``: it sends a search again whose connection went away or that a proxy did not route; ``resent``
    counts those). What it got, tallied once it stops: answered, partial, failed with why, resent, p99 in ms."""
    from raysearch_client import SearchClient, SearchServiceError

    stop, tally = threading.Event(), {"answered": 0, "partial": 0, "failed": [], "resent": 0}
    latencies: list[float] = []

    def one() -> float | None:
        """The coverage of one search, or None with its failure tallied."""
        if client == "http":
            r = service.search(query, 10)
            if r.status_code == 404 and '"error"' not in r.text:  # a proxy's own, its routes dropped as it drains
                tally["failed"].append("proxy 404")
            elif r.status_code != 200:
                tally["failed"].append(r.status_code)
            else:
                return r.json()["coverage"]["ratio"]
            return None
        sent = []
        with SearchClient(service.base, timeout=30) as c:
            c.http.event_hooks["request"].append(sent.append)
            try:
                return c.search(query, limit=10).coverage.ratio
            except SearchServiceError as e:
                tally["failed"].append(e.status)
            finally:
                tally["resent"] += len(sent) - 1
        return None

    def load() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                ratio = one()
            except httpx.HTTPError as e:
                tally["failed"].append(type(e).__name__)
                continue
            if ratio is not None:
                latencies.append(time.monotonic() - started)
                tally["answered"] += 1
                tally["partial"] += ratio < 1

    thread = threading.Thread(target=load)
    thread.start()
    try:
        yield tally
    finally:
        stop.set()
        thread.join(60)
        tally["p99_ms"] = _ms(latencies, 99) if latencies else None


def kill_under_load(service: Service, cluster: LocalCluster, node: str, down_s: float = 4, query: str = "solar cell",
                    timeout_s: float = 240) -> dict:
    """Searches (3 of 4 requests) and writes from one client while ``node`` is killed, then restarted after
    ``down_s`` with an empty disk; until every router that answered has answered whole again. Each request opens
    its own connection (so they spread over the nodes' proxies, as behind a load balancer). A partial answer is
    timed by when its request was sent."""
    stop = threading.Event()
    tally = {"answered": 0, "partial": 0, "failed": 0, "errors": [], "acked": [], "last_partial": 0.0,
             "routers": set()}

    def load():
        i = 0
        while not stop.is_set():
            i += 1
            sent = time.monotonic()
            try:
                if i % 4 == 0:
                    r = service.write(f"kiwi-{i:05d}", f"kiwibird{i:05d} under load")
                    if r.status_code == 200:
                        tally["acked"].append(f"kiwi-{i:05d}")
                else:
                    r = service.search(query, 10)
                    if r.status_code == 200 and r.json()["coverage"]["ratio"] < 1:
                        tally["partial"] += 1
                        tally["last_partial"] = max(tally["last_partial"], sent)
                if r.status_code == 200:
                    tally["answered"] += 1
                    tally["routers"].add(r.headers["x-served-by"])
                else:
                    tally["failed"] += 1
                    tally["errors"].append(str(r.status_code))
            except httpx.HTTPError as e:  # a connection to the killed node's proxy
                tally["failed"] += 1
                tally["errors"].append(type(e).__name__)

    thread = threading.Thread(target=load)
    thread.start()
    time.sleep(3)
    killed = time.monotonic()
    cluster.kill(node)
    time.sleep(down_s)
    cluster.restart(node)
    deadline = time.monotonic() + timeout_s
    whole: dict[str, float] = {}  # router -> when it first answered whole since the node came back
    while time.monotonic() < deadline and not (tally["routers"] and set(tally["routers"]) <= set(whole)):
        sent = time.monotonic()
        r = service.search(query)
        if r.status_code == 200 and r.json()["coverage"]["ratio"] == 1.0:
            whole.setdefault(r.headers["x-served-by"], sent)
        elif r.status_code == 200:
            whole.pop(r.headers["x-served-by"], None)
        time.sleep(0.1)
    back = (max(whole.values()) if whole else time.monotonic()) - killed
    time.sleep(1)
    stop.set()
    thread.join(60)
    return {"node": node, "down_s": down_s, "answered": tally["answered"], "partial": tally["partial"],
            "failed": tally["failed"], "errors": sorted(set(tally["errors"])), "acked_writes": tally["acked"],
            "routers": sorted(tally["routers"]), "served_again_s": round(back, 2),
            "last_partial_s": round(tally["last_partial"] - killed, 2) if tally["last_partial"] else None}


def _ms(seconds: list[float], pct: int) -> float:
    s = sorted(seconds)
    return round(s[min(len(s) - 1, int(len(s) * pct / 100))] * 1000, 1)


def cpu_seconds(sessions: list[int]) -> float:
    """CPU time (user + system) of every process in these sessions: a node's ``ray start`` and what it starts (Ray
    gives each worker its own process group, not its own session), and the serving driver."""
    import psutil

    total = 0.0
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) in sessions:
                t = p.cpu_times()
                total += t.user + t.system
        except (psutil.Error, ProcessLookupError):
            continue
    return total


def load(service: Service, cluster: LocalCluster, queries: list[str], seconds: float, concurrency: int) -> dict:
    """Closed-loop search load; QPS, latency and the server's CPU seconds per query."""
    groups = [n.proc.pid for n in cluster.nodes] + [service.proc.pid]  # each started a session
    stop = threading.Event()
    latencies: list[float] = []
    failed = [0]

    def client(offset: int):
        with httpx.Client() as c:
            i = offset
            while not stop.is_set():
                t = time.perf_counter()
                r = service.search(queries[i % len(queries)], 10, c)
                if r.status_code == 200:
                    latencies.append(time.perf_counter() - t)
                else:
                    failed[0] += 1
                i += concurrency

    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    time.sleep(min(5.0, seconds / 3))  # warm-up, discarded
    n0, cpu0, t0 = len(latencies), cpu_seconds(groups), time.perf_counter()
    time.sleep(seconds)
    n1, cpu1, t1 = len(latencies), cpu_seconds(groups), time.perf_counter()
    stop.set()
    for t in threads:
        t.join()
    window = latencies[n0:n1]
    return {"queries": n1 - n0, "qps": round((n1 - n0) / (t1 - t0), 1), "p50_ms": _ms(window, 50),
            "p99_ms": _ms(window, 99), "server_cpu_ms_per_query": round((cpu1 - cpu0) / max(1, n1 - n0) * 1000, 2),
            "failed": failed[0], "concurrency": concurrency, "seconds": round(t1 - t0, 1)}


def build(cluster: LocalCluster, corpus_url: str, out: str, shards: int, encoder: str) -> dict:
    path = cluster.workdir / f"build-{shards}.json"
    proc = on_cluster(cluster, ["-m", "index_build", "--corpus", corpus_url, "--out", out, "--shards", str(shards),
                                "--encoder", encoder, "--no-progress", "--summary-json", str(path)])
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    summary = json.loads(path.read_text())
    total = summary["seconds"]["total"]
    return {"docs": summary["docs"], "chunks": summary["chunks"], "seconds": round(total, 1),
            "docs_per_s": round(summary["docs"] / total, 1), "shards": shards}


def read_queries(path: Path, n: int) -> list[str]:
    out = []
    with open(path) as f:
        for line in f:
            out.append(json.loads(line)["text"])
            if len(out) >= n:
                break
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus.jsonl (BEIR)")
    ap.add_argument("--queries", type=Path, required=True, help="a queries.jsonl (BEIR)")
    ap.add_argument("--encoder", default="hashing:384", help="the build's encoder (default: %(default)s)")
    ap.add_argument("--shards", type=int, default=2, help="shards, one group each (default: %(default)s)")
    ap.add_argument("--cpus", type=int, default=3, help="Ray CPUs in total on each side (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=20, help="search load window (default: %(default)s)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--writes", type=int, default=40, help="writes timed for visibility (default: %(default)s)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import boto3

    from bench.object_store import use_local_s3

    s3 = use_local_s3()
    record = {"command": " ".join(["python -m bench.cluster", *(argv or sys.argv[1:])]),
              "commit": _commit(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "encoder": args.encoder,
              "shards": args.shards, "cpus": args.cpus}
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    queries = read_queries(args.queries, 300)
    try:
        boto3.client("s3").create_bucket(Bucket="bench")
        boto3.client("s3").upload_file(str(args.corpus), "bench", "corpus/corpus.jsonl")
        corpus_url = "s3://bench/corpus/corpus.jsonl"
        sides = {"one node": dict(workers=0, head_cpus=args.cpus, resources={"node_head": {"router": 1}}),
                 "head + 2 nodes": dict(workers=2, head_cpus=args.cpus - 2, cpus=1, resources=ROUTERS)}
        for side, options in sides.items():
            out = {}
            with LocalCluster(work / side.replace(" ", "-").replace("+", "and"), **options) as cluster:
                root = f"s3://bench/{'one' if options['workers'] == 0 else 'cluster'}"
                out["build"] = build(cluster, corpus_url, root, args.shards, args.encoder)
                print(side, "build", out["build"], flush=True)
                service = Service(cluster, root, cluster_config(args.shards, options["workers"] > 0), cluster.workdir)
                try:
                    out["placement"] = placement(cluster)
                    out["search"] = load(service, cluster, queries, args.seconds, args.concurrency)
                    print(side, "search", out["search"], flush=True)
                    if options["workers"]:
                        out["visibility"] = visibility(service, args.writes)
                        print(side, "visibility", {k: v for k, v in out["visibility"].items() if k != "seconds"},
                              flush=True)
                        out["node_killed"] = kill_under_load(service, cluster, f"node_{args.shards}")
                        print(side, "node killed", {k: v for k, v in out["node_killed"].items()
                                                    if k != "acked_writes"}, flush=True)
                finally:
                    service.stop()
            record[side] = out
    finally:
        s3.kill()
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items()}, indent=1)[:4000])
    return 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
