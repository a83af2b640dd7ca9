"""A Ray cluster of nodes that share no disk, on one machine: the multi-node tests' and benchmarks' harness.

A head node and worker nodes, each started with ``ray start --block`` in its own process group. Every worker runs
in its own mount namespace (``unshare --mount``) with a private tmpfs mounted over ``private``: the folder where
each node keeps what is its own (the index cache, the state volume, Ray's temp dir, a build's staging), at the same
path on every node, as pods of one image see it. So no node can read what another wrote there: a task that relies
on a shared disk fails here as it would on Kubernetes. The head keeps the machine's own folder at that path (the
driver, a test or a benchmark process, runs on the head node and must see the head's Ray sockets). Only a store
reached over the network (an S3-compatible server on loopback) is shared.

Each node gets its own custom resource (``node_head``, ``node_1``, ...; ``resources`` adds more), so a test places
a deployment on a chosen node by asking for it. ``kill(i)`` kills a worker node as a machine failure does (SIGKILL
to its process group: raylet, workers, actors); ``stop()`` ends everything, never touching another Ray on the
machine (``ray stop`` would).

Linux only, as root (``unshare`` and ``mount``); ``available()`` says whether this machine can run it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTED = "Ray runtime started"  # what ``ray start`` prints once its node is up
NODE_ENV = {"RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "OPENAI_API_KEY": "unused", "RAY_USAGE_STATS_ENABLED": "0",
            # Every node of this cluster shares one machine's cores (two, in CI): while replicas start their JVMs, a
            # proxy missed Serve's 5 s readiness check three times and Serve killed it, with the connections it
            # held (a client's ReadError mid-search). Read by Serve's controller, from its node's environment.
            "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",
            # `ray start --block` drains its node for up to 30 s on SIGTERM (so that a Kubernetes pod's Serve proxy
            # stops taking requests before its replicas go). Here a node gets SIGTERM only when the whole cluster
            # stops, with nothing to hand over: each stop waited out its 15 s bound.
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


def available() -> str | None:
    """None when this machine can start private-disk nodes, else why not."""
    if sys.platform != "linux":
        return "needs Linux mount namespaces"
    if os.geteuid() != 0:
        return "needs root for unshare --mount and mount -t tmpfs"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    name: str
    resources: dict[str, float]
    proc: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class LocalCluster:
    """``workers`` worker nodes beside the head, ``cpus`` CPUs each; ``private``: the per-node folder (made)."""

    workdir: Path
    workers: int = 2
    cpus: float = 1
    head_cpus: float = 1
    resources: dict[str, dict[str, float]] = field(default_factory=dict)  # node name -> extra custom resources
    env: dict[str, str] = field(default_factory=dict)
    object_store_bytes: int = 150 << 20
    nodes: list[Node] = field(default_factory=list)
    port: int = 0

    def __post_init__(self):
        import tempfile

        self.workdir = Path(self.workdir)
        self.logs = self.workdir / "logs"
        # Ray's socket paths must stay under 108 bytes: the temp dirs and the private folder live in a short path.
        self.short = Path(tempfile.mkdtemp(prefix="rsc-", dir="/tmp"))
        self.private = self.short / "p"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def node_env(self) -> dict[str, str]:
        """What every node's processes (and so their tasks and actors) see: the private folder's places."""
        return os.environ | NODE_ENV | {
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "RAYSEARCH_CACHE": str(self.private / "cache"), "RAYSEARCH_STATE": str(self.private / "state"),
        } | self.env

    def start(self, timeout_s: float = 120) -> LocalCluster:
        why = available()
        if why:
            raise RuntimeError(f"a local cluster of private-disk nodes {why}")
        self.private.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        ray = str(Path(sys.executable).with_name("ray"))
        head = Node("node_head", {"node_head": 1} | self.resources.get("node_head", {}))
        self._spawn(head, [ray, "start", "--head", f"--port={self.port}", f"--num-cpus={self.head_cpus}",
                           f"--resources={json.dumps(head.resources)}", "--include-dashboard=false",
                           f"--temp-dir={self.short / 'h'}", "--block", "--disable-usage-stats",
                           f"--object-store-memory={self.object_store_bytes}"])
        self._wait_nodes(1, timeout_s)
        for i in range(1, self.workers + 1):
            self._start_worker(Node(f"node_{i}", {f"node_{i}": 1} | self.resources.get(f"node_{i}", {})))
        self._wait_nodes(1 + self.workers, timeout_s)
        return self

    def _start_worker(self, node: Node) -> None:
        ray = str(Path(sys.executable).with_name("ray"))
        start = " ".join(_quote(a) for a in [
            ray, "start", f"--address={self.address}", f"--num-cpus={self.cpus}", "--block", "--disable-usage-stats",
            f"--object-store-memory={self.object_store_bytes}", f"--resources={json.dumps(node.resources)}",
            f"--temp-dir={self.private / 'ray'}"])
        # Its own tmpfs over the private folder, seen by no other node; Ray's temp dir inside it.
        script = f"mount -t tmpfs -o size=4g tmpfs {_quote(str(self.private))} && exec {start}"
        self._spawn(node, ["unshare", "--mount", "--propagation", "private", "sh", "-c", script])

    def add(self, name: str, resources: dict[str, float] | None = None, timeout_s: float = 120) -> None:
        """A worker node joins (as an autoscaler adds a pod): its own name as a resource, and ``resources``."""
        self._start_worker(Node(name, {name: 1} | (resources or {})))
        self._wait_nodes(len(self.nodes), timeout_s)

    def node_id(self, name: str) -> str:
        """Ray's id of the live node named ``name``."""
        return next(n["id"] for n in self.alive_nodes() if name in n["resources"])

    def restart(self, name: str, timeout_s: float = 120) -> None:
        """A lost worker node comes back (as Kubernetes restarts a pod): same name and resources, an empty disk."""
        old = next(n for n in self.nodes if n.name == name)
        _kill_group(old.proc, signal.SIGKILL)
        self.nodes.remove(old)
        self._start_worker(Node(old.name, old.resources))
        self._wait_nodes(len(self.nodes), timeout_s)

    def _spawn(self, node: Node, argv: list[str]) -> None:
        node.log = self.logs / f"{node.name}.log"
        with open(node.log, "ab") as log:
            node.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.node_env(),
                                         cwd=self.workdir, start_new_session=True)
        self.nodes.append(node)

    def alive_nodes(self, timeout_s: float = 120) -> list[dict]:
        """The cluster's live nodes as Ray's GCS lists them (asked from a child process, which may join any Ray)."""
        code = (f"import json, ray; ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False); "
                "print(json.dumps([{'id': n['NodeID'], 'resources': n['Resources']} for n in ray.nodes() "
                "if n['Alive']]))")
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=self.node_env(),
                                 timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return []
        if out.returncode != 0:
            return []
        return json.loads(out.stdout.strip().splitlines()[-1])

    def _wait_nodes(self, n: int, timeout_s: float) -> None:
        """Until every node's ``ray start`` says its node is up, then until the GCS lists ``n`` live nodes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [node for node in self.nodes if not node.alive]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited: {dead[0].log.read_text()[-2000:]}")
            if all(STARTED in node.log.read_text(errors="replace") for node in self.nodes):
                break
            time.sleep(0.5)
        while time.monotonic() < deadline:
            if len(self.alive_nodes(max(10.0, deadline - time.monotonic()))) >= n:
                return
            time.sleep(1)
        raise TimeoutError(f"{n} nodes not up after {timeout_s:.0f}s; logs in {self.logs}")

    def kill(self, name: str) -> None:
        """A node lost: SIGKILL to its whole process group (its raylet, its workers and actors)."""
        node = next(n for n in self.nodes if n.name == name)
        _kill_group(node.proc, signal.SIGKILL)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            _kill_group(node.proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for node in self.nodes:
            while node.alive and time.monotonic() < deadline:
                time.sleep(0.2)
            _kill_group(node.proc, signal.SIGKILL)
        self.nodes.clear()
        shutil.rmtree(self.short, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _kill_group(proc: subprocess.Popen | None, sig: int) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    if sig == signal.SIGKILL:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.local_cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="worker nodes beside the head (default: %(default)s)")
    ap.add_argument("--cpus", type=float, default=1, help="Ray CPUs of each worker node (default: %(default)s)")
    ap.add_argument("--head-cpus", type=float, default=1, help="Ray CPUs of the head (default: %(default)s)")
    ap.add_argument("--resources", default="{}", help='extra custom resources by node, as JSON: '
                    '\'{"node_head": {"router": 1}, "node_1": {"router": 1}}\'')
    ap.add_argument("--workdir", type=Path, default=Path("local-cluster"), help="logs go here (default: %(default)s)")
    args = ap.parse_args(argv)
    cluster = LocalCluster(args.workdir, workers=args.workers, cpus=args.cpus, head_cpus=args.head_cpus,
                           resources=json.loads(args.resources))
    cluster.start()
    print(f"cluster up: head and {args.workers} worker nodes, each worker with a private {cluster.private}")
    print(f"  export RAY_ADDRESS={cluster.address}   # then python -m index_build / python -m deployments --via-proxy")
    print(f"  logs in {cluster.logs}; Ctrl-C stops every node")
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
