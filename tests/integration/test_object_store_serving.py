"""The service on an index root in object storage (a local S3-compatible server), from an empty node cache.

Two versions of one corpus (document ids "d..." in v1, "v2-d..." in v2) are built in a folder, published to
``s3://`` and the folder is deleted: the service can only read the store. It must answer as the version folder
answered in-process, fetch each shard replica's files once per node (a restart downloads nothing), follow an
activation made through the store, keep serving the old version when the store stops answering during a switch,
take documents through the API and fold them into the store, and refuse to start in one line when the endpoint
cannot be reached.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys

import httpx
import pytest

from deployments.edge.schemas import SearchRequest
from deployments.search.inprocess import inprocess_pipeline
from index_build.build import build_index
from index_build.config import BuildConfig
from index_build.fold import fold
from index_format import versions
from index_format.change_log import CHANGES_DIR
from index_format.object_root import CACHE_DIR_ENV, STATE_ENV, ObjectRoot, root_slug
from index_format.store import open_store
from index_format.store_log import LOG_PREFIX
from tests.conftest import make_corpus, write_jsonl
from tests.integration.conftest import ENCODER
from tests.serving import SERVE_PORT, start_serve, stop_serving
from tests.waiting import wait_until

PORT = SERVE_PORT
QUERIES = ["telescope galaxy", "bread oven butter", "boat wind anchor", "piano chord", "lucene shard replica",
           "harbor tide", "comet orbit", "recipe salt"]


@pytest.fixture(scope="module")
def published(ray_local, s3_server, tmp_path_factory):
    """(s3 URL, {version: in-process answers of its local folder}): v1 active, v2 published."""
    import boto3

    boto3.client("s3").create_bucket(Bucket="serving-test")
    url = "s3://serving-test/idx"
    folder = tmp_path_factory.mktemp("built")
    docs = make_corpus(40)
    renamed = [{**d, "_id": "v2-" + d["_id"]} for d in docs]
    expected = {}
    root = ObjectRoot(url, cache_dir=folder / "publisher-cache")
    for version, records in (("v1", docs), ("v2", renamed)):
        corpus = write_jsonl(folder / f"{version}.jsonl", records)
        summary = build_index(BuildConfig(corpus=corpus, out=folder / "index", encoder=ENCODER, shards=2, chunk_size=40,
                                          chunk_overlap=8, version=version, progress=False))
        pipeline = inprocess_pipeline({"default": summary.version_dir})
        expected[version] = {q: ids(asyncio.run(pipeline.search(SearchRequest(query=q, limit=10)))) for q in QUERIES}
        root.upload_version(summary.version_dir, version)
    root.activate("v1")
    shutil.rmtree(folder / "index")  # nothing left on disk but the store
    return url, expected


def ids(response) -> list[str]:
    body = response if isinstance(response, dict) else response.model_dump()
    return [r["chunk_id"] for r in body["results"]]


def start(url: str, cache, state, name: str = "s3") -> httpx.Client:
    from ray import serve

    from deployments.serve.app import build_app

    start_serve()
    app = build_app({"index": url, "shards": {"group_size": 1, "num_cpus": 0.1, "cache_dir": str(cache),
                                              "warmup_searches": 0},
                     "state_dir": str(state), "router": {"cache_size": 0, "version_poll_s": 0.2}})
    serve.run(app, name=name, route_prefix="/", blocking=False)
    return httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60)


def answers(client: httpx.Client) -> dict[str, list[str]]:
    out = {}
    for q in QUERIES:
        r = client.post("/search", json={"query": q, "limit": 10})
        assert r.status_code == 200, r.text
        out[q] = ids(r.json())
    return out


def blobs(cache) -> dict[str, int]:
    """The node cache's blobs and their inodes: a download replaces a blob, so a new inode means bytes moved."""
    folder = cache / "blobs"
    return {p.name: p.stat().st_ino for p in folder.iterdir()} if folder.is_dir() else {}


def test_served_from_the_store(published, tmp_path, s3_server, monkeypatch):
    from ray import serve

    url, expected = published
    cache, state = tmp_path / "cache", tmp_path / "state"
    files_v1 = ObjectRoot(url).files("v1")
    with start(url, cache, state) as client:
        assert answers(client) == expected["v1"]
        fetched = blobs(cache)
        assert set(fetched) == {f["sha256"] for f in files_v1.values()}  # each shard's files, and nothing else

        # An activation made through the store: the service follows it, fetching v2's files first.
        versions.activate(url, "v2")
        wait_until(lambda: client.get("/admin/versions").json()["collections"]["default"]["serving"] == "v2",
                   timeout_s=60, what="the switch to v2")
        assert answers(client) == expected["v2"]

        # The store stops answering during a switch back: the switch fails, v2 keeps serving.
        s3_server.stop()
        try:
            r = client.post("/admin/collections/default/activate", json={"version": "v1"})
            assert r.status_code == 503 and "s3://serving-test/idx" in r.json()["error"], r.text
            assert answers(client) == expected["v2"]
        finally:
            s3_server.start()
        versions.activate(url, "v1")
    serve.delete("s3")

    # A restart on the same node downloads nothing: every blob is the one already there.
    before = blobs(cache)
    with start(url, cache, state, name="s3-again") as client:
        wait_until(lambda: client.get("/health").status_code == 200, timeout_s=60, what="health")
        assert answers(client) == expected["v1"]
        assert blobs(cache) == before

        # Documents written through the API: acknowledged in the store's log (not on the node), searchable at once,
        # then folded into a new version in the store that uploads only the shard they touched.
        r = client.put("/collections/default/documents", json={"documents": [{"id": "new", "text": "quokka marmot"}]})
        assert r.status_code == 200, r.text
        assert open_store(url).list(LOG_PREFIX) and not (state / "roots" / root_slug(url) / CHANGES_DIR).exists()
        assert top_doc(client, "quokka") == "new"
        monkeypatch.setenv(STATE_ENV, str(state))
        monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "fold-cache"))
        summary = fold(url)
        assert ObjectRoot(url).active() == summary.version and summary.shards_changed and summary.shards_linked
        assert 0 < summary.upload["bytes_uploaded"] < summary.upload["bytes"]
        wait_until(lambda: client.get("/admin/versions").json()["collections"]["default"]["serving"] ==
                   summary.version, timeout_s=60, what="the switch to the folded version")
        assert top_doc(client, "quokka") == "new"
    stop_serving()


def top_doc(client: httpx.Client, query: str) -> str | None:
    results = client.post("/search", json={"query": query, "method": "keyword", "limit": 1}).json()["results"]
    return results[0]["doc_id"] if results else None


def test_an_unreachable_endpoint_fails_at_start_in_one_line(tmp_path):
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "RAYSEARCH_STATE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "deployments", "--index", "s3://nowhere/idx", "--port", "18299"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot read the index root s3://nowhere/idx" in lines[0], done.stderr
