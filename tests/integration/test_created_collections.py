"""Collections created through the API on a served app: ``POST /admin/collections`` starts a build job under
``collections_root``, and the router serves the new collection once its version is active, without a redeploy:
searched, listed, written to, served again by a restarted app; the same from LangChain's ``from_texts``. Refusals:
a search key, a name taken or malformed, a bad record, and a service without a collections root."""

from __future__ import annotations

import httpx
import pytest
from raysearch_client import SearchClient
from raysearch_client import langchain as rs_langchain
from raysearch_client import llamaindex as rs_llamaindex

from deployments.edge.guard import new_key
from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import make_corpus, write_jsonl
from tests.serving import SERVE_PORT, start_serve, stop_serving

PORT = SERVE_PORT
URL = f"http://127.0.0.1:{PORT}"
ENCODER = "hashing:64"
SEARCH_KEY, SEARCH_DIGEST = new_key()
ADMIN_KEY, ADMIN_DIGEST = new_key()

NOTES = [{"id": f"n{i:02d}", "title": f"note {i}", "text": text, "metadata": {"year": 2020 + i % 3}}
         for i, text in enumerate(["the okapi lives in the ituri forest", "a quokka smiles on rottnest island",
                                   "the axolotl regrows its limbs", "pangolins roll into a ball",
                                   "the narwhal tusk is a tooth"])]


def _serve(folder):
    from ray import serve

    from deployments.serve.app import build_app

    # The configured collection's shards in a deployment of their own (its listing goes through a Serve handle);
    # created ones are always held in the router.
    app = build_app({"index": str(folder / "index"), "collections_root": str(folder / "created"),
                     "shards": {"placement": "deployment"},
                     "router": {"shard_timeout_s": 10, "version_poll_s": 0.2},
                     "security": {"api_key_digests": [SEARCH_DIGEST], "admin_key_digests": [ADMIN_DIGEST]}})
    serve.run(app, name="created", route_prefix="/", blocking=False)


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    folder = tmp_path_factory.mktemp("created")
    build_index(BuildConfig(corpus=write_jsonl(folder / "corpus.jsonl", make_corpus(20)), out=folder / "index",
                            shards=1, encoder=ENCODER, progress=False))
    start_serve()
    _serve(folder)
    with SearchClient(URL, api_key=ADMIN_KEY, timeout=60) as client:
        yield client, folder
    stop_serving()


def names(client: SearchClient) -> set[str]:
    return {c.name for c in client.collections()}


def test_a_collection_created_from_documents_is_built_and_served_without_a_redeploy(served):
    client, folder = served
    created = client.create_collection("notes", NOTES, timeout_s=600)
    assert created.build.state == "succeeded" and created.build.collection == "notes"
    assert created.root == str(folder / "created" / "notes")
    assert {"default", "notes"} <= names(client)
    hits = client.search("quokka island", collections=["notes"], method="keyword").results
    assert hits[0].doc_id == "n01"
    listed = list(client.documents("notes"))
    assert [(d.id, d.text, d.metadata) for d in listed] == [(n["id"], n["text"], n["metadata"]) for n in NOTES]
    written = client.upsert_documents("notes", [{"id": "n99", "text": "the kakapo is a flightless parrot"}])
    assert written.searchable
    assert client.search("kakapo parrot", collections=["notes"], method="keyword").results[0].doc_id == "n99"
    assert client.count_documents("notes") == len(NOTES) + 1
    configured = client.list_documents("default", filters={"year": {"gte": 2010}}, limit=3)
    assert configured.total == 10 and [d.id for d in configured.documents] == ["d010", "d011", "d012"]


def test_a_restarted_app_serves_the_created_collections_from_its_start(served):
    from ray import serve

    client, folder = served
    assert "notes" in names(client)
    serve.delete("created")
    _serve(folder)
    with SearchClient(URL, api_key=ADMIN_KEY, timeout=60) as fresh:
        for _ in range(600):
            try:
                fresh.health()
                break
            except Exception:  # noqa: BLE001 - starting
                import time

                time.sleep(0.2)
        assert "notes" in names(fresh)  # opened before the replica answered
        assert fresh.get_document("notes", "n99").source == "api"  # its writes too


def test_langchain_from_texts_creates_its_collection_through_a_build(served):
    store = rs_langchain.RaySearchVectorStore.from_texts(
        ["the okapi lives in the forest", "the axolotl regrows its limbs"], metadatas=[{"kind": "mammal"},
                                                                                  {"kind": "amphibian"}],
        ids=["okapi", "axolotl"], url=URL, collection="animals", api_key=ADMIN_KEY)
    found = store.similarity_search("axolotl limbs", k=1)
    assert [d.id for d in found] == ["axolotl"] and found[0].metadata == {"kind": "amphibian"}
    store.add_texts(["pangolins roll up"], ids=["pangolin"])  # the collection exists: a write, no second build
    assert {d.id for d in store.get_by_ids(["okapi", "pangolin"])} == {"okapi", "pangolin"}


def test_llamaindex_from_documents_creates_its_collection_through_a_build(served):
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding

    store = rs_llamaindex.RaySearchVectorStore(URL, collection="llama", api_key=ADMIN_KEY)
    docs = [Document(id_="okapi", text="the okapi lives in the forest"),
            Document(id_="axolotl", text="the axolotl regrows its limbs")]
    # The embed model is LlamaIndex's requirement of an index, never asked for a query (the service embeds).
    index = VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=store),
                                            embed_model=MockEmbedding(embed_dim=1))
    found = index.as_retriever(similarity_top_k=1).retrieve("axolotl limbs")
    assert [n.node.ref_doc_id for n in found] == ["axolotl"]
    client, _ = served
    assert "llama" in names(client)


def test_a_haystack_writer_creates_its_store_s_collection_through_a_build(served):
    from haystack import Document, Pipeline
    from haystack.components.writers import DocumentWriter
    from raysearch_client.haystack import RaySearchDocumentStore

    store = RaySearchDocumentStore(url=URL, collection="hay", api_key=ADMIN_KEY)
    pipeline = Pipeline()
    pipeline.add_component("writer", DocumentWriter(store))
    docs = [Document(id="narwhal", content="the narwhal tusk is a tooth", meta={"sea": "arctic"})]
    assert pipeline.run({"writer": {"documents": docs}})["writer"]["documents_written"] == 1
    assert [(d.id, d.content, d.meta) for d in store.filter_documents()] == [("narwhal", docs[0].content,
                                                                            {"sea": "arctic"})]
    assert store.write_documents([Document(id="beluga", content="belugas sing")]) == 1  # served: a write


def test_creating_is_refused_with_a_reason(served):
    client, folder = served
    with httpx.Client(base_url=URL, timeout=60) as http:
        body = {"name": "more", "documents": [{"id": "a", "text": "b"}]}
        r = http.post("/admin/collections", json=body, headers={"Authorization": f"Bearer {SEARCH_KEY}"})
        assert r.status_code == 403, r.text
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        for name, says in [("default", "exists"), ("notes", "exists")]:
            r = http.post("/admin/collections", json=body | {"name": name}, headers=admin)
            assert r.status_code == 409 and says in r.json()["error"], r.text
        r = http.post("/admin/collections", json=body | {"name": "../up"}, headers=admin)
        assert r.status_code == 422 and "name" in r.text
        r = http.post("/admin/collections", json={"name": "bad", "documents": [{"id": "x", "text": 3}]}, headers=admin)
        assert r.status_code == 422 and "documents[0]" in r.json()["error"], r.text
        assert "bad" not in names(client)
        assert not (folder / "created" / ".collections" / "bad.json").exists()  # the refused attempt claimed nothing
