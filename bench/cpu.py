"""CPU accounting for serving benches: the machine's busy time, the load generator's own, per process.

Server CPU per request = (machine busy CPU - this process's CPU) / answered requests, over the same
interval: everything the service costs (replicas, the HTTP proxy, Ray's controller, raylet and GCS)
counts, and the load generator does not. ``by_process`` splits the same interval by process name.
"""

from __future__ import annotations

import os
from pathlib import Path

JIFFY_S = 1 / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) * JIFFY_S


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def process_label(cmdline: list[str], name: str) -> str:
    """``ray::ServeReplica:raysearch:router`` -> ``replica router``; raylet, gcs_server, ... as named."""
    first = cmdline[0] if cmdline else name
    if first.startswith("ray::ServeReplica:"):
        return "replica " + first.rsplit(":", 1)[-1].split()[0]
    if first.startswith("ray::"):
        return first.split()[0][5:]
    if "python" in os.path.basename(first) and len(cmdline) > 2 and cmdline[1] == "-m":
        return f"python -m {cmdline[2]}"
    return os.path.basename(first) or name


def process_cpu() -> dict[int, tuple[str, float]]:
    """pid -> (label, user+system CPU seconds so far) of every process but this one."""
    import psutil

    me = os.getpid()
    out = {}
    for p in psutil.process_iter(["pid", "name", "cmdline", "cpu_times"]):
        info = p.info
        if info["pid"] == me or info["cpu_times"] is None:
            continue
        t = info["cpu_times"]
        out[info["pid"]] = (process_label(info["cmdline"] or [], info["name"] or "?"), t.user + t.system)
    return out


def by_process(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per process label between two ``process_cpu`` snapshots (largest first)."""
    totals: dict[str, float] = {}
    for pid, (label, cpu) in after.items():
        spent = cpu - before.get(pid, (label, 0.0))[1]
        if spent > 0:
            totals[label] = totals.get(label, 0.0) + spent
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def pid_of(label: str) -> int | None:
    """The pid of the process ``process_label`` names ``label`` (the first found), None where there is none."""
    import psutil

    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        if process_label(p.info["cmdline"] or [], p.info["name"] or "?") == label:
            return p.info["pid"]
    return None


def cpu_by_thread(pid: int | None) -> dict[str, float]:
    """CPU seconds so far of each of a process's threads, by their system name with a pool's ``_N`` dropped
    (``query-encoder_0`` and ``_1`` together: the encoder); empty where ``/proc`` does not tell."""
    out: dict[str, float] = {}
    if pid is None:
        return out
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        task = Path(f"/proc/{pid}/task/{tid}")
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        stem, _, index = name.rpartition("_")
        name = stem if stem and index.isdigit() else name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) * JIFFY_S
    return out


def threads_cpu_s(*names: str) -> float | None:
    """CPU seconds this process's threads whose name holds one of ``names`` have spent so far (the JVM's
    ``C2 CompilerThread``, ``GC Thread#0``, ``G1 Refine#0``, ...), None where ``/proc`` does not tell. Process CPU
    counts them: a JVM still compiling a path, or collecting what a path left, bills the searches of the moment."""
    spent = cpu_by_thread(os.getpid())
    if not spent:
        return None
    return sum(cpu for name, cpu in spent.items() if any(n in name for n in names))
