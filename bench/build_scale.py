"""Build memory and throughput as the corpus grows: the driver's peak RSS, every worker's, documents/s.

Runs ``python -m index_build`` as a user would, once per corpus and per code checkout (this one, and any
``--also-code NAME=DIR`` such as a worktree of an earlier commit, in the same run), and samples every
process of the build four times a second: the driver, the Ray workers (their titles say what task or actor
they ran), the Lucene indexing JVMs and Ray's own daemons. Peak RSS is each process's VmHWM from
/proc/PID/status; as a Ray worker runs many tasks one after another, the largest VmRSS seen while it bore a
task's title (``ray::finish_dense``) is also kept per task. Throughput is documents over the build's wall time, Python start and Ray start included.

    python -m bench.build_scale --corpus bench/out/scifact-200k --corpus bench/out/scifact-1m \\
        --encoder hashing:384 --shards 4 --code before=/tmp/before --code after=/tmp/after --out bench/results/build_scale.json
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import machine, proc_status, write_record

ROOT = Path(__file__).resolve().parents[1]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_status(int(entry), ("PPid",))
            if st and "PPid" in st:
                children.setdefault(st["PPid"], []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _kind(pid: int, driver: int) -> str:
    if pid == driver:
        return "driver"
    cmd = _cmdline(pid)
    if cmd.startswith("ray::") or "default_worker.py" in cmd:
        return "worker"
    if "java" in cmd.split(" ")[0]:
        return "lucene jvm"
    return "ray daemons"


class Sampler(threading.Thread):
    """Peak RSS of every process under the driver, by kind; a worker's last title names what it ran."""

    def __init__(self, driver: int, interval: float = 0.25):
        super().__init__(daemon=True)
        self.driver, self.interval = driver, interval
        self.peaks: dict[int, dict] = {}
        self.by_task: dict[str, int] = {}  # task or actor title -> largest RSS (kB) seen while a worker ran it
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in _descendants(self.driver):
                st = proc_status(pid)
                if not st or "VmHWM" not in st:
                    continue
                seen = self.peaks.setdefault(pid, {"kind": "", "hwm_kb": 0, "titles": set()})
                seen["hwm_kb"] = max(seen["hwm_kb"], st["VmHWM"])
                if seen["kind"] in ("", "ray daemons"):  # a worker takes its ray:: title after it starts
                    seen["kind"] = _kind(pid, self.driver)
                if seen["kind"] == "worker":
                    title = _cmdline(pid).split(" ")[0]
                    seen["titles"].add(title)
                    # A worker runs many tasks; its RSS while it bears a task's title is that task's.
                    if title.startswith("ray::") and "IDLE" not in title:
                        self.by_task[title] = max(self.by_task.get(title, 0), st.get("VmRSS", 0))
            self.stop.wait(self.interval)

    def summary(self) -> dict:
        by_kind: dict[str, dict] = {}
        for p in self.peaks.values():
            k = by_kind.setdefault(p["kind"], {"processes": 0, "max_peak_mb": 0.0, "sum_peak_mb": 0.0})
            k["processes"] += 1
            k["max_peak_mb"] = max(k["max_peak_mb"], p["hwm_kb"] / 1024)
            k["sum_peak_mb"] += p["hwm_kb"] / 1024
        workers = sorted(((p["hwm_kb"] / 1024, sorted(p["titles"])) for p in self.peaks.values()
                          if p["kind"] == "worker"), reverse=True)
        return {"by_kind": by_kind, "workers": [{"peak_mb": round(mb, 1), "ran": titles} for mb, titles in workers],
                "largest_rss_mb_by_task": {t: round(kb / 1024, 1) for t, kb in
                                           sorted(self.by_task.items(), key=lambda kv: -kv[1])}}


def run_sampled(code: Path, args: list[str]) -> tuple[float, dict, str]:
    """``python -m index_build ARGS`` with the checkout ``code``, on a local Ray: its wall time, every process's peak
    memory (``Sampler.summary``) and its output; SystemExit when it fails."""
    env = dict(os.environ, PYTHONPATH=str(code), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               RAY_AUTH_MODE="disabled", OPENAI_API_KEY=os.environ.get("OPENAI_API_KEY", "unused"))
    env.pop("RAY_ADDRESS", None)
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "index_build", *args], cwd=code, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    output = proc.communicate()[0]
    wall = time.perf_counter() - t
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} with {code} failed ({proc.returncode}):\n{output[-4000:]}")
    return wall, sampler.summary(), output


def run_build(code: Path, corpus: Path, out: Path, encoder: str, shards: int, extra: list[str],
              keep: bool = False) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    wall, memory, output = run_sampled(code, ["--corpus", str(corpus), "--out", str(out), "--shards", str(shards),
                                              "--encoder", encoder, "--no-reuse", "--no-progress", *extra])
    docs = int(re.search(r"documents\s+([\d,]+)", output).group(1).replace(",", ""))
    chunks = int(re.search(r"chunks ([\d,]+)", output).group(1).replace(",", ""))
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return {"corpus": str(corpus), "documents": docs, "chunks": chunks, "wall_s": round(wall, 2),
            "documents_per_s": round(docs / wall, 1), "driver_peak_mb": round(memory["by_kind"]["driver"]["max_peak_mb"], 1),
            "memory": memory, "summary": output.strip().splitlines()[-12:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.build_scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, action="append", required=True, help="a corpus (repeat: smallest first)")
    ap.add_argument("--encoder", default="hashing:384")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                    help="a checkout to build with (repeat to compare several in one run, e.g. before=/tmp/before "
                    "after=/tmp/after, git worktrees: a checkout being edited must not be measured); default: this one")
    ap.add_argument("--build-args", default="--faiss-index flat",
                    help="more flags for every build (default: flat FAISS, the index every code compared can build)")
    ap.add_argument("--work", type=Path, default=Path("bench/out/build-scale"), help="where the indexes are built")
    ap.add_argument("--out", type=Path, default=Path("bench/results/build_scale.json"))
    ap.add_argument("--keep", action="store_true", help="keep each index built (under --work), to measure it after")
    args = ap.parse_args(argv)

    codes = [(v.split("=", 1)[0], Path(v.split("=", 1)[1]).resolve()) for v in args.code] or [("this", ROOT)]
    results = []
    for corpus in args.corpus:
        for name, code in codes:
            print(f"building {corpus} with {name} ({code}) ...", flush=True)
            r = run_build(code, corpus, args.work / f"{name}-{corpus.name}", args.encoder, args.shards,
                          args.build_args.split(), args.keep)
            r["code"] = name
            r["commit"] = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True,
                                         text=True).stdout.strip()
            results.append(r)
            worker = r["memory"]["by_kind"].get("worker", {}).get("max_peak_mb", 0)
            print(f"  {r['documents']:,} documents in {r['wall_s']} s = {r['documents_per_s']:,} documents/s; "
                  f"driver peak {r['driver_peak_mb']:,} MB, largest worker {worker:,.0f} MB", flush=True)
    body = {"machine": machine(), "encoder": args.encoder, "shards": args.shards, "build_args": args.build_args,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "results": results}
    write_record(args.out, body)
    print("\n| code | documents | wall s | documents/s | driver peak MB | largest worker MB | JVM peak MB |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        kinds = r["memory"]["by_kind"]
        print(f"| {r['code']} ({r['commit']}) | {r['documents']:,} | {r['wall_s']} | {r['documents_per_s']:,} | "
              f"{r['driver_peak_mb']:,} | {kinds.get('worker', {}).get('max_peak_mb', 0):,.0f} | "
              f"{kinds.get('lucene jvm', {}).get('max_peak_mb', 0):,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
