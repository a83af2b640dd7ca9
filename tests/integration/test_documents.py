"""Documents through the API, on a served app over a real index root: upsert, get and delete by id, searchable
when the write returns, durable across a restart, and refused whole when one record is bad."""

from __future__ import annotations

import httpx
import pytest

from deployments.edge.guard import new_key
from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import make_corpus, write_jsonl
from tests.serving import SERVE_PORT, start_serve, stop_serving

PORT = SERVE_PORT
ENCODER = "hashing:64"
SEARCH_KEY, SEARCH_DIGEST = new_key()
WRITE_KEY, WRITE_DIGEST = new_key()
ADMIN_KEY, ADMIN_DIGEST = new_key()
WRITER = {"Authorization": f"Bearer {WRITE_KEY}"}


@pytest.fixture(scope="module")
def root(ray_local, tmp_path_factory):
    folder = tmp_path_factory.mktemp("documents")
    docs = make_corpus(30)
    corpus = write_jsonl(folder / "corpus.jsonl", docs)
    build_index(BuildConfig(corpus=corpus, out=folder / "index", shards=2, encoder=ENCODER, chunk_size=40,
                            chunk_overlap=8, progress=False, activate=True))
    return folder / "index", docs


def _serve(index):
    from ray import serve

    from deployments.serve.app import build_app

    app = build_app({"index": str(index), "router": {"shard_timeout_s": 10, "cache_size": 64},
                     "security": {"api_key_digests": [SEARCH_DIGEST], "write_key_digests": [WRITE_DIGEST],
                                  "admin_key_digests": [ADMIN_DIGEST]}})
    serve.run(app, name="documents", route_prefix="/", blocking=False)


@pytest.fixture(scope="module")
def served(root):
    index, docs = root
    start_serve()
    _serve(index)
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60,
                      headers={"Authorization": f"Bearer {SEARCH_KEY}"}) as client:
        yield client, index, docs
    stop_serving()


def search_ids(client, query: str, method: str = "keyword", limit: int = 10) -> list[str]:
    r = client.post("/search", json={"query": query, "method": method, "limit": limit})
    assert r.status_code == 200, r.text
    return [x["doc_id"] for x in r.json()["results"]]


def test_an_upserted_document_is_searchable_and_readable_when_the_write_returns(served):
    client, _, _ = served
    record = {"id": "new-1", "title": "Quasar notes", "text": "zyxwvut quasar jets observed " * 3,
              "metadata": {"year": 2031}}
    r = client.put("/collections/default/documents", json={"documents": [record]}, headers=WRITER)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["upserted"] == 1 and body["searchable"] and body["seq"] >= 1
    assert search_ids(client, "zyxwvut")[0] == "new-1"
    assert search_ids(client, "zyxwvut quasar", method="hybrid")[0] == "new-1"
    assert "new-1" in search_ids(client, "zyxwvut", method="vector", limit=100)
    got = client.get("/collections/default/documents/new-1")
    assert got.status_code == 200, got.text
    doc = got.json()
    assert (doc["source"], doc["seq"], doc["title"], doc["metadata"]) == ("api", body["seq"], "Quasar notes",
                                                                           {"year": 2031})
    assert doc["text"] == record["text"].strip() and doc["chunk_ids"][0] == "new-1#0"
    filtered = client.post("/search", json={"query": "zyxwvut", "method": "keyword", "filters": {"year": 2031}})
    assert [x["doc_id"] for x in filtered.json()["results"]] == ["new-1"]  # a field only fresh documents have


def test_a_replaced_or_deleted_document_is_never_answered_from_the_version(served):
    client, _, docs = served
    old = docs[5]
    before = client.get(f"/collections/default/documents/{old['_id']}").json()
    assert before["source"] == "index" and before["text"] == old["text"]  # put back together from its chunks
    assert old["_id"] in search_ids(client, old["text"], limit=30)
    r = client.put("/collections/default/documents", headers=WRITER,
                   json={"documents": [{"id": old["_id"], "text": "replaced by the ocelot memo"}]})
    assert r.status_code == 200, r.text
    hits = client.post("/search", json={"query": old["text"], "method": "keyword", "limit": 50}).json()["results"]
    assert all(x["content"] == "replaced by the ocelot memo" for x in hits if x["doc_id"] == old["_id"])
    assert search_ids(client, "ocelot memo")[0] == old["_id"]
    gone = docs[6]["_id"]
    r = client.delete(f"/collections/default/documents/{gone}", headers=WRITER)
    assert r.status_code == 200 and r.json()["deleted"] == 1, r.text
    assert client.get(f"/collections/default/documents/{gone}").status_code == 404
    assert gone not in search_ids(client, docs[6]["text"], limit=50)
    assert gone not in search_ids(client, docs[6]["text"], method="vector", limit=50)
    again = client.delete(f"/collections/default/documents/{gone}", headers=WRITER)
    assert again.status_code == 404 and "nothing was deleted" in again.json()["error"]


def test_a_page_after_a_write_is_served_from_the_first_pages_point_in_time_with_groups_and_highlights(served):
    """A write after the first page does not reach the next: it is ranked at the first page's point in time (the
    same answer as before the write); the served JSON carries groups and highlight spans."""
    client, _, _ = served
    body = {"query": "telescope galaxy star", "limit": 2, "group_by": "doc_id", "group_size": 2, "highlights": True}
    first = client.post("/search", json=body)
    assert first.status_code == 200, first.text
    page = first.json()
    assert len({x["doc_id"] for x in page["results"]}) == len(page["results"]) == 2
    for x in page["results"]:
        assert x["group"]["key"] == x["doc_id"] and x["highlights"]
        assert {x["content"][s["start"]:s["end"]].lower() for s in x["highlights"]} <= {"telescope", "galaxy", "star"}
    before = client.post("/search", json=body | {"cursor": page["next_cursor"]})
    assert before.status_code == 200, before.text
    r = client.put("/collections/default/documents", headers=WRITER,
                   json={"documents": [{"id": "paged-1", "text": "telescope galaxy star notes"}]})
    assert r.status_code == 200, r.text
    after = client.post("/search", json=body | {"cursor": page["next_cursor"]})
    assert after.status_code == 200, after.text
    assert after.json()["results"] == before.json()["results"]
    assert "paged-1" in {x["doc_id"] for x in client.post("/search", json=body | {"limit": 20}).json()["results"]}


def test_documents_listed_by_a_filter_page_by_page_each_as_its_get_answers_it(served):
    """POST .../documents/list over HTTP: a written document among the version's, each page's documents equal to
    what GET answers for them, the count, and a 422 naming a field the collection does not hold."""
    client, _, _ = served
    r = client.put("/collections/default/documents", headers=WRITER,
                   json={"documents": [{"id": "listed-1", "text": "a listed note", "metadata": {"year": 2005}}]})
    assert r.status_code == 200, r.text
    listed, after = [], None
    while True:
        page = client.post("/collections/default/documents/list",
                           json={"filters": {"year": {"gte": 2005, "lt": 2010}}, "limit": 4, "after": after})
        assert page.status_code == 200, page.text
        body = page.json()
        listed += body["documents"]
        if body["next_after"] is None:
            break
        after = body["next_after"]
    assert len(listed) == body["total"] > 4 and "listed-1" in {d["id"] for d in listed}
    assert [d["id"] for d in listed] == sorted(d["id"] for d in listed)
    for d in listed:
        assert 2005 <= d["metadata"]["year"] < 2010
        assert client.get(f"/collections/default/documents/{d['id']}").json() == d
    r = client.post("/collections/default/documents/list", json={"filters": {"colour": "red"}})
    assert r.status_code == 422 and "colour" in r.json()["error"], r.text
    assert client.post("/collections/nope/documents/list", json={}).status_code == 404


def test_bad_writes_are_refused_whole_with_the_record_and_field_named(served):
    client, _, _ = served
    r = client.put("/collections/default/documents", json={"documents": [{"id": "x-1", "text": "fine"}]})
    assert r.status_code == 403 and "write_key_digests" in r.json()["error"]  # a search key never writes
    r = client.put("/collections/default/documents", headers=WRITER,
                   json={"documents": [{"id": "ok-1", "text": "fine"}, {"id": "bad-1", "text": 7}]})
    assert r.status_code == 422 and "documents[1]" in r.json()["error"] and "text" in r.json()["error"], r.text
    assert client.get("/collections/default/documents/ok-1").status_code == 404  # nothing of the batch applied
    r = client.put("/collections/default/documents", headers=WRITER,
                   json={"documents": [{"id": "twice", "text": "a"}, {"id": "twice", "text": "b"}]})
    assert r.status_code == 422 and "given twice" in r.json()["error"]
    r = client.put("/collections/default/documents", headers=WRITER, json={"documents": [{"text": "no id"}]})
    assert r.status_code == 422 and "missing id" in r.json()["error"]
    r = client.put("/collections/nope/documents", headers=WRITER, json={"documents": [{"id": "a", "text": "b"}]})
    assert r.status_code == 404
    r = client.post("/collections/default/documents/delete", headers=WRITER, json={"ids": ["d000", "no-such-doc"]})
    assert r.status_code == 404 and client.get("/collections/default/documents/d000").status_code == 200
    r = client.put("/collections/default/documents", headers=WRITER, json={"documents": []})
    assert r.status_code == 422


def test_acknowledged_writes_survive_a_restart(served):
    from ray import serve

    client, index, _ = served
    r = client.put("/collections/default/documents", headers=WRITER,
                   json={"documents": [{"id": f"kept-{i}", "text": f"persisted marmoset record {i}"} for i in range(3)]})
    assert r.status_code == 200, r.text
    serve.delete("documents")
    _serve(index)  # a new replica: it reads the change log before it answers
    assert sorted(search_ids(client, "marmoset"))[:3] == ["kept-0", "kept-1", "kept-2"]
    assert client.get("/collections/default/documents/kept-1").json()["seq"] == r.json()["seq"]
    assert client.get("/collections/default/documents/new-1").json()["source"] == "api"

