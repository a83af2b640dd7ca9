"""Shard groups that follow their load: under a steady load a group's replicas grow to the most its autoscaling
allows, and as the load falls they shrink back to the fewest, drained, every answer whole throughout."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import make_corpus, write_jsonl
from tests.waiting import wait_until

PORT = 18263
APP = "autoscaled"
GROUP = "default-shard-000"


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    from ray import serve

    from deployments.serve.app import build_app

    folder = tmp_path_factory.mktemp("autoscaling")
    corpus = write_jsonl(folder / "corpus.jsonl", make_corpus(30))
    build_index(BuildConfig(corpus=corpus, out=folder / "index", shards=2, encoder="hashing:64", chunk_size=40,
                            chunk_overlap=8, progress=False))
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    app = build_app({"index": str(folder / "index"),
                     "router": {"num_cpus": 0.1, "cache_size": 0, "shard_timeout_s": 20},
                     "shards": {"group_size": 1, "num_cpus": 0.1, "warmup_searches": 0, "lucene_heap": "128m",
                                "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 0.5,
                                                "upscale_delay_s": 1, "downscale_delay_s": 3}}})
    serve.run(app, name=APP, route_prefix="/", blocking=False)
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as client:
        wait_until(lambda: client.get("/health").status_code == 200, timeout_s=120, what="the app to answer",
                   every_s=0.5)
        yield client
    serve.delete(APP)
    serve.shutdown()


def running(deployment: str) -> int:
    from ray import serve

    states = serve.status().applications[APP].deployments[deployment].replica_states
    return int(states.get("RUNNING", 0))


def test_a_groups_replicas_grow_under_load_and_shrink_drained_as_it_falls(served):
    """Six clients: the group grows to two replicas. Then one client goes on while it shrinks back to one: the replica
    let go takes no new request and finishes those it has (Serve's graceful shutdown), and a call whose replica went
    away is sent again to the other (``handles.call_with_retry``): every answer whole throughout."""
    assert running(GROUP) == 1
    heavy, light, answers = threading.Event(), threading.Event(), []

    def load(until: threading.Event) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as c:
            while not until.is_set():
                r = c.post("/search", json={"query": "alpha beta gamma", "limit": 5})
                answers.append((r.status_code, r.json().get("partial") if r.status_code == 200 else r.text))

    threads = [threading.Thread(target=load, args=(heavy,)) for _ in range(5)]
    threads.append(threading.Thread(target=load, args=(light,)))
    for t in threads:
        t.start()
    try:
        wait_until(lambda: running(GROUP) == 2, timeout_s=90, what=f"{GROUP} to grow to 2 replicas under load",
                   every_s=0.5)
        grown_at = len(answers)
        time.sleep(3)  # served by both for a while
        heavy.set()  # the load falls to one client, which goes on while the group shrinks
        wait_until(lambda: running(GROUP) == 1, timeout_s=90, what=f"{GROUP} to shrink back to 1 replica",
                   every_s=0.5)
        shrunk_at = len(answers)
        time.sleep(2)
    finally:
        heavy.set()
        light.set()
        for t in threads:
            t.join()
    assert grown_at < shrunk_at < len(answers)  # answers while two served, while one was let go, and after
    assert {status for status, _ in answers} == {200}, [a for a in answers if a[0] != 200][:3]
    assert not any(partial for _, partial in answers)
