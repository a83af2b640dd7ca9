"""A collection's shard groups scaled together (Serve's application-level policy,
``deployments.serve.autoscale:groups_together``, deployed from a config as ``serve run`` or ``python -m deployments``
does): Serve runs the policy, and under load both groups grow, then shrink drained as the load falls, every answer
whole throughout. (Which replica counts the policy gives, group by group: tests/unit/test_autoscale_together.py. A
group alone growing onto another node under load: tests/integration/test_cluster.py.)"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import make_corpus, write_jsonl
from tests.serving import SERVE_PORT, start_serve, stop_serving
from tests.waiting import wait_until

PORT = SERVE_PORT
APP = "together"
GROUPS = ("default-shard-000", "default-shard-001")


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    from deployments.serve.autoscale import POLICY
    from deployments.settings import deploy_app

    folder = tmp_path_factory.mktemp("autoscaling")
    corpus = write_jsonl(folder / "corpus.jsonl", make_corpus(30))
    build_index(BuildConfig(corpus=corpus, out=folder / "index", shards=2, encoder="hashing:64", chunk_size=40,
                            chunk_overlap=8, progress=False))
    start_serve()
    deploy_app({"index": str(folder / "index"),
                "router": {"num_cpus": 0.1, "cache_size": 0, "shard_timeout_s": 20},
                "shards": {"group_size": 1, "num_cpus": 0.1, "warmup_searches": 0, "lucene_heap": "128m",
                           "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 0.5,
                                           "upscale_delay_s": 1, "downscale_delay_s": 3}}},
               APP, timeout_s=300, autoscaling_policy={"policy_function": POLICY})
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as client:
        wait_until(lambda: client.get("/health").status_code == 200, timeout_s=120, what="the app to answer",
                   every_s=0.5)
        yield client
    stop_serving()


def running(deployment: str) -> int:
    from ray import serve

    states = serve.status().applications[APP].deployments[deployment].replica_states
    return int(states.get("RUNNING", 0))


def test_the_groups_grow_under_load_and_shrink_drained_as_it_falls_with_the_policy_serve_runs(served):
    from ray.serve.context import _connect

    from deployments.serve.autoscale import POLICY

    deployed = _connect().get_serve_details()["applications"][APP]["deployed_app_config"]
    assert deployed["autoscaling_policy"]["policy_function"] == POLICY
    # At rest, one replica a group (a replica slow to start on a busy machine can make Serve count a request or two
    # as the deploy settles and grow a group for a moment).
    wait_until(lambda: [running(g) for g in GROUPS] == [1, 1], timeout_s=60, what="both groups at rest at 1",
               every_s=0.5)
    heavy, light, answers = threading.Event(), threading.Event(), []

    def load(until: threading.Event) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as c:
            while not until.is_set():
                r = c.post("/search", json={"query": "alpha beta gamma", "limit": 5})
                answers.append((r.status_code, r.json()["coverage"]["ratio"] if r.status_code == 200 else r.text))

    threads = [threading.Thread(target=load, args=(heavy,)) for _ in range(5)]
    threads.append(threading.Thread(target=load, args=(light,)))
    for t in threads:
        t.start()
    try:
        wait_until(lambda: all(running(g) == 2 for g in GROUPS), timeout_s=120, what="both groups to grow to 2",
                   every_s=0.5)
        grown_at = len(answers)
        time.sleep(3)  # served by both for a while
        heavy.set()  # the load falls to one client, which goes on while the groups shrink
        wait_until(lambda: all(running(g) == 1 for g in GROUPS), timeout_s=120, what="both groups to shrink to 1",
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
    assert all(ratio == 1.0 for _, ratio in answers)
