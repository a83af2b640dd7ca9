"""The client's framework document stores against one served app: the Haystack ``DocumentStore`` under Haystack's
own suite (``haystack.testing.document_store``), and the LlamaIndex vector store against LlamaIndex's own filter
rule (``build_metadata_filter_fn``, what its ``SimpleVectorStore`` applies), inside a ``VectorStoreIndex``, its
retriever and its query engine; and README's store examples, run as written.

One app serves three copies of one small build: ``default`` (the corpus, searched by README's examples, which clean
up after themselves), ``haystack`` and ``llamaindex``, each emptied through the API when the app starts and by its
tests' fixture before each test. LlamaIndex ships no test suite for vector stores (``llama_index.core`` has no
testing module), so its tests are this file's. No test may open a connection beyond this machine."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest
from haystack import Document, Pipeline
from haystack.components.writers import DocumentWriter
from haystack.document_stores.errors import DuplicateDocumentError
from haystack.document_stores.types import DuplicatePolicy
from haystack.errors import FilterError
from haystack.testing.document_store import (
    CountDocumentsByFilterTest,
    CountUniqueMetadataByFilterTest,
    DocumentStoreBaseExtendedTests,
    GetMetadataFieldMinMaxTest,
    GetMetadataFieldsInfoTest,
    GetMetadataFieldUniqueValuesTest,
)
from llama_index.core import Document as LlamaDocument
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)
from llama_index.core.vector_stores.utils import build_metadata_filter_fn
from raysearch_client import SearchClient
from raysearch_client.haystack import RaySearchDocumentStore, RaySearchRetriever
from raysearch_client.llamaindex import RaySearchVectorStore

from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import write_jsonl
from tests.serving import SERVE_PORT, start_serve, stop_serving

pytestmark = pytest.mark.usefixtures("loopback_only")  # conftest: nothing beyond this machine
PORT = SERVE_PORT
URL = f"http://127.0.0.1:{PORT}"
README = (Path(__file__).parents[2] / "README.md").read_text()
STORES = ("haystack", "llamaindex")  # the collections the stores' tests empty and fill

DOCS = [
    ("gzip.open", "function", "Open a gzip-compressed file in binary or text mode, returning a file object."),
    ("gzip.compress", "function", "Compress the data, returning a bytes object containing the compressed data."),
    ("tarfile.TarFile", "class", "The TarFile object provides an interface to a tar archive of members."),
    ("zipfile.ZipFile", "class", "Open a ZIP file, where file can be a path to a file or a file-like object."),
    ("bz2.open", "function", "Open a bzip2-compressed file in binary or text mode, returning a file object."),
    ("zlib.crc32", "function", "Compute a CRC checksum of data, a running checksum when value is given."),
]


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    from ray import serve

    from deployments.serve.app import build_app

    folder = tmp_path_factory.mktemp("framework_stores")
    corpus = write_jsonl(folder / "corpus.jsonl", [
        {"id": name, "title": name, "text": text, "metadata": {"kind": kind, "module": name.split(".")[0]}}
        for name, kind, text in DOCS])
    build_index(BuildConfig(corpus=corpus, out=folder / "default", shards=1, encoder="hashing:32", progress=False))
    for name in STORES:
        shutil.copytree(folder / "default", folder / name)  # a copy costs nothing; a build, seconds
    roots = {name: {"index": str(folder / name)} for name in ("default", *STORES)}
    start_serve()
    # No fold by count or age: a fold mid-module would switch versions under the tests (folds are tested elsewhere).
    router = {"shard_timeout_s": 10, "fold_after_documents": 0, "fold_after_s": 0}
    serve.run(build_app({"collections": roots, "router": router}), name="framework_stores",
              route_prefix="/", blocking=False)
    with SearchClient(URL) as client:
        for name in STORES:
            client.delete_documents(name, [doc_id for doc_id, _, _ in DOCS])
        yield client
    stop_serving()




def ids_of(client: SearchClient, collection: str) -> list[str]:
    return [d.id for d in client.documents(collection, limit=1000)]


# Haystack: the suite.


@pytest.fixture
def haystack_store(served):
    """The store over the ``haystack`` collection, emptied through the store itself."""
    store = RaySearchDocumentStore(url=URL, collection="haystack", api_key=None)
    store.delete_documents([d.id for d in store.filter_documents()])
    assert store.count_documents() == 0
    return store


class TestHaystackDocumentStore(DocumentStoreBaseExtendedTests, CountDocumentsByFilterTest,
                                CountUniqueMetadataByFilterTest, GetMetadataFieldsInfoTest,
                                GetMetadataFieldMinMaxTest, GetMetadataFieldUniqueValuesTest):
    @pytest.fixture
    def document_store(self, haystack_store):
        return haystack_store

    @staticmethod
    def assert_documents_are_equal(received, expected):
        # Compared by id, content and meta: the service keeps no client-side embedding (it embeds every document
        # with the collection's own encoder), and a listed document has no score.
        def key(d):
            return d.id, d.content, d.meta

        assert sorted(map(key, received), key=lambda k: k[0]) == sorted(map(key, expected), key=lambda k: k[0])

    def test_write_documents(self, document_store):
        """The default policy (NONE) overwrites, as OVERWRITE does: an upsert is the service's one write."""
        doc = Document(id="1", content="test doc", meta={"n": 1})
        assert document_store.write_documents([doc]) == 1
        again = Document(id="1", content="test doc again", meta={"n": 2})
        assert document_store.write_documents([again]) == 1
        self.assert_documents_are_equal(document_store.filter_documents(), [again])


# Haystack: what the suite does not check.


def test_haystack_batches_pages_and_policies_over_a_thousand_documents(haystack_store):
    """1,005 documents: written in two calls, listed in two pages, checked for duplicates in two listings, deleted in
    two calls; ids given twice follow each policy. The first is long (many chunks): its content reads back whole."""
    docs = [Document(id=f"b{i:04d}", content=f"batch document {i}", meta={"i": i}) for i in range(1005)]
    docs[0] = Document(id="b0000", content=" ".join(f"word{j % 97}." for j in range(3000)), meta={"i": 0})
    assert haystack_store.write_documents(docs) == 1005
    assert haystack_store.count_documents() == 1005
    listed = haystack_store.filter_documents()
    assert [(d.id, d.content, d.meta) for d in listed] == [(d.id, d.content, d.meta) for d in docs]
    late = {"field": "meta.i", "operator": ">=", "value": 1000}
    assert [d.id for d in haystack_store.filter_documents(late)] == [f"b{i:04d}" for i in range(1000, 1005)]

    last = Document(id="b1004", content="replaced")
    with pytest.raises(DuplicateDocumentError, match="b1004"):
        haystack_store.write_documents([Document(id="new", content="x"), last], policy=DuplicatePolicy.FAIL)
    assert haystack_store.filter_documents({"field": "meta.i", "operator": "==", "value": 1004})[0].content == (
        "batch document 1004")  # FAIL wrote nothing, the new id neither
    assert haystack_store.count_documents() == 1005
    first, second = Document(id="twice", content="first"), Document(id="twice", content="second")
    assert haystack_store.write_documents([last, first, second], policy=DuplicatePolicy.SKIP) == 1
    assert [d.content for d in haystack_store.filter_documents() if d.id == "twice"] == ["first"]
    assert haystack_store.write_documents([first, second], policy=DuplicatePolicy.OVERWRITE) == 2
    assert [d.content for d in haystack_store.filter_documents() if d.id == "twice"] == ["second"]

    every = {"field": "meta.i", "operator": ">=", "value": 0}
    assert haystack_store.update_by_filter(every, {"seen": True}) == 1005  # listed in two pages, written in two calls
    assert haystack_store.count_documents_by_filter({"field": "meta.seen", "operator": "==", "value": True}) == 1005
    assert haystack_store.filter_documents(late)[-1].meta == {"i": 1004, "seen": True}

    haystack_store.delete_documents([d.id for d in docs] + ["twice", "never-written"])
    assert haystack_store.count_documents() == 0


def test_haystack_deletes_all_and_by_filter_over_a_thousand_documents_async_as_sync(haystack_store):
    """1,002 documents: 1,001 deleted by a filter (two calls), then again by delete_all; each ``_async`` variant answers
    what its sync method answers."""
    docs = [Document(id=f"a{i:04d}", content=f"note {i}", meta={"i": i, "odd": i % 2 == 1}) for i in range(1002)]
    haystack_store.write_documents(docs)
    odd = {"field": "meta.odd", "operator": "==", "value": True}
    sync = (haystack_store.count_documents_by_filter(odd),
            haystack_store.count_unique_metadata_by_filter(odd, ["meta.odd", "i"]),
            haystack_store.get_metadata_fields_info(), haystack_store.get_metadata_field_min_max("i"),
            haystack_store.get_metadata_field_unique_values("odd", filters=odd))
    assert sync == (501, {"odd": 1, "i": 501}, {"i": {"type": "int"}, "odd": {"type": "boolean"}},
                    {"min": 0, "max": 1001}, ([True], 1))

    async def answers():
        return (await haystack_store.count_documents_by_filter_async(odd),
                await haystack_store.count_unique_metadata_by_filter_async(odd, ["meta.odd", "i"]),
                await haystack_store.get_metadata_fields_info_async(),
                await haystack_store.get_metadata_field_min_max_async("i"),
                await haystack_store.get_metadata_field_unique_values_async("odd", filters=odd))

    assert asyncio.run(answers()) == sync
    assert asyncio.run(haystack_store.update_by_filter_async(odd, {"tag": "odd"})) == 501
    assert haystack_store.get_metadata_field_unique_values("tag") == (["odd"], 1)
    assert asyncio.run(haystack_store.delete_by_filter_async({"field": "meta.i", "operator": ">=", "value": 1})) == 1001
    assert [d.id for d in haystack_store.filter_documents()] == ["a0000"]
    asyncio.run(haystack_store.delete_all_documents_async())
    assert haystack_store.count_documents() == 0
    haystack_store.write_documents(docs)
    assert haystack_store.delete_by_filter({"field": "meta.i", "operator": "<", "value": 1001}) == 1001
    haystack_store.delete_all_documents(recreate_index=True)
    assert haystack_store.count_documents() == 0


def test_haystack_update_by_filter_keeps_a_document_s_title_text_and_other_metadata(haystack_store, served):
    served.upsert_documents("haystack", [{"id": "t1", "title": "A title", "text": "a titled note",
                                          "metadata": {"a": 1, "b": 2}}])
    assert haystack_store.update_by_filter({"field": "meta.a", "operator": "==", "value": 1}, {"b": 3, "c": 4}) == 1
    stored = served.get_document("haystack", "t1")
    assert (stored.title, stored.text, stored.metadata) == ("A title", "a titled note", {"a": 1, "b": 3, "c": 4})


def test_haystack_metadata_fields_are_read_from_the_documents(haystack_store, served):
    """Types from the values (``mixed`` where they differ); an emptied collection has none, though the service still
    lists its version's fields; min and max of numbers or of strings, not of booleans or of both."""
    (listed,) = [c for c in served.collections() if c.name == "haystack"]
    assert {"kind", "module"} <= {f.name for f in listed.fields} and haystack_store.get_metadata_fields_info() == {}
    haystack_store.write_documents([
        Document(id="m1", content="x", meta={"n": 1, "day": "2024-03-01", "flag": True, "both": 3}),
        Document(id="m2", content="y", meta={"n": 2.5, "day": "2023-12-31", "flag": False, "both": "b"}),
        Document(id="m3", content="z", meta={"n": None})])
    assert haystack_store.get_metadata_fields_info() == {
        "both": {"type": "mixed"}, "day": {"type": "keyword"}, "flag": {"type": "boolean"}, "n": {"type": "mixed"}}
    assert haystack_store.get_metadata_field_min_max("meta.n") == {"min": 1, "max": 2.5}
    assert haystack_store.get_metadata_field_min_max("day") == {"min": "2023-12-31", "max": "2024-03-01"}
    assert haystack_store.get_metadata_field_min_max("flag") == {"min": None, "max": None}
    assert haystack_store.get_metadata_field_min_max("both") == {"min": None, "max": None}
    assert haystack_store.count_unique_metadata_by_filter({}, ["n", "flag", "nowhere"]) == {"n": 2, "flag": 2,
                                                                                             "nowhere": 0}
    never = {"operator": "OR", "conditions": []}
    assert haystack_store.get_metadata_field_unique_values("n", filters=never) == ([], 0)
    assert haystack_store.count_documents_by_filter(never) == 0


def test_an_empty_haystack_store_selects_nothing_where_the_service_refuses_a_field(haystack_store):
    """The service refuses a field no document holds (422); an empty store answers nothing, as Haystack's stores
    do, and one with documents raises ``FilterError`` as ``filter_documents`` does."""
    unknown = {"field": "meta.never_written", "operator": "==", "value": 1}
    assert haystack_store.count_documents_by_filter(unknown) == 0
    assert asyncio.run(haystack_store.count_documents_by_filter_async(unknown)) == 0
    assert haystack_store.filter_documents(unknown) == []
    assert asyncio.run(haystack_store.filter_documents_async(unknown)) == []
    assert haystack_store.delete_by_filter(unknown) == 0
    haystack_store.write_documents([Document(id="w", content="written", meta={"n": 1})])
    with pytest.raises(FilterError, match="unknown filter field 'never_written'"):
        haystack_store.count_documents_by_filter(unknown)
    with pytest.raises(FilterError, match="unknown filter field 'never_written'"):
        asyncio.run(haystack_store.update_by_filter_async(unknown, {"n": 2}))


def test_a_filter_the_service_refuses_is_haystack_s_filter_error(haystack_store):
    haystack_store.write_documents([Document(content="a", meta={"name": "a", "number": 1})])
    with pytest.raises(FilterError, match="range operators need a number or date field"):  # the service's message
        haystack_store.filter_documents({"field": "meta.name", "operator": ">", "value": "a"})
    with pytest.raises(FilterError, match="unknown filter field 'nowhere'"):
        haystack_store.filter_documents({"field": "meta.nowhere", "operator": "==", "value": 1})
    with pytest.raises(FilterError, match="is not metadata"):  # refused by the translation, before any request
        haystack_store.filter_documents({"field": "content", "operator": "==", "value": "a"})
    never = {"operator": "OR", "conditions": []}  # matches nothing: answered without asking the service
    assert haystack_store.filter_documents(never) == []
    with pytest.raises(ValueError, match="has no content"):
        haystack_store.write_documents([Document(content=None, meta={"name": "b"})])


def test_a_haystack_pipeline_writes_to_the_store_and_retrieves_what_it_wrote(haystack_store, monkeypatch):
    """A ``DocumentWriter`` over the store (saved and loaded with its pipeline: the key's variable, not the key),
    then the retriever searching the same collection finds what it wrote; and the same through ``run_async``."""
    monkeypatch.setenv("RAYSEARCH_API_KEY", "rsk_saved")
    pipeline = Pipeline()
    pipeline.add_component("writer", DocumentWriter(RaySearchDocumentStore(url=URL, collection="haystack")))
    saved = pipeline.dumps()
    assert "RAYSEARCH_API_KEY" in saved and "rsk_saved" not in saved
    loaded = Pipeline.loads(saved, allowed_modules=["raysearch_client.haystack", "haystack"])
    store = loaded.get_component("writer").document_store
    assert (store.collection, store._connection.sync.http.headers["authorization"]) == ("haystack", "Bearer rsk_saved")
    notes = [Document(id="n1", content="sailing boats need wind", meta={"topic": "sailing"}),
             Document(id="n2", content="bread needs flour and an oven", meta={"topic": "cooking"})]
    assert loaded.run({"writer": {"documents": notes}})["writer"]["documents_written"] == 2

    retriever = RaySearchRetriever(url=URL, top_k=1, search_kwargs={"collections": ["haystack"]}, api_key=None)
    assert [d.meta["doc_id"] for d in retriever.run("flour oven")["documents"]] == ["n2"]

    writer = Pipeline()
    writer.add_component("writer", DocumentWriter(haystack_store, policy=DuplicatePolicy.SKIP))
    more = [notes[0], Document(id="n3", content="a violin concert", meta={"topic": "music"})]
    assert asyncio.run(writer.run_async({"writer": {"documents": more}}))["writer"]["documents_written"] == 1
    sailing = {"field": "meta.topic", "operator": "in", "value": ["sailing", "music"]}
    found = asyncio.run(haystack_store.filter_documents_async(sailing))
    assert [d.id for d in found] == ["n1", "n3"]
    assert asyncio.run(haystack_store.count_documents_async()) == 3
    asyncio.run(haystack_store.delete_documents_async(["n1", "n2", "n3", "never-written"]))
    assert haystack_store.count_documents() == 0


# LlamaIndex.


@pytest.fixture
def llama_store(served):
    """The store over the ``llamaindex`` collection, emptied through the store itself."""
    store = RaySearchVectorStore(URL, collection="llamaindex")
    store.clear()
    assert store.get_nodes() == []
    return store


TOPICS = ("music", "sailing", "cooking")
WORDS = {"music": "piano chord melody violin concert", "sailing": "boat wind sail harbor anchor",
         "cooking": "bread flour oven butter dough"}


def make_nodes() -> list[TextNode]:
    """Twelve nodes of three sources: a topic each (but the last), a year (but every fourth), the source's id."""
    nodes = []
    for i in range(12):
        topic = TOPICS[i % 3]
        metadata = {"topic": topic} if i < 11 else {}
        if i % 4:
            metadata["year"] = 2000 + i
        nodes.append(TextNode(id_=f"node-{i:02d}", text=f"{WORDS[topic]} note {i}", metadata=metadata,
                              relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f"source-{i % 3}")}))
    return nodes


def mf(key, value, op=FilterOperator.EQ):
    return MetadataFilter(key=key, value=value, operator=op)


FILTERS = [
    MetadataFilters(filters=[mf("topic", "music")]),  # ExactMatch
    MetadataFilters(filters=[mf("year", 2005, FilterOperator.GT)]),
    MetadataFilters(filters=[mf("topic", ["music", "cooking"], FilterOperator.IN)]),
    MetadataFilters(filters=[mf("topic", ["music"], FilterOperator.NIN)]),  # the node without a topic too
    MetadataFilters(filters=[mf("topic", "sailing"), mf("year", 2003, FilterOperator.LT)],
                    condition=FilterCondition.OR),
    MetadataFilters(filters=[mf("year", 2002, FilterOperator.GTE), mf("topic", "cooking", FilterOperator.NE)]),
]


def brute_force(nodes: list[TextNode], filters: MetadataFilters) -> list[str]:
    """The ids LlamaIndex's own rule selects (``SimpleVectorStore``'s)."""
    metadata = {n.node_id: n.metadata for n in nodes}
    keep = build_metadata_filter_fn(lambda node_id: metadata[node_id], filters)
    return sorted(n.node_id for n in nodes if keep(n.node_id))


def as_written(nodes) -> list[tuple]:
    return sorted((n.node_id, n.get_content(), n.metadata, n.ref_doc_id) for n in nodes)


def test_llamaindex_nodes_are_written_read_and_deleted_by_id_source_and_filter(llama_store, served):
    nodes = make_nodes()
    assert llama_store.add(nodes) == [n.node_id for n in nodes]
    assert as_written(llama_store.get_nodes()) == as_written(nodes)
    assert served.get_document("llamaindex", "node-01").metadata == {"topic": "sailing", "year": 2001,
                                                                     "ref_doc_id": "source-1"}
    assert [n.node_id for n in llama_store.get_nodes(["node-03", "missing", "node-01"])] == ["node-01", "node-03"]
    music = MetadataFilters(filters=[mf("topic", "music")])
    assert [n.node_id for n in llama_store.get_nodes(["node-00", "node-01"], filters=music)] == ["node-00"]

    llama_store.delete("source-1")  # every node of that source
    assert ids_of(served, "llamaindex") == [n.node_id for n in nodes if n.ref_doc_id != "source-1"]
    llama_store.delete_nodes(["node-00", "missing"])
    llama_store.delete_nodes(filters=MetadataFilters(filters=[mf("year", 2008, FilterOperator.GTE)]))
    llama_store.delete_nodes(["node-02", "node-05"], filters=music)  # neither is music: nothing deleted
    assert ids_of(served, "llamaindex") == ["node-02", "node-03", "node-05", "node-06", "node-08"]  # 08: no year
    llama_store.clear()
    assert ids_of(served, "llamaindex") == []


def test_deleting_a_source_no_document_holds_deletes_nothing(served):
    """The ``default`` collection never held ``ref_doc_id`` (the service refuses a filter on it, 422): nothing has
    that source, so nothing is deleted and nothing is raised."""
    store = RaySearchVectorStore(URL, collection="default")
    before = ids_of(served, "default")
    store.delete("source-0")
    asyncio.run(store.adelete("source-0"))
    assert ids_of(served, "default") == before == sorted(name for name, _, _ in DOCS)


@pytest.mark.parametrize("filters", FILTERS, ids=["eq", "gt", "in", "nin", "or", "and"])
def test_llamaindex_metadata_filters_select_what_llamaindex_s_own_rule_selects(llama_store, served, filters):
    nodes = make_nodes()
    llama_store.add(nodes)
    expected = brute_force(nodes, filters)
    assert expected, "each case selects something"
    assert sorted(n.node_id for n in llama_store.get_nodes(filters=filters)) == expected
    # A search for every node (the dense leg ranks them all): those the filter lets through, one result each.
    found = llama_store.query(VectorStoreQuery(query_str="note", similarity_top_k=len(nodes), filters=filters))
    assert sorted(found.ids) == expected
    assert [n.node_id for n in found.nodes] == found.ids


def test_a_llamaindex_query_answers_the_client_s_search_grouped_by_document(llama_store, served):
    nodes = make_nodes()
    llama_store.add(nodes)
    cases = [(VectorStoreQuery(query_str="violin concert", similarity_top_k=3), {}),
             (VectorStoreQuery(query_str="violin concert", similarity_top_k=3, mode=VectorStoreQueryMode.TEXT_SEARCH),
              {"method": "keyword"}),
             (VectorStoreQuery(query_str="harbor wind", similarity_top_k=4, doc_ids=["source-1", "source-2"]),
              {"filters": {"ref_doc_id": {"in": ["source-1", "source-2"]}}})]
    for query, fields in cases:
        result = llama_store.query(query)
        page = served.search(query.query_str, limit=query.similarity_top_k, collections=["llamaindex"],
                             group_by="doc_id", **fields)
        assert page.results
        assert result.ids == [r.doc_id for r in page.results]
        assert result.similarities == [r.relevance_score for r in page.results]
        by_id = {n.node_id: n for n in nodes}
        assert [(n.get_content(), n.metadata, n.ref_doc_id) for n in result.nodes] == [
            (r.content, by_id[r.doc_id].metadata, by_id[r.doc_id].ref_doc_id) for r in page.results]
    assert asyncio.run(llama_store.aquery(cases[0][0])).ids == llama_store.query(cases[0][0]).ids


def test_llamaindex_queries_the_store_cannot_answer_are_refused(llama_store):
    with pytest.raises(ValueError, match="query_str"):
        llama_store.query(VectorStoreQuery(query_embedding=[0.1, 0.2], similarity_top_k=2))
    with pytest.raises(ValueError, match="'svm' is not supported"):
        llama_store.query(VectorStoreQuery(query_str="x", mode=VectorStoreQueryMode.SVM))
    with pytest.raises(ValueError, match="alpha"):
        llama_store.query(VectorStoreQuery(query_str="x", mode=VectorStoreQueryMode.HYBRID, alpha=0.3))
    with pytest.raises(ValueError, match="node_ids"):
        llama_store.query(VectorStoreQuery(query_str="x", node_ids=["node-00"]))
    with pytest.raises(ValueError, match="the vector store's own"):
        RaySearchVectorStore(URL, collection="llamaindex", search_kwargs={"group_by": "topic"})


class NoQueryEmbedding(MockEmbedding):
    """An embed model that fails a test if a query is embedded: the store's queries are the service's to embed."""

    def _get_query_embedding(self, query: str) -> list[float]:
        raise AssertionError(f"a query was embedded on this side: {query!r}")

    async def _aget_query_embedding(self, query: str) -> list[float]:
        raise AssertionError(f"a query was embedded on this side: {query!r}")


def test_a_vector_store_index_over_the_store_retrieves_and_answers_without_embedding_a_query(llama_store, served):
    """``VectorStoreIndex.from_vector_store``: its retriever and query engine (MockLLM) search the service, and no
    query is embedded here (``is_embedding_query`` False); the index is given an embed model only because
    LlamaIndex resolves one when any index is made."""
    llama_store.add(make_nodes())
    index = VectorStoreIndex.from_vector_store(llama_store, embed_model=NoQueryEmbedding(embed_dim=1))
    expected = [r.doc_id for r in served.search("bread flour", limit=3, collections=["llamaindex"],
                                                group_by="doc_id").results]
    retriever = index.as_retriever(similarity_top_k=3)
    found = retriever.retrieve("bread flour")
    assert [n.node.node_id for n in found] == expected
    assert all(n.node.metadata["topic"] == "cooking" for n in found[:1])
    assert [n.node.node_id for n in asyncio.run(retriever.aretrieve("bread flour"))] == expected
    cooking = MetadataFilters(filters=[mf("topic", "cooking", FilterOperator.NE)])
    assert all(n.node.metadata.get("topic") != "cooking"
               for n in index.as_retriever(similarity_top_k=5, filters=cooking).retrieve("bread flour"))

    response = index.as_query_engine(llm=MockLLM(), similarity_top_k=3).query("bread flour")
    assert [n.node.node_id for n in response.source_nodes] == expected
    assert found[0].node.get_content() in str(response)  # MockLLM echoes its prompt: the context it was given


def test_documents_inserted_through_an_index_are_nodes_of_their_source(llama_store, served):
    """``VectorStoreIndex.from_documents`` splits, writes each node with its source, and ``delete_ref_doc`` deletes
    them; the async paths (``ainsert``, ``adelete_ref_doc``) reach the store's async methods."""
    storage = StorageContext.from_defaults(vector_store=llama_store)
    docs = [LlamaDocument(id_="manual", text="The anchor holds the boat in the harbor.", metadata={"topic": "sailing"}),
            LlamaDocument(id_="recipe", text="Knead the dough and bake the bread.", metadata={"topic": "cooking"})]
    index = VectorStoreIndex.from_documents(docs, storage_context=storage, embed_model=MockEmbedding(embed_dim=1))
    stored = llama_store.get_nodes()
    assert sorted(n.ref_doc_id for n in stored) == ["manual", "recipe"]
    assert {n.ref_doc_id: n.metadata["topic"] for n in stored} == {"manual": "sailing", "recipe": "cooking"}
    index.delete_ref_doc("manual")
    assert [n.ref_doc_id for n in llama_store.get_nodes()] == ["recipe"]

    asyncio.run(index.ainsert(LlamaDocument(id_="song", text="A violin plays the melody.")))
    assert sorted(n.ref_doc_id for n in asyncio.run(llama_store.aget_nodes())) == ["recipe", "song"]
    asyncio.run(index.adelete_ref_doc("recipe"))
    asyncio.run(llama_store.adelete_nodes(filters=MetadataFilters(filters=[mf("topic", "none", FilterOperator.NE)])))
    assert llama_store.get_nodes() == []
    asyncio.run(llama_store.async_add(make_nodes()[:2]))
    asyncio.run(llama_store.aclear())
    assert ids_of(served, "llamaindex") == []


# README.


def readme_examples() -> dict[str, str]:
    return dict(re.findall(r"<!-- store example: (\w+) -->\n```python\n(.*?)```", README, re.S))


@pytest.mark.parametrize("name", ["haystack", "llamaindex"])
def test_the_readme_store_example_runs_as_written(served, name):
    before = ids_of(served, "default")
    code = readme_examples()[name].replace("http://127.0.0.1:8000", URL)
    namespace: dict = {"__name__": f"readme_{name}_store"}
    exec(compile(code, f"README.md ({name} store example)", "exec"), namespace)  # noqa: S102 - the README's own code
    assert namespace["found"], f"the {name} store example found nothing"
    assert ids_of(served, "default") == before  # it deleted what it wrote
