"""Build job records (``deployments.builds``): progress read from a job's bars, and a record whose supervisor is
gone reported as failed rather than running forever."""

from __future__ import annotations

import json
import time

from deployments.builds import BUILDS_DIR, STALE_S, list_records, read_progress, read_record, settled


def _record(job_id: str, state: str, alive: float) -> dict:
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(alive))
    return {"id": job_id, "kind": "build", "root": "/r", "state": state, "started": at, "alive": at,
            "finished": None, "progress": None, "summary": None, "error": None}


def test_progress_is_the_last_bar_of_the_output():
    out = "Read: 100%|#####| 5/5 [00:01]\rEmbed:  40%|##   | 40/100 [00:03<00:05]\rEmbed:  50%|###  | 50/100"
    assert read_progress(out) == {"stage": "Embed", "done": 50, "total": 100, "percent": 50}
    assert read_progress("no bars here") is None


def test_a_running_record_left_by_a_gone_supervisor_reads_as_failed_and_is_written_back(tmp_path):
    folder = tmp_path / BUILDS_DIR
    folder.mkdir()
    now = time.time()
    lost = _record("build-20261126T090000Z-aaaaaa", "running", now - STALE_S - 5)
    alive = _record("build-20261126T090100Z-bbbbbb", "running", now - 2)
    done = _record("fold-20261126T080000Z-cccccc", "succeeded", now - 3600)
    for r in (lost, alive, done):
        (folder / f"{r['id']}.json").write_text(json.dumps(r))

    got = read_record([tmp_path], lost["id"])
    assert got["state"] == "failed" and "stopped following" in got["error"] and got["finished"]
    assert json.loads((folder / f"{lost['id']}.json").read_text())["state"] == "failed"  # kept for every reader
    assert read_record([tmp_path], alive["id"])["state"] == "running"
    assert read_record([tmp_path], done["id"]) == done  # an ended job is never touched, however old
    states = {r["id"]: r["state"] for r in list_records([tmp_path])}
    assert states == {lost["id"]: "failed", alive["id"]: "running", done["id"]: "succeeded"}


def test_the_bound_is_measured_from_the_last_sign_of_life():
    now = time.time()
    record = _record("build-20261126T090000Z-dddddd", "running", now - 3 * STALE_S)
    record["alive"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 10))  # renewed: started long ago
    assert settled(record, now=now)["state"] == "running"
    assert settled(record, now=now + STALE_S)["state"] == "failed"
