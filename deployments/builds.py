"""Builds and folds started through the API, run as jobs beside the service: each one a ``python -m index_build``
(or ``python -m index_build.fold``) process joined to the service's Ray cluster, never inside a serving process.

A ``BuildRunner`` starts the command, follows its progress bars (the stage and how far it is) and keeps the job's
record, ``builds/<id>.json`` in the index root's store (a folder's file, or an object beside the versions in object
storage: never one node's disk), written anew as it moves: state (``running``, ``succeeded``, ``failed``), progress,
the build's summary at the end (the JSON it writes with ``--summary-json``), the tail of its output when it fails.
Any router replica, on any node, answers ``GET /admin/builds/{id}`` from that record, so a job is visible wherever
it was started from, and after the runner is gone. The job's output and summary files are the runner's own, on its
node (``state_dir``). The runner lives in one detached Ray actor
(``deployments.serve.builds``), so a job outlives the replica that asked for it. Should that actor die (Ray
restarts it, with no memory of its jobs), the records it was following would say ``running`` forever: so the
runner renews a running record's ``alive`` time every ``ALIVE_EVERY_S``, and a record past ``STALE_S`` without
it is read, and written back, as ``failed``, saying why.

A second build of a root whose build is running is refused (``Conflict``), as ``index_build`` itself refuses
it (``index_format.versions.build_lock``): the runner tries that lock before it starts anything.
"""

from __future__ import annotations

import calendar
import contextlib
import fcntl
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from deployments.errors import Conflict, InvalidField, NotFound
from index_format.versions import open_root, state_dir

BUILDS_DIR = "builds"  # beside the versions in an index root: <root>/builds/<id>.json, <id>.log
RECORD_EVERY_S = 1.0  # how often a running job's record is written while its progress moves
ALIVE_EVERY_S = 10.0  # a running job's record is written at least this often, its ``alive`` time renewed
STALE_S = 60.0  # a record still "running" whose ``alive`` time is older than this has lost its runner
OUTPUT_TAIL = 4000  # characters of a failed job's output kept in its record
_PROGRESS = re.compile(r"(?P<stage>[\w+ ]+):\s+(?P<pct>\d+)%\|[^|]*\|\s*(?P<done>\d+)/(?P<total>\d+)")
_ID = re.compile(r"^[a-z]+-[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}$")


def read_progress(text: str) -> dict[str, Any] | None:
    """The last progress bar line of a build's output: {"stage", "done", "total", "percent"}, or None."""
    last = None
    for line in re.split(r"[\r\n]", text):
        m = _PROGRESS.search(line)
        if m:
            last = {"stage": m["stage"].strip(), "done": int(m["done"]), "total": int(m["total"]),
                    "percent": int(m["pct"])}
    return last


def _record_key(job_id: str) -> str:
    if not _ID.match(job_id):
        raise NotFound(f"no build {job_id!r}")
    return f"{BUILDS_DIR}/{job_id}.json"


def write_record(record: dict[str, Any], root: str | Path | None = None) -> None:
    """The job's record into its root's store (``root``, else the record's; one writer: its runner; a put is atomic
    for every reader)."""
    open_root(root or record["root"]).store.put(_record_key(record["id"]), json.dumps(record, indent=2).encode())


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def settled(record: dict[str, Any], root: str | Path | None = None, now: float | None = None) -> dict[str, Any]:
    """The record as it stands: one still ``running`` whose runner has not renewed it for ``STALE_S`` is ``failed``
    (and, read from ``root``, written back there, so every reader sees the same from then on)."""
    if record.get("state") != "running":
        return record
    now = time.time() if now is None else now
    seen = record.get("alive") or record.get("started")
    try:
        seen_at = calendar.timegm(time.strptime(seen, "%Y-%m-%dT%H:%M:%SZ"))
    except (TypeError, ValueError):
        return record
    if now - seen_at <= STALE_S:
        return record
    record = {**record, "state": "failed", "finished": _iso(now),
              "error": f"the build supervisor stopped following this job (last seen running at {seen}): its actor was "
                       "restarted or its node was lost. Its process may have gone on without it: GET /admin/versions "
                       "says whether it published a version, and a new build of the root is refused while that "
                       "process still holds the root's build lock."}
    if root is not None:
        with contextlib.suppress(OSError):  # a read-only view of the root: the answer is the same, only not kept
            write_record(record, root)
    return record


def read_record(roots: list[str], job_id: str) -> dict[str, Any]:
    """A job's record, looked up in these index roots."""
    key = _record_key(job_id)
    for root in roots:
        data, _ = open_root(root).store.get_tagged(key)
        if data is not None:
            return settled(json.loads(data), root)
    raise NotFound(f"no build {job_id!r}")


def list_records(roots: list[str], limit: int = 50) -> list[dict[str, Any]]:
    """The latest jobs of these roots, newest first."""
    out = []
    for root in roots:
        store = open_root(root).store
        for key in store.list(f"{BUILDS_DIR}/"):
            if not _ID.match(key.rsplit("/", 1)[-1].removesuffix(".json")) or not key.endswith(".json"):
                continue  # a job's output or summary, on the runner's node (a folder root: this folder)
            data, _ = store.get_tagged(key)
            if data is None:
                continue  # removed this instant
            try:
                out.append(settled(json.loads(data), root))
            except ValueError:
                continue
    return sorted(out, key=lambda r: r.get("started", ""), reverse=True)[:limit]


def root_is_building(root: str | Path) -> str | None:
    """Who holds the root's build lock (``build_lock``), or None when no build or fold is writing into it."""
    lock = state_dir(root) / ".build.lock"
    if not lock.exists():
        return None
    fd = os.open(lock, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def command_for(kind: str, root: str | Path, options: dict[str, Any], summary: Path) -> list[str]:
    """The job's command line: ``index_build`` with ``--out ROOT`` and one flag per option, or the fold."""
    if kind == "fold":
        cmd = [sys.executable, "-m", "index_build.fold", "--index", str(root)]
    elif kind == "build":
        cmd = [sys.executable, "-m", "index_build", "--out", str(root)]
    else:
        raise InvalidField(f"kind: expected build or fold, got {kind!r}")
    for name, value in options.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            cmd.append(flag if value else f"--no-{name.replace('_', '-')}")
        else:
            cmd += [flag, str(value)]
    return cmd + ["--summary-json", str(summary)]


class BuildRunner:
    """Starts jobs and follows them to the end, one thread each; one runner per cluster (its actor)."""

    def __init__(self):
        self.running: dict[str, str] = {}  # root -> the id of its job still running
        self._lock = threading.Lock()

    def start(self, root: str, kind: str, options: dict[str, Any], by: str | None = None,
              collection: str | None = None) -> dict[str, Any]:
        """Start a build or fold of ``root``; its record (``state: running``). Refused when one is writing there."""
        with self._lock:
            if root in self.running:
                raise Conflict(f"build {self.running[root]} is still running in {root}; wait for it, or follow it at "
                               f"GET /admin/builds/{self.running[root]}")
            holder = root_is_building(root)
            if holder is not None:
                raise Conflict(f"another build is writing into {root} ({holder}); wait for it to finish")
            job_id = f"{kind}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"
            folder = state_dir(root) / BUILDS_DIR
            folder.mkdir(parents=True, exist_ok=True)
            summary = folder / f"{job_id}.summary.json"
            cmd = command_for(kind, root, options, summary)
            now = _iso(time.time())
            record = {"id": job_id, "kind": kind, "collection": collection, "root": root, "options": options,
                      "command": cmd[1:], "state": "running", "started": now, "alive": now, "finished": None,
                      "progress": None, "summary": None, "error": None, "by": by}
            log = open(folder / f"{job_id}.log", "wb")  # noqa: SIM115 - the job's thread closes it
            env = dict(os.environ)
            env.setdefault("RAY_ADDRESS", _cluster_address())
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=_code_root())
            record["pid"] = proc.pid
            write_record(record)
            self.running[root] = job_id
        threading.Thread(target=self._follow, args=(record, proc, log, summary), daemon=True,
                         name=f"build-{job_id}").start()
        return record

    def _follow(self, record: dict, proc: subprocess.Popen, log, summary: Path) -> None:
        log_path = state_dir(record["root"]) / BUILDS_DIR / f"{record['id']}.log"
        written = time.time()
        try:
            while proc.poll() is None:
                time.sleep(RECORD_EVERY_S)
                progress = read_progress(_tail(log_path, 20_000))
                if progress != record["progress"] or time.time() - written >= ALIVE_EVERY_S:
                    record["progress"], record["alive"] = progress, _iso(time.time())
                    write_record(record)
                    written = time.time()
            log.close()
            output = _tail(log_path, 200_000)
            record["progress"] = read_progress(output) or record["progress"]
            record["returncode"] = proc.returncode
            if proc.returncode == 0:
                record["state"] = "succeeded"
                if summary.is_file():
                    record["summary"] = json.loads(summary.read_text())
                    summary.unlink()
            else:
                record["state"] = "failed"
                record["error"] = output[-OUTPUT_TAIL:].strip()
        except Exception as e:  # noqa: BLE001 - a record must never stay "running" for a job that ended
            record["state"], record["error"] = "failed", f"following the job failed: {e}"
        finally:
            record["finished"] = record["alive"] = _iso(time.time())
            write_record(record)
            with self._lock:
                if self.running.get(record["root"]) == record["id"]:
                    del self.running[record["root"]]


def _tail(path: Path, size: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _cluster_address() -> str:
    """The Ray cluster this process belongs to, for the job to join (its GCS address)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - no Ray here: the job starts its own
        pass
    return ""


def _code_root() -> str:
    """The folder holding the project's packages, so ``python -m index_build`` finds them from any worker."""
    return str(Path(__file__).resolve().parent.parent)
