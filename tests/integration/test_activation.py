"""Activating another index version in a running application, under load, over HTTP.

Two versions of one corpus are built into one index root; their document ids differ ("d..." in v1,
"v2-d..." in v2), so a response that mixed versions would show it. Clients search without pause while
the admin API switches to v2 and the versions CLI rolls back to v1; every response must be a 200 whose
results all come from the one version it names.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from deployments.edge.guard import new_key
from index_build.add_encoder import add_encoder
from index_build.build import build_index
from index_build.config import BuildConfig
from index_format.versions import active_version, rollback
from tests.conftest import make_corpus, write_jsonl
from tests.integration.conftest import ENCODER
from tests.serving import SERVE_PORT, start_serve, stop_serving
from tests.waiting import wait_until

PORT = SERVE_PORT
ADMIN_KEY, ADMIN_DIGEST = new_key()
USER_KEY, USER_DIGEST = new_key()
QUERIES = ["telescope galaxy", "bread oven butter", "boat wind anchor", "piano chord", "lucene shard replica"]


def _version_of(doc_id: str) -> str:
    return "v2" if doc_id.startswith("v2-") else "v1"


@pytest.fixture(scope="module")
def root(ray_local, tmp_path_factory):
    folder = tmp_path_factory.mktemp("activation")
    docs = make_corpus(40)
    renamed = [{**d, "_id": "v2-" + d["_id"]} for d in docs]
    common = {"out": folder / "index", "encoder": ENCODER, "chunk_size": 40, "chunk_overlap": 8, "progress": False}
    for version, records, shards, active in (("v1", docs, 2, True), ("v2", renamed, 2, False),
                                              ("v3-three-shards", docs, 3, False), ("v4-one-shard", renamed, 1, False)):
        corpus = write_jsonl(folder / f"{version}.jsonl", records)
        build_index(BuildConfig(corpus=corpus, shards=shards, version=version, activate=active, **common))
    # v1 with a named encoder the app is not deployed with: a running app cannot embed queries for it
    add_encoder(folder / "index", "small", "hashing:16", base="v1", version="v5-named", do_activate=False,
                progress=False)
    return folder / "index"


# Shards in deployments (2 replicas each, which Serve's multiplexing keeps versions on), and in the router (`make
# test-slow`; the default placement, auto, holds one replica's shards in the router, and test_builds_api switches
# versions there).
@pytest.fixture(scope="module", params=[{"shards": {"num_replicas": 2, "num_cpus": 0.1}},
                                        pytest.param({"shards": {"placement": "router"}}, marks=pytest.mark.slow)],
                ids=["deployment", "router"])
def served(root, request):
    from ray import serve

    from deployments.serve.app import build_app

    start_serve()
    app = build_app({
        "index": str(root), **request.param,
        "router": {"shard_timeout_s": 10, "cache_size": 0, "version_poll_s": 0.2},
        "security": {"api_key_digests": [USER_DIGEST], "admin_key_digests": [ADMIN_DIGEST]},
    })
    serve.run(app, name="activation", route_prefix="/", blocking=False)
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60,
                      headers={"Authorization": f"Bearer {USER_KEY}"}) as client:
        yield client
    stop_serving()


class Load:
    """Clients searching without pause; every response kept with the times its request started and ended."""

    def __init__(self, clients: int = 3):
        self.seen: list[tuple[float, float, int, str | None, set[str]]] = []
        self.answered = threading.Condition()  # notified at each answer: the test waits for answers, not time
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]

    def _run(self, i: int) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60,
                          headers={"Authorization": f"Bearer {USER_KEY}"}) as client:
            n = i
            while not self.stop.is_set():
                started = time.monotonic()
                r = client.post("/search", json={"query": QUERIES[n % len(QUERIES)], "limit": 10})
                n += 1
                body = r.json() if r.status_code == 200 else {}
                with self.answered:
                    self.seen.append((started, time.monotonic(), r.status_code,
                                      body.get("index_version", {}).get("default"),
                                      {_version_of(x["doc_id"]) for x in body.get("results", [])}))
                    self.answered.notify_all()

    def wait_answers(self, more: int, timeout_s: float = 60) -> None:
        """Until ``more`` requests have been answered after this call."""
        with self.answered:
            target = len(self.seen) + more
            assert self.answered.wait_for(lambda: len(self.seen) >= target, timeout_s), "the load stopped answering"

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def _wait_serving(client, version: str, timeout_s: float = 30) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    wait_until(lambda: client.get("/admin/versions", headers=admin).json()["collections"]["default"]["serving"]
               == version, timeout_s, f"{version} served", every_s=0.1)


def test_admin_routes_need_an_admin_key(served):
    client = served
    assert client.get("/admin/versions", headers={"Authorization": ""}).status_code == 401
    r = client.post("/admin/collections/default/activate", json={"version": "v2"})  # a search key
    assert r.status_code == 403 and "admin_key_digests" in r.json()["error"]
    state = client.get("/admin/versions", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert state["collections"]["default"]["serving"] == "v1"
    assert state["collections"]["default"]["published"] == ["v1", "v2", "v3-three-shards", "v4-one-shard",
                                                                   "v5-named"]


def test_refused_activations_say_why_and_change_nothing(served, root):
    client = served
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    r = client.post("/admin/collections/default/activate", json={"version": "v3-three-shards"}, headers=admin)
    assert r.status_code == 409 and "3 shards" in r.json()["error"] and "redeploy" in r.json()["error"]
    r = client.post("/admin/collections/default/activate", json={"version": "v5-named"}, headers=admin)
    assert r.status_code == 409 and "holds the encoder 'small'" in r.json()["error"], r.text
    assert "redeploy" in r.json()["error"]
    r = client.post("/admin/collections/default/activate", json={"version": "v9"}, headers=admin)
    assert r.status_code == 404 and "published: v1, v2" in r.json()["error"]
    assert client.post("/admin/collections/default/activate", json={"version": "../../etc"},
                       headers=admin).status_code == 422
    assert client.post("/admin/collections/nope/activate", json={"version": "v2"}, headers=admin).status_code == 404
    assert active_version(root) == "v1"
    assert client.post("/search", json={"query": "telescope"}).json()["index_version"] == {"default": "v1"}


def test_activate_and_roll_back_under_load_without_errors_or_mixed_responses(served, root):
    client = served
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with Load() as load:
        load.wait_answers(10)  # the load is under way before the switch
        r = client.post("/admin/collections/default/activate", json={"version": "v2"}, headers=admin)
        switched = time.monotonic()
        assert r.status_code == 200, r.text
        assert r.json()["previous"] == "v1" and r.json()["version"] == "v2"
        assert active_version(root) == "v2"
        load.wait_answers(10)  # answers on v2 before the rollback
        cli_at = time.monotonic()
        was, now = rollback(root)  # the CLI's way: only the ACTIVE file changes; the router follows it
        assert (was, now) == ("v2", "v1")
        _wait_serving(client, "v1")
        rolled_back = time.monotonic()
        load.wait_answers(10)  # answers after the rollback
    seen = load.seen
    assert len(seen) > 30
    assert [s for s in seen if s[2] != 200] == []
    for *_, version, from_versions in seen:
        assert from_versions <= {version}, f"a response named {version} but held results of {from_versions}"
    # One router replica: a request that starts after the switch returned is on the new version. Only those
    # answered before the CLI's rollback can be held to it: one still in flight then may be searched after
    # the router followed the rollback (within version_poll_s), and rightly on v1.
    assert {v for t, end, _, v, _ in seen if switched < t and end < cli_at} == {"v2"}
    assert {v for t, _, _, v, _ in seen if t > rolled_back} == {"v1"}
    assert {v for *_, v, _ in seen} == {"v1", "v2"}


def test_a_version_with_fewer_shards_is_served_by_the_first_slots(served, root):
    client = served
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    r = client.post("/admin/collections/default/activate", json={"version": "v4-one-shard"}, headers=admin)
    assert r.status_code == 200, r.text
    body = client.post("/search", json={"query": "telescope galaxy", "limit": 5}).json()
    assert body["index_version"] == {"default": "v4-one-shard"} and body["coverage"]["shards_asked"] == 1
    assert body["results"] and all(x["doc_id"].startswith("v2-") for x in body["results"])
    r = client.post("/admin/collections/default/rollback", headers=admin)
    assert r.status_code == 200 and r.json()["version"] == "v1"
    assert active_version(root) == "v1"


def test_routers_follow_the_ranking_model_pointer(served, root, tmp_path):
    """A ranking model activated under the root orders every router's searches within ``version_poll_s``, and
    turning it off restores the plain order. The model is made by hand to score a chunk by its shortness, so the
    order it must give is known: chunks by their length, shortest first."""
    import json

    import lightgbm
    import numpy as np

    from deployments.search.learned import FEATURES
    from index_format.rankers import activate_ranker, publish_ranker

    client = served
    _wait_serving(client, "v1")
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 60, size=(400, len(FEATURES)))
    length = FEATURES.index("length")
    labels = np.digitize(-x[:, length], np.quantile(-x[:, length], [0.5, 0.8, 0.95]))
    booster = lightgbm.train({"objective": "lambdarank", "verbose": -1, "min_data_in_leaf": 5},
                             lightgbm.Dataset(x, labels, group=[40] * 10, feature_name=list(FEATURES)), 30)
    folder = tmp_path / "shortest-first"
    folder.mkdir()
    (folder / "model.txt").write_text(booster.model_to_string())
    (folder / "ranker.json").write_text(json.dumps({"id": "shortest-first", "features": list(FEATURES)}))
    publish_ranker(root, folder)
    hand_made = {"model": "shortest-first", "served": None, "queries": 1, "model_ndcg": 1.0, "served_ndcg": 0.0,
                 "guard": {"accept": True, "why": "hand-made for this test"}}
    activate_ranker(root, "shortest-first", hand_made)
    try:
        body = {"query": "telescope galaxy orbit", "limit": 10}
        ranked = wait_until(lambda: (r := client.post("/search", json=body).json()).get("ranking_model") and r,
                            30, "the router to follow the ranking model", every_s=0.1)
        assert ranked["ranking_model"] == "shortest-first" and not ranked["reranked"]
        lengths = [len(r["content"].split()) for r in ranked["results"]]
        assert lengths == sorted(lengths), lengths
        plain = client.post("/search", json=body | {"ranking_model": False}).json()
        assert plain.get("ranking_model") is None
        assert [r["chunk_id"] for r in plain["results"]] != [r["chunk_id"] for r in ranked["results"]]
        # A model reading the length alone reads no postings: its features are computed without the hop to the
        # shards' index thread once the lengths were read (``ShardHost.features``), and still order by length.
        alone = lightgbm.train({"objective": "lambdarank", "verbose": -1, "min_data_in_leaf": 5},
                               lightgbm.Dataset(x[:, [length]], labels, group=[40] * 10, feature_name=["length"]), 30)
        folder = tmp_path / "length-alone"
        folder.mkdir()
        (folder / "model.txt").write_text(alone.model_to_string())
        (folder / "ranker.json").write_text(json.dumps({"id": "length-alone", "features": ["length"]}))
        publish_ranker(root, folder)
        activate_ranker(root, "length-alone", hand_made | {"model": "length-alone", "served": "shortest-first"})
        wait_until(lambda: client.post("/search", json=body).json().get("ranking_model") == "length-alone", 30,
                   "the router to follow the second model", every_s=0.1)
        for _ in range(2):
            again = client.post("/search", json=body).json()
            assert again["ranking_model"] == "length-alone" and not again.get("warnings"), again.get("warnings")
            lengths = [len(r["content"].split()) for r in again["results"]]
            assert lengths == sorted(lengths), lengths
    finally:
        activate_ranker(root, None, None)
    wait_until(lambda: client.post("/search", json=body).json().get("ranking_model") is None, 30,
               "the router to drop the ranking model", every_s=0.1)
