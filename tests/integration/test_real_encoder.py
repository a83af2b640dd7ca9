"""The real encoder served over HTTP: MiniLM embedding each query inside the router with ONNX Runtime (the
default serving path), against the same searches in-process with sentence-transformers' torch encoder as the
oracle. Every other served-app test runs on the hashing stand-in; this one proves the router's own encoder."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from deployments.edge.schemas import SearchRequest
from deployments.search.inprocess import inprocess_pipeline
from index_build.build import build_index
from index_build.config import BuildConfig
from tests.serving import SERVE_PORT, start_serve, stop_serving

PORT = SERVE_PORT
QUERIES = ["telescope galaxy orbit", "bread oven butter", "sail wind harbor captain", "lucene shard replica"]


@pytest.fixture(scope="module")
def minilm(corpus, ray_local, tmp_path_factory):

    from deployments.settings import deploy_app

    path, _ = corpus
    summary = build_index(BuildConfig(corpus=path, out=tmp_path_factory.mktemp("minilm"), shards=2,
                                      encoder="all-MiniLM-L6-v2", chunk_size=40, chunk_overlap=8, progress=False))
    start_serve()
    deploy_app({"index": str(summary.version_dir)}, "minilm")  # defaults: ONNX encoder inside the router
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=120) as client:
        yield client, summary
    stop_serving()


@pytest.mark.parametrize("method", ["vector", "hybrid"])
def test_served_minilm_answers_as_sentence_transformers_in_process(minilm, method):
    client, summary = minilm
    oracle = inprocess_pipeline({"default": summary.version_dir}, encoder_backend="torch")
    for q in QUERIES:
        served = client.post("/search", json={"query": q, "method": method, "limit": 5})
        assert served.status_code == 200, served.text
        body = served.json()
        assert body["method_used"] == method and "embed" in body["timings_ms"] and not body["warnings"]
        expected = asyncio.run(oracle.search(SearchRequest(query=q, method=method, limit=5)))
        assert [r["chunk_id"] for r in body["results"]] == [r.chunk_id for r in expected.results], q
        assert [r["score"] for r in body["results"]] == pytest.approx([r.score for r in expected.results], abs=1e-4)


def test_a_long_question_is_answered_saying_what_the_encoder_left_out(minilm):
    """10,000 characters: answered, the dense leg from the query's first 256 tokens (MiniLM's limit), as
    sentence-transformers embeds it in-process (it truncates there too), and the response says how many tokens were
    left; one character more than router.max_query_chars is a 422 that names the setting."""
    from transformers import AutoTokenizer

    from index_format.encoders import resolve_model_path

    client, summary = minilm
    words = " ".join(QUERIES).split()
    text = " ".join(words[i % len(words)] + ("s" if i % 3 else "") for i in range(2000))[:10_000]
    assert len(text) == 10_000
    # The oracle: transformers' own tokenizer of the model folder, not the ONNX path's tokenizers library.
    oracle_tokens = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))(
        text, truncation=False, verbose=False)["input_ids"]
    served = client.post("/search", json={"query": text, "method": "vector", "limit": 5})
    assert served.status_code == 200, served.text
    body = served.json()
    assert body["warnings"] == [f"dense leg: the encoder embedded the query's first 256 of its "
                                f"{len(oracle_tokens):,} tokens (its model's limit)"]
    oracle = inprocess_pipeline({"default": summary.version_dir}, encoder_backend="torch")
    expected = asyncio.run(oracle.search(SearchRequest(query=text, method="vector", limit=5)))
    assert [r["chunk_id"] for r in body["results"]] == [r.chunk_id for r in expected.results]
    assert [r["score"] for r in body["results"]] == pytest.approx([r.score for r in expected.results], abs=1e-4)
    assert expected.warnings == body["warnings"]  # the in-process encoder counts alike
    hybrid = client.post("/search", json={"query": text, "limit": 5}).json()
    assert hybrid["method_used"] == "hybrid" and hybrid["results"] and hybrid["warnings"] == body["warnings"]
    short = client.post("/search", json={"query": "telescope galaxy", "limit": 5}).json()
    assert short["warnings"] == []
    too_long = client.post("/search", json={"query": text + "x", "limit": 5})
    assert too_long.status_code == 422 and "router.max_query_chars" in too_long.json()["error"], too_long.text
