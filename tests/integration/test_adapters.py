"""The client's framework adapters against one served app: LangChain's retriever and vector store under LangChain's
own standard test suites (langchain-tests), the LlamaIndex retriever inside a ``RetrieverQueryEngine``, the Haystack
component inside a ``Pipeline``, each answering what the client's ``search`` answers; and README's adapter
examples, run as written.

One app serves two collections: ``default``, a small readable corpus the retrievers search, and ``store``, the
vector store's: a copy of the first, emptied when the app starts (its documents deleted through the API) and again
after each standard test (what the test wrote, found by searching the store for everything). No test may open a
connection beyond this machine: the frameworks (LLM defaults, telemetry, downloads) must reach nothing but the
service."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest
from haystack import Pipeline
from langchain_tests.integration_tests import RetrieversIntegrationTests, VectorStoreIntegrationTests
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from pydantic import ValidationError
from raysearch_client import SearchClient
from raysearch_client import haystack as rs_haystack
from raysearch_client import langchain as rs_langchain
from raysearch_client import llamaindex as rs_llamaindex

from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import write_jsonl
from tests.serving import SERVE_PORT, start_serve, stop_serving

pytestmark = pytest.mark.usefixtures("loopback_only")  # conftest: nothing beyond this machine
PORT = SERVE_PORT
URL = f"http://127.0.0.1:{PORT}"
README = (Path(__file__).parents[2] / "README.md").read_text()
QUERY = "compress a file with gzip"

# What README's examples search: a few modules' documentation, with the metadata they filter on.
DOCS = [
    ("gzip.open", "function", "Open a gzip-compressed file in binary or text mode, returning a file object."),
    ("gzip.compress", "function", "Compress the data, returning a bytes object containing the compressed data."),
    ("gzip.decompress", "function", "Decompress the data, returning a bytes object with the uncompressed data."),
    ("gzip.GzipFile", "class", "The GzipFile class simulates most of the methods of a file object for gzip files."),
    ("tarfile.open", "function", "Return a TarFile object for the path name; mode r:gz opens with gzip compression."),
    ("tarfile.TarFile", "class", "The TarFile object provides an interface to a tar archive of members."),
    ("zipfile.ZipFile", "class", "Open a ZIP file, where file can be a path to a file or a file-like object."),
    ("zipfile.is_zipfile", "function", "Return True if filename is a valid ZIP file based on its magic number."),
    ("bz2.compress", "function", "Compress data, a bytes-like object, all at once with bzip2 compression."),
    ("bz2.open", "function", "Open a bzip2-compressed file in binary or text mode, returning a file object."),
    ("lzma.open", "function", "Open an LZMA-compressed file, xz or legacy lzma format, in binary or text mode."),
    ("shutil.make_archive", "function", "Create an archive file such as zip or tar and return its name."),
    ("zlib.compress", "function", "Compress the bytes in data, returning a bytes object of compressed data."),
    ("zlib.crc32", "function", "Compute a CRC checksum of data, a running checksum when value is given."),
    ("io.BytesIO", "class", "A binary stream using an in-memory bytes buffer, to read and write bytes."),
    ("os.path.getsize", "function", "Return the size, in bytes, of path; OSError if the file is missing."),
]


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    from ray import serve

    from deployments.serve.app import build_app

    folder = tmp_path_factory.mktemp("adapters")
    corpus = write_jsonl(folder / "corpus.jsonl", [
        {"id": name, "title": name, "text": text, "metadata": {"kind": kind, "module": name.split(".")[0]}}
        for name, kind, text in DOCS])
    build_index(BuildConfig(corpus=corpus, out=folder / "default", shards=1, encoder="hashing:32", progress=False))
    shutil.copytree(folder / "default", folder / "store")  # a second build would cost seconds; a copy, nothing
    roots = {name: {"index": str(folder / name)} for name in ("default", "store")}
    start_serve()
    serve.run(build_app({"collections": roots, "router": {"shard_timeout_s": 10}}), name="adapters",
              route_prefix="/", blocking=False)
    with SearchClient(URL) as client:
        client.delete_documents("store", [name for name, _, _ in DOCS])  # the vector store's collection, empty
        yield client
    stop_serving()




def expected(client: SearchClient, query: str = QUERY, **fields):
    page = client.search(query, **fields)
    assert page.results, "the corpus answers the query"
    return page.results


# LangChain: the standard suites.


@pytest.mark.usefixtures("served")
class TestLangChainRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[rs_langchain.RaySearchRetriever]:
        return rs_langchain.RaySearchRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"url": URL}

    @property
    def retriever_query_example(self) -> str:
        return QUERY


@pytest.mark.usefixtures("served")
class TestLangChainVectorStoreStandard(VectorStoreIntegrationTests):
    @pytest.fixture
    def vectorstore(self):
        # The fake embeddings are kept, never called: the service embeds with the collection's encoder.
        store = rs_langchain.RaySearchVectorStore(URL, collection="store", embedding=self.get_embeddings())
        yield store
        written = store.similarity_search("foo", k=100)  # hybrid: the dense leg ranks every document
        if written:
            store.delete([d.id for d in written])
        assert store.similarity_search("foo", k=1) == []


# LangChain: what the standard suites do not check.


def test_the_langchain_retriever_answers_the_clients_results_with_every_search_field(served):
    fields = {"method": "hybrid", "filters": {"kind": "function"}, "rerank": False}
    retriever = rs_langchain.RaySearchRetriever(url=URL, k=5, search_kwargs=fields)
    docs = retriever.invoke(QUERY)
    results = expected(served, limit=5, **fields)
    assert [d.page_content for d in docs] == [r.content for r in results]
    assert [d.id for d in docs] == [r.chunk_id for r in results]
    for doc, result in zip(docs, results, strict=True):
        assert doc.metadata["kind"] == "function"  # the filter held, and the chunk's metadata is there
        assert (doc.metadata["doc_id"], doc.metadata["chunk_id"], doc.metadata["rank"], doc.metadata["score"]) == (
            result.doc_id, result.chunk_id, result.rank, result.score)
    # A call's keywords win over search_kwargs: another method, another ranking.
    keyword = retriever.invoke(QUERY, method="keyword", k=2)
    assert [d.id for d in keyword] == [r.chunk_id for r in expected(served, limit=2, **{**fields, "method": "keyword"})]
    assert asyncio.run(retriever.ainvoke(QUERY)) == docs  # the async client answers the same


def test_a_misspelt_search_field_fails_before_anything_is_sent():
    with pytest.raises(ValidationError, match="methd"):
        rs_langchain.RaySearchRetriever(url="http://127.0.0.1:9", search_kwargs={"methd": "keyword"})
    with pytest.raises(ValidationError, match="limit"):
        rs_langchain.RaySearchRetriever(url="http://127.0.0.1:9").invoke(QUERY, k=1000)


def test_each_adapter_sends_its_key_and_keeps_it_out_of_what_it_shows():
    adapters = [rs_langchain.RaySearchRetriever(url=URL, api_key="rsk_secret"),
                rs_langchain.RaySearchVectorStore(URL, api_key="rsk_secret"),
                rs_llamaindex.RaySearchRetriever(URL, api_key="rsk_secret"),
                rs_haystack.RaySearchRetriever(url=URL, api_key="rsk_secret")]
    for adapter in adapters:
        assert adapter._connection.sync.http.headers["authorization"] == "Bearer rsk_secret"
    assert "rsk_secret" not in repr(adapters[0])
    with pytest.raises(ValueError, match="token"):  # Haystack's rule: a key given as a string is never saved
        adapters[3].to_dict()


def test_each_adapter_given_no_key_sends_raysearch_api_key(monkeypatch):
    monkeypatch.setenv("RAYSEARCH_API_KEY", "rsk_from_env")
    adapters = [rs_langchain.RaySearchRetriever(url=URL), rs_langchain.RaySearchVectorStore(URL),
                rs_llamaindex.RaySearchRetriever(URL), rs_haystack.RaySearchRetriever(url=URL)]
    for adapter in adapters:
        assert adapter._connection.sync.http.headers["authorization"] == "Bearer rsk_from_env"
    assert rs_haystack.RaySearchRetriever(url=URL, api_key=None)._connection.sync.http.headers.get("authorization") is None


def test_a_saved_haystack_pipeline_keeps_the_key_s_variable_not_the_key(monkeypatch):
    """Saved, the component names ``$RAYSEARCH_API_KEY``; loaded where it holds another key, it sends that one."""
    monkeypatch.setenv("RAYSEARCH_API_KEY", "rsk_saved_where")
    pipeline = Pipeline()
    pipeline.add_component("retriever", rs_haystack.RaySearchRetriever(url=URL, top_k=2))
    saved = pipeline.dumps()
    assert "RAYSEARCH_API_KEY" in saved and "rsk_saved_where" not in saved
    monkeypatch.setenv("RAYSEARCH_API_KEY", "rsk_loaded_where")
    loaded = Pipeline.loads(saved, allowed_modules=["raysearch_client.haystack"]).get_component("retriever")
    assert loaded._connection.sync.http.headers["authorization"] == "Bearer rsk_loaded_where"


def test_the_vector_store_searches_documents_and_scores_them_in_0_1(served):
    store = rs_langchain.RaySearchVectorStore.from_texts(
        ["gzip streams large files now", "tarfile reads xz archives", "zipfile writes zip64 archives"],
        metadatas=[{"kind": "notes", "n": 1}, {"kind": "notes", "n": 2}, {"kind": "other", "n": 3}],
        ids=["n1", "n2", "n3"], url=URL, collection="store")
    try:
        scored = store.similarity_search_with_score("xz archives", k=3)
        assert [d.id for d, _ in scored][0] == "n2"
        assert all(0 <= s <= 1 for _, s in scored) and [s for _, s in scored] == sorted((s for _, s in scored),
                                                                                           reverse=True)
        assert {d.id for d in store.similarity_search("archives", k=3, filter={"kind": "notes"})} == {"n1", "n2"}
        assert [d.id for d in store.as_retriever(search_kwargs={"k": 1}).invoke("zip64")] == ["n3"]
        assert store.similarity_search_with_relevance_scores("xz archives", k=3) == scored  # already in [0, 1]
        diverse = store.max_marginal_relevance_search("archives", k=2, fetch_k=10, lambda_mult=0.5)
        assert len(diverse) == 2 and {d.id for d in diverse} <= {"n1", "n2", "n3"}
        assert [d.metadata for d in store.get_by_ids(["n3", "missing", "n1"])] == [{"kind": "other", "n": 3},
                                                                                 {"kind": "notes", "n": 1}]
    finally:
        store.delete(["n1", "n2", "n3"])
    assert store.get_by_ids(["n1", "n2", "n3"]) == []


def test_the_vector_store_refuses_to_delete_everything():
    with pytest.raises(ValueError, match="delete-all"):
        rs_langchain.RaySearchVectorStore("http://127.0.0.1:9", collection="store").delete()


# LlamaIndex.


def test_the_llamaindex_retriever_answers_nodes_of_the_clients_results(served):
    retriever = rs_llamaindex.RaySearchRetriever(URL, similarity_top_k=4, search_kwargs={"method": "hybrid"})
    nodes = retriever.retrieve(QUERY)
    results = expected(served, limit=4, method="hybrid")
    assert [(n.node.node_id, n.node.ref_doc_id, n.node.get_content(), n.score) for n in nodes] == [
        (r.chunk_id, r.doc_id, r.content, r.relevance_score) for r in results]
    assert all(n.node.metadata["kind"] == r.metadata["kind"] for n, r in zip(nodes, results, strict=True))
    assert [n.node.node_id for n in asyncio.run(retriever.aretrieve(QUERY))] == [r.chunk_id for r in results]


def test_the_llamaindex_retriever_serves_a_query_engine(served):
    """A ``RetrieverQueryEngine`` with llama-index's MockLLM (nothing downloaded, nothing called over the network):
    the engine's sources are the retriever's nodes, and its answer is written from their text."""
    retriever = rs_llamaindex.RaySearchRetriever(URL, similarity_top_k=3, search_kwargs={"filters": {"kind": "class"}})
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    response = engine.query("a file object for gzip files")
    results = expected(served, "a file object for gzip files", limit=3, filters={"kind": "class"})
    assert [n.node.node_id for n in response.source_nodes] == [r.chunk_id for r in results]
    assert results[0].content in str(response)  # MockLLM echoes its prompt: the context it was given


# Haystack.


def test_the_haystack_component_runs_in_a_pipeline(served):
    pipeline = Pipeline()
    pipeline.add_component("retriever", rs_haystack.RaySearchRetriever(url=URL, top_k=5,
                                                                       search_kwargs={"method": "keyword"}))
    functions = {"field": "meta.kind", "operator": "==", "value": "function"}  # Haystack's filter syntax
    found = pipeline.run({"retriever": {"query": QUERY, "filters": functions}})["retriever"]["documents"]
    results = expected(served, limit=5, method="keyword", filters={"kind": "function"})
    assert [(d.id, d.content, d.score, d.meta["doc_id"], d.meta["kind"]) for d in found] == [
        (r.chunk_id, r.content, r.relevance_score, r.doc_id, r.metadata["kind"]) for r in results]
    two = pipeline.run({"retriever": {"query": QUERY, "top_k": 2}})["retriever"]["documents"]  # no filter this time
    assert [d.id for d in two] == [r.chunk_id for r in expected(served, limit=2, method="keyword")]
    # Saved and loaded as a pipeline's YAML (the key is not saved), it answers the same.
    again = Pipeline.loads(pipeline.dumps(), allowed_modules=["raysearch_client.haystack"])
    loaded = again.run({"retriever": {"query": QUERY, "filters": functions}})["retriever"]["documents"]
    assert loaded == found


def test_the_haystack_component_runs_in_a_pipeline_run_async(served):
    pipeline = Pipeline()
    pipeline.add_component("retriever", rs_haystack.RaySearchRetriever(url=URL, top_k=3))
    found = asyncio.run(pipeline.run_async({"retriever": {"query": QUERY}}))["retriever"]["documents"]
    assert [d.id for d in found] == [r.chunk_id for r in expected(served, limit=3)]


# README.


def readme_examples() -> dict[str, str]:
    return dict(re.findall(r"<!-- adapter example: (\w+) -->\n```python\n(.*?)```", README, re.S))


def test_readme_names_each_adapter_with_its_install_line():
    assert sorted(readme_examples()) == ["haystack", "langchain", "llamaindex"]
    quick_start = README.split("## Architecture", 1)[0]
    for extra in ("", "[langchain]", "[llamaindex]", "[haystack]"):
        assert f'pip install "./client{extra}"' in README
    for name in ("LangChain", "LlamaIndex", "Haystack", "./client"):
        assert name in quick_start


@pytest.mark.parametrize("name", ["langchain", "llamaindex", "haystack"])
def test_the_readme_adapter_example_runs_as_written(served, name):
    code = readme_examples()[name].replace("http://127.0.0.1:8000", URL)
    namespace: dict = {"__name__": f"readme_{name}"}
    exec(compile(code, f"README.md ({name} example)", "exec"), namespace)  # noqa: S102 - the README's own code
    assert namespace["found"], f"the {name} example found nothing"
