"""Tenants kept apart over HTTP, through Serve's proxy with keys and document ACLs on: a caller's results,
judgments and qrels hold only what it may see, and a judgment belongs to the key that made it."""

from __future__ import annotations

import httpx
import pytest

from deployments.edge.guard import new_key
from deployments.judgments import query_id
from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import write_jsonl
from tests.integration.conftest import auth, tenant_docs, visible_by_principal
from tests.serving import SERVE_PORT, start_serve, stop_serving

PORT = SERVE_PORT
T1_KEY, T1_DIGEST = new_key()
T2_KEY, T2_DIGEST = new_key()
ADMIN_KEY, ADMIN_DIGEST = new_key()


@pytest.fixture(scope="module")
def acl_version(ray_local, tmp_path_factory):
    corpus = write_jsonl(tmp_path_factory.mktemp("tenants") / "corpus.jsonl", tenant_docs())
    cfg = BuildConfig(corpus=corpus, out=tmp_path_factory.mktemp("tenants-index"), shards=2, encoder="hashing:32",
                      chunk_size=40, chunk_overlap=8, progress=False)
    return build_index(cfg).version_dir


@pytest.fixture(scope="module")
def visible(acl_version):
    return visible_by_principal(acl_version)


@pytest.fixture(scope="module")
def client(acl_version):
    from ray import serve

    from deployments.serve.app import build_app

    start_serve()
    app = build_app({"index": str(acl_version), "router": {"shard_timeout_s": 10, "cache_size": 64},
                     "security": {"key_principals": {T1_DIGEST: ["t1"], T2_DIGEST: ["t2"]},
                                  "admin_key_digests": [ADMIN_DIGEST], "acl_field": "acl"}})
    serve.run(app, name="tenants", route_prefix="/", blocking=False)
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as c:
        yield c
    stop_serving()


def test_each_tenant_finds_only_what_it_may_see(client, visible):
    for key, who in ((T1_KEY, "t1"), (T2_KEY, "t2")):
        for method in ("keyword", "vector", "hybrid"):
            r = client.post("/search", json={"query": "telescope galaxy bread piano", "method": method, "limit": 100},
                            headers=auth(key))
            assert r.status_code == 200, r.text
            docs = {x["doc_id"] for x in r.json()["results"]}
            assert docs and docs <= visible[who], (who, method, docs - visible[who])
            assert set(r.json()["citations"]) <= visible[who]


def test_judgments_belong_to_the_key_and_only_visible_documents_can_be_judged(client, visible):
    mine, theirs = sorted(visible["t1"] - visible["t2"])[0], sorted(visible["t2"] - visible["t1"])[0]
    ok = client.post("/feedback", json={"query": "tenant one", "doc_id": mine, "label": 1}, headers=auth(T1_KEY))
    assert ok.status_code == 201, ok.text
    # A document the caller may not see answers exactly like one that does not exist.
    hidden = client.post("/feedback", json={"query": "tenant one", "doc_id": theirs, "label": 1}, headers=auth(T1_KEY))
    absent = client.post("/feedback", json={"query": "tenant one", "doc_id": "nope", "label": 1}, headers=auth(T1_KEY))
    assert hidden.status_code == absent.status_code == 404
    assert hidden.json()["error"].replace(theirs, "X") == absent.json()["error"].replace("nope", "X")
    chunk_of_theirs = client.post("/feedback", json={"query": "q", "chunk_id": f"{theirs}#0", "label": 1},
                                  headers=auth(T1_KEY))
    assert chunk_of_theirs.status_code == 404
    forged = client.post("/feedback", json={"query": "tenant one", "doc_id": mine, "label": 1, "tenant": "t2"},
                         headers=auth(T1_KEY))
    assert forged.status_code == 403 and "principals" in forged.json()["error"]
    assert client.post("/feedback", json={"query": "tenant two", "doc_id": theirs, "label": 2},
                       headers=auth(T2_KEY)).status_code == 201

    def rows(key):
        r = client.get("/feedback/qrels", headers=auth(key))
        assert r.status_code == 200, r.text
        return set(r.text.splitlines()[1:])

    one, two = f"{query_id('tenant one')}\t{mine}\t1", f"{query_id('tenant two')}\t{theirs}\t2"
    assert rows(T1_KEY) == {one} and rows(T2_KEY) == {two}  # each tenant reads its own judgments only
    assert rows(ADMIN_KEY) == {one, two}
