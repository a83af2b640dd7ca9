"""``python -m deployments`` as a user runs it: its own Ray, the router answering on --port itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

PORT = 8791


@pytest.fixture(scope="module")
def service(built):
    _, summary = built[3]
    root = Path(__file__).parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "deployments", "--index", str(summary.version_dir), "--port",
                             str(PORT), "--no-cache", "--max-inflight", "2"], cwd=root, env=os.environ | {"PYTHONPATH": str(root)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{PORT}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail(f"python -m deployments did not come up: {proc.stdout.read()[-3000:]}")
    yield base, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)


def test_the_router_answers_on_the_port_itself(service):
    base, _ = service
    health = httpx.get(f"{base}/health").json()
    assert [s["shard"] for s in health["shards"]] == ["shard-000", "shard-001", "shard-002"]
    assert all(s["ok"] for s in health["shards"])
    r = httpx.post(f"{base}/search", json={"query": "telescope galaxy", "limit": 5})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert len(body["results"]) == 5 and body["coverage"]["shards_asked"] == 3 and not body["coverage"]["degraded"]
    # One process serves the request: the router replica embeds the query and searches the 3 shards itself
    # (shard_placement auto with one shard replica), and Serve's proxy is not on the request path.
    import psutil

    names = {" ".join(p.info["cmdline"] or [])[:80] for p in psutil.process_iter(["cmdline"])}
    replicas = {n for n in names if "ServeReplica:raysearch:" in n}
    assert replicas and all("ServeReplica:raysearch:router" in n for n in replicas), replicas


def test_the_excess_is_refused_before_serve_handles_it(service):
    """Past --max-inflight a search is refused (503 + Retry-After) by the layer ahead of Serve's request handling
    (deployments.serve.shedding): Serve's own layer, which tags every response it handles with an
    x-request-id, never saw the refused requests."""
    import asyncio

    base, _ = service

    async def burst():
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            return await asyncio.gather(*(client.post("/search", json={"query": f"telescope galaxy {i}", "limit": 100})
                                          for i in range(24)))

    answers = asyncio.run(burst())
    shed = [r for r in answers if r.status_code == 503]
    assert shed and {r.status_code for r in answers} == {200, 503}
    assert all(r.headers["Retry-After"] == "1" and "overloaded" in r.json()["error"] for r in shed)
    assert all("x-request-id" not in r.headers for r in shed)
    assert all("x-request-id" in r.headers for r in answers if r.status_code == 200)
    assert httpx.get(f"{base}/health").status_code == 200


def test_sigterm_stops_it(service):
    _, proc = service
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=90)
    assert code == 0, proc.stdout.read()[-3000:]
