"""Builds and folds through the API, on a served app over a real index root: POST /admin/builds starts
``python -m index_build`` or ``python -m index_build.fold`` as a job beside the service, GET /admin/builds/{id}
follows it to its summary; a fold's version is served with the fresh segment emptied of what it holds, while
searches running across the switch always find the written document, once."""

from __future__ import annotations

import threading

import httpx
import pytest

from deployments.edge.guard import new_key
from index_build.build import build_index
from index_build.config import BuildConfig
from index_format.change_log import CHANGES_DIR, ChangeLog
from tests.conftest import make_corpus, write_jsonl
from tests.serving import SERVE_PORT, start_serve, stop_serving
from tests.waiting import wait_until

PORT = SERVE_PORT
ENCODER = "hashing:64"
SEARCH_KEY, SEARCH_DIGEST = new_key()
ADMIN_KEY, ADMIN_DIGEST = new_key()
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    from ray import serve

    from deployments.serve.app import build_app

    folder = tmp_path_factory.mktemp("builds")
    corpus = write_jsonl(folder / "corpus.jsonl", make_corpus(40))
    build_index(BuildConfig(corpus=corpus, out=folder / "index", shards=2, encoder=ENCODER, chunk_size=40,
                            chunk_overlap=8, progress=False, version="v1"))
    start_serve()
    app = build_app({"index": str(folder / "index"), "router": {"shard_timeout_s": 10, "version_poll_s": 0.2,
                                                                "fold_after_documents": 3, "fold_after_s": 0},
                     "security": {"api_key_digests": [SEARCH_DIGEST], "admin_key_digests": [ADMIN_DIGEST]}})
    serve.run(app, name="builds", route_prefix="/", blocking=False)
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60, headers=ADMIN) as client:
        yield client, folder
    stop_serving()


def _wait_for_job(client, job_id: str, timeout_s: float = 180) -> dict:
    def finished() -> dict | None:
        r = client.get(f"/admin/builds/{job_id}")
        assert r.status_code == 200, r.text
        return r.json() if r.json()["state"] != "running" else None

    return wait_until(finished, timeout_s, f"build {job_id} finished", every_s=0.3)


def _serving(client) -> str:
    return client.get("/admin/versions").json()["collections"]["default"]["serving"]


def _wait_serving(client, version: str, timeout_s: float = 60) -> None:
    wait_until(lambda: _serving(client) == version, timeout_s, f"{version} served", every_s=0.2)


def _answer(client, query: str) -> tuple[str, list[str]]:
    """(the version that answered, the documents found)."""
    r = client.post("/search", json={"query": query, "method": "keyword", "limit": 10})
    assert r.status_code == 200, r.text
    return r.json()["index_version"]["default"], [x["doc_id"] for x in r.json()["results"]]


def _hits(client, query: str) -> list[str]:
    return _answer(client, query)[1]


def test_a_fold_through_the_api_serves_the_writes_from_the_new_version_and_loses_none_across_the_switch(served):
    client, _ = served
    record = {"id": "w-1", "title": "Quokka notes", "text": "qwertyuiop quokka island survey " * 3, "metadata": {}}
    assert client.put("/collections/default/documents", json={"documents": [record]}).status_code == 200
    assert client.get("/collections/default/documents/w-1").json()["source"] == "api"

    seen: list[tuple[str, list[str]]] = []  # (the version that answered, its hits), one per search
    stop = threading.Event()

    def search_meanwhile():
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60,
                          headers={"Authorization": f"Bearer {SEARCH_KEY}"}) as searcher:
            while not stop.is_set():
                seen.append(_answer(searcher, "qwertyuiop quokka"))

    thread = threading.Thread(target=search_meanwhile)
    thread.start()
    try:
        wait_until(lambda: seen, 30, "a search answered before the fold")
        r = client.post("/admin/builds", json={"kind": "fold"})
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["state"] == "running" and job["kind"] == "fold" and job["collection"] == "default"
        again = client.post("/admin/builds", json={"kind": "fold"})  # one build or fold of a root at a time
        assert again.status_code == 409 and job["id"] in again.json()["error"], again.text
        done = _wait_for_job(client, job["id"])
        assert done["state"] == "succeeded", done["error"]
        summary = done["summary"]
        assert summary["log_seq"] == 1 and summary["upserted"] == 1 and summary["activated"]
        _wait_serving(client, summary["version"])
        wait_until(lambda: sum(version == summary["version"] for version, _ in seen) >= 3, 30,
                   f"3 searches answered by the new version {summary['version']}")
    finally:
        stop.set()
        thread.join()
    assert {version for version, _ in seen} == {"v1", summary["version"]}  # searches ran across the switch
    assert all(hits.count("w-1") == 1 and hits[0] == "w-1" for _, hits in seen)
    doc = client.get("/collections/default/documents/w-1").json()
    assert doc["source"] == "index" and doc["chunk_ids"] == ["w-1#0"]  # the version holds it; the segment let go
    listed = client.get("/admin/builds").json()["builds"]
    assert listed[0]["id"] == job["id"]


def test_a_build_through_the_api_reports_its_summary_and_bad_requests_are_4xx(served):
    client, folder = served
    corpus = write_jsonl(folder / "more.jsonl", make_corpus(12, seed=3))
    r = client.post("/admin/builds", json={"corpus": str(corpus), "version": "v-api", "activate": False,
                                           "shards": 2, "encoder": ENCODER, "chunk_size": 40, "chunk_overlap": 8})
    assert r.status_code == 202, r.text
    done = _wait_for_job(client, r.json()["id"])
    assert done["state"] == "succeeded", done["error"]
    assert done["summary"]["version"] == "v-api" and done["summary"]["docs"] == 12 and not done["summary"]["active"]
    assert done["progress"] is None or done["progress"]["done"] <= done["progress"]["total"]

    failing = client.post("/admin/builds", json={"corpus": str(corpus), "encoder": "hashing:64", "shards": 2,
                                                 "chunk_size": 40, "chunk_overlap": 80})
    assert failing.status_code == 202
    failed = _wait_for_job(client, failing.json()["id"])
    assert failed["state"] == "failed" and "chunk" in failed["error"]  # the job's own check, its words kept

    assert client.post("/admin/builds", json={"corpus": "/no/such/corpus"}).status_code == 422
    assert client.post("/admin/builds", json={}).status_code == 422
    assert client.post("/admin/builds", json={"kind": "fold", "shards": 2}).status_code == 422
    assert client.post("/admin/builds", json={"kind": "merge"}).status_code == 422
    assert client.post("/admin/builds", json={"collection": "nope", "kind": "fold"}).status_code == 404
    assert client.get("/admin/builds/build-20260101T000000Z-abcdef").status_code == 404
    assert client.get("/admin/builds/..%2F..%2Fetc").status_code == 404
    searcher = {"Authorization": f"Bearer {SEARCH_KEY}"}
    assert client.post("/admin/builds", json={"kind": "fold"}, headers=searcher).status_code == 403


def _auto_folds(client) -> list[dict]:
    return [j for j in client.get("/admin/builds").json()["builds"] if j["by"] == "auto"]


def test_a_replica_folds_on_its_own_once_its_segment_holds_fold_after_documents(served):
    client, folder = served
    serving = _serving(client)
    records = [{"id": f"auto-{i}", "title": "", "text": f"zxcvbnm{i} auto fold words", "metadata": {}} for i in range(3)]
    assert client.put("/collections/default/documents", json={"documents": records[:2]}).status_code == 200
    # Two documents held, fewer than router.fold_after_documents: the replica's watcher goes round and starts no
    # fold. Each round reads the log first, then decides on a fold: two changes of another writer (as a second
    # replica's would be, rewriting auto-1), the second read after the first, mean a whole round saw two documents.
    log = ChangeLog(folder / "index" / CHANGES_DIR)
    for text in ("zxcvbnm1 written again", "zxcvbnm1 written a third time"):
        seq = log.append([records[1] | {"text": text}], [])[0].seq
        wait_until(lambda seq=seq: client.get("/collections/default/documents/auto-1").json()["seq"] == seq, 30,
                   f"the replica reading another writer's change {seq}")
    assert _auto_folds(client) == [] and _serving(client) == serving
    assert client.put("/collections/default/documents", json={"documents": records[2:]}).status_code == 200
    job = wait_until(lambda: next((j for j in _auto_folds(client) if j["state"] != "running"), None), 120,
                     "a fold the replica started itself (by: auto) finished", every_s=0.3)
    assert job["state"] == "succeeded" and job["kind"] == "fold" and len(_auto_folds(client)) == 1, job
    _wait_serving(client, job["summary"]["version"])
    for record in records:
        assert client.get(f"/collections/default/documents/{record['id']}").json()["source"] == "index"
    assert _hits(client, "zxcvbnm2")[0] == "auto-2"
