"""Shared pieces of the benchmarks: machine description, BEIR loading, a served app's life cycle."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OPENAI_API_KEY", "unused")

# A reranker as python -m deployments deployed one before its flags came from the config (whose defaults reserve
# one CPU a replica and give it one torch thread): the benches that serve one keep measuring the same thing.
RERANKER_CPUS = ["--reranker.num-cpus", "0.25", "--reranker.threads", str(os.cpu_count())]


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "git_sha": sha,
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}


def load_beir(folder: Path, split: str = "test") -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """(queries of the split, qrels) from a BEIR folder; only queries that have judgments."""
    from relevance.qrels import read_qrels

    qrels = read_qrels(folder / "qrels" / f"{split}.tsv")
    queries = {}
    with open(folder / "queries.jsonl") as f:
        for line in f:
            q = json.loads(line)
            if q["_id"] in qrels:
                queries[q["_id"]] = q["text"]
    return queries, qrels


def proc_status(pid: int, keys: tuple[str, ...] = ("VmHWM", "VmRSS")) -> dict[str, int]:
    """Fields of ``/proc/<pid>/status`` (memory fields in kB, as the kernel writes them); empty once the process is
    gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    fields = (line.partition(":") for line in lines)
    return {name: int(value.split()[0]) for name, _, value in fields if name in keys}


def write_record(path: Path, record: dict) -> None:
    """A bench's JSON record, written where it was asked for (folders made as needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2))


def percentile_ms(sorted_seconds: list[float], q: float) -> float | None:
    """The q-quantile (0-1) of ascending latencies in seconds, in ms; None when there are none."""
    if not sorted_seconds:
        return None
    return round(1000 * sorted_seconds[int(q * (len(sorted_seconds) - 1))], 1)


@contextmanager
def served(index: Path, port: int, extra: list[str] | None = None, startup_s: float = 300):
    """``python -m deployments`` in a child process, until the block ends; yields the base URL."""
    cmd = [sys.executable, "-m", "deployments", "--index", str(index), "--port", str(port), *(extra or [])]
    with service_process(cmd, port, startup_s) as base:
        yield base


@contextmanager
def service_process(cmd: list[str], port: int, startup_s: float = 300, env: dict[str, str] | None = None):
    """Any HTTP service started by ``cmd`` (with ``env`` over this process's environment), once its ``/health``
    answers 200; stopped when the block ends. Yields the base URL (``started_service`` yields the process too)."""
    with started_service(cmd, port, startup_s, env) as started:
        yield started.base


@dataclass(frozen=True)
class Started:
    base: str  # http://127.0.0.1:PORT
    process: subprocess.Popen


@contextmanager
def started_service(cmd: list[str], port: int, startup_s: float = 300, env: dict[str, str] | None = None,
                    cwd: Path | None = None):
    """``service_process``, yielding the base URL and the service's process (to read its CPU and memory); ``cwd``:
    where it runs (a ``python -m`` command imports that folder's packages first)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=None if env is None else os.environ | env, cwd=cwd)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"service on {base} not healthy after {startup_s}s")
            time.sleep(1)
        yield Started(base, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


class ClosedLoop:
    """Clients that each send one request after another until stopped (``with ClosedLoop(...) as load``).

    ``request(client, rng)`` sends one request and returns what to keep for it; an ``httpx.HTTPError``
    (no HTTP answer at all) is kept as ``on_error(error, seconds)``. Every kept item is appended to
    ``answers`` with the start time (``time.monotonic()``) and the latency in seconds.
    """

    def __init__(self, base: str, clients: int, request, on_error=None, timeout_s: float = 60):
        import random
        import threading

        self.base, self.request, self.timeout_s = base, request, timeout_s
        self.on_error = on_error or (lambda error, seconds: {"status": -1, "error": type(error).__name__})
        self.answers: list[tuple[float, float, object]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(random.Random(i),)) for i in range(clients)]

    def _run(self, rng) -> None:
        with httpx.Client(base_url=self.base, timeout=self.timeout_s) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    kept = self.request(client, rng)
                except httpx.HTTPError as e:
                    kept = self.on_error(e, time.monotonic() - started)
                self.answers.append((started, time.monotonic() - started, kept))

    def __enter__(self) -> ClosedLoop:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def service_bench_parser(name: str, doc: str | None, port: int):
    """The arguments every bench that serves an index under load takes: --index, --data, --dataset,
    --port and --out (default bench/out/NAME.json)."""
    import argparse

    ap = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="index root or version folder to serve")
    ap.add_argument("--data", type=Path, required=True, help="folder holding BEIR datasets")
    ap.add_argument("--dataset", default="scifact")
    ap.add_argument("--port", type=int, default=port)
    ap.add_argument("--out", type=Path, default=Path(f"bench/out/{name}.json"))
    return ap
