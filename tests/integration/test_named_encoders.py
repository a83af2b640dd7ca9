"""A version holding a second, named encoder (``index_build.add_encoder``): its vectors are the encoder's own (the
oracle: the encoder run here on each chunk's contents), the base version is left as it was, vectors are reused by
text, a request's dense leg under that encoder is brute force over its vectors, its cosine reaches the ranking
features, and a fold embeds written documents with every encoder."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from deployments.documents.service import open_documents
from deployments.edge.schemas import SearchRequest
from deployments.errors import InvalidRequest
from deployments.search.inprocess import InProcessEncoder, inprocess_pipeline
from deployments.shard.features import FeatureQuery
from deployments.shard.query import ShardQuery
from index_build.add_encoder import add_encoder
from index_build.build import build_index
from index_build.config import BuildConfig
from index_build.fold import fold
from index_build.tables import contents_of
from index_format.change_log import CHANGES_DIR, Change, ChangeLog
from index_format.encoders import HashingEncoder
from index_format.manifest import CHUNKS_FILE, EMBEDDINGS_FILE, IndexMismatch, encoder_dir
from index_format.prompts import EncoderSpec
from index_format.versions import active_version, read_version_manifest, verify_version
from tests.conftest import make_corpus, write_jsonl
from tests.serving import SERVE_PORT, start_serve, stop_serving
from tests.waiting import wait_until

QUERIES = ["telescope galaxy", "bread oven butter", "boat wind anchor", "piano chord"]


@pytest.fixture(scope="module")
def root(ray_local, tmp_path_factory):
    folder = tmp_path_factory.mktemp("named")
    corpus = write_jsonl(folder / "corpus.jsonl", make_corpus(40, seed=5))
    base = build_index(BuildConfig(corpus=corpus, out=folder / "index", shards=2, encoder="hashing:32",
                                   chunk_size=40, chunk_overlap=8, progress=False))
    before = {p: (os.stat(p).st_ino, p.read_bytes()) for p in base.version_dir.rglob("*") if p.is_file()}
    added = add_encoder(folder / "index", "small", "hashing:16", document_prompt="passage: ", progress=False)
    return {"root": folder / "index", "base": base, "before": before, "added": added}


def version_of(root, name):
    return root / "versions" / name


def chunk_contents(shard_dir) -> tuple[list[str], list[str]]:
    table = pq.read_table(shard_dir / CHUNKS_FILE)
    return table["chunk_id"].to_pylist(), contents_of(table, True)


def named_vectors(version_dir, name: str) -> dict[str, np.ndarray]:
    out = {}
    for shard in read_version_manifest(version_dir).shards:
        folder = version_dir / "shards" / shard
        ids, _ = chunk_contents(folder)
        out.update(zip(ids, np.load(folder / encoder_dir(name) / EMBEDDINGS_FILE), strict=True))
    return out


def oracle_vectors(version_dir, prompt: str = "passage: ", dimension: int = 16) -> dict[str, np.ndarray]:
    """Each chunk's vector as the named encoder (by default) gives it, computed here from the chunk's contents."""
    out = {}
    for shard in read_version_manifest(version_dir).shards:
        ids, contents = chunk_contents(version_dir / "shards" / shard)
        out.update(zip(ids, HashingEncoder(dimension).encode(contents, prompt=prompt), strict=True))
    return out


def test_the_new_version_holds_the_encoders_vectors_and_leaves_the_base_alone(root):
    added, new_dir = root["added"], version_of(root["root"], root["added"].version)
    assert active_version(root["root"]) == added.version
    manifest = verify_version(new_dir)
    assert manifest.encoders["small"].encoder == "hashing:16" and manifest.encoders["small"].dimension == 16
    assert manifest.encoders["small"].document_prompt == "passage: "
    assert manifest.encoder == "hashing:32"  # its own encoder stays
    stored, oracle = named_vectors(new_dir, "small"), oracle_vectors(new_dir)
    assert stored.keys() == oracle.keys() and len(stored) == manifest.counts["chunks"] == added.chunks
    for cid, vector in oracle.items():
        np.testing.assert_allclose(stored[cid], vector, atol=1e-6)
    assert (added.embedded, added.reused) == (added.chunks, 0)
    for path, (inode, data) in root["before"].items():  # the base is as it was, its files shared by links
        assert path.read_bytes() == data
        linked = new_dir / path.relative_to(root["base"].version_dir)
        if path.name == CHUNKS_FILE:
            assert os.stat(linked).st_ino == inode


def test_vectors_are_reused_by_text_and_names_are_checked(root):
    again = add_encoder(root["root"], "again", "hashing:16", document_prompt="passage: ", progress=False,
                        do_activate=False)
    assert (again.reused, again.embedded) == (again.chunks, 0)
    assert again.reused_from == {root["added"].version: again.chunks}
    new_dir = version_of(root["root"], again.version)
    assert set(read_version_manifest(new_dir).encoders) == {"small", "again"}
    for cid, vector in named_vectors(new_dir, "small").items():
        np.testing.assert_array_equal(named_vectors(new_dir, "again")[cid], vector)
    with pytest.raises(IndexMismatch, match="already holds an encoder named 'small'"):
        add_encoder(root["root"], "small", "hashing:8", progress=False)
    with pytest.raises(ValueError, match="not valid"):
        add_encoder(root["root"], "Dense_2", "hashing:8", progress=False)
    with pytest.raises(ValueError, match="already exists"):
        add_encoder(root["root"], "other", "hashing:8", version=again.version, progress=False)
    with pytest.raises(ValueError, match="version name '../x' is not valid"):
        add_encoder(root["root"], "other", "hashing:8", version="../x", progress=False)
    assert active_version(root["root"]) == root["added"].version


@pytest.fixture(scope="module")
def pipeline(root):
    return inprocess_pipeline({"default": version_of(root["root"], root["added"].version)})


def test_a_request_searches_with_the_named_encoder_exactly(root, pipeline):
    oracle = oracle_vectors(version_of(root["root"], root["added"].version))
    ids = list(oracle)
    matrix = np.stack([oracle[c] for c in ids])
    differs = []
    for text in QUERIES:
        got = asyncio.run(pipeline.search(SearchRequest(query=text, method="vector", encoder="small", limit=10)))
        brute = matrix @ HashingEncoder(16).encode([text])[0]
        tenth = np.sort(brute)[-10]
        returned = [r.chunk_id for r in got.results]
        assert all(brute[ids.index(c)] >= tenth - 1e-5 for c in returned), text
        surely = {ids[i] for i in np.flatnonzero(brute > tenth + 1e-4)}
        assert surely <= set(returned), text
        own = asyncio.run(pipeline.search(SearchRequest(query=text, method="vector", limit=10)))
        differs.append([r.chunk_id for r in own.results] != returned)
    assert any(differs)  # the version's own encoder ranks otherwise: the request did choose the encoder
    with pytest.raises(InvalidRequest, match="holds no encoder named 'large'; it holds: small"):
        asyncio.run(pipeline.search(SearchRequest(query="piano", encoder="large")))
    with pytest.raises(ValueError, match="encoder and mmr_lambda"):
        SearchRequest(query="piano", encoder="small", mmr_lambda=0.5)


def test_the_ranking_features_hold_each_named_encoders_cosine(root, pipeline):
    oracle = oracle_vectors(version_of(root["root"], root["added"].version))
    own_oracle = oracle_vectors(version_of(root["root"], root["added"].version), "", 32)
    for text, encoder in (("telescope galaxy", None), ("bread oven butter", "small")):
        table = asyncio.run(pipeline.ranking_features(SearchRequest(query=text, encoder=encoder)))
        query = HashingEncoder(16).encode([text])[0]
        expected = np.array([oracle[h.chunk_id] @ query for h in table.hits])
        np.testing.assert_allclose(table.columns["dense_small"], expected, atol=1e-5)
        np.testing.assert_allclose(table.columns["dense_gap_small"], expected.max() - expected, atol=1e-5)
        own = HashingEncoder(32).encode([text])[0]  # the version's own cosine, whichever encoder the leg searched
        np.testing.assert_allclose(table.columns["dense"], [own_oracle[h.chunk_id] @ own for h in table.hits],
                                   atol=1e-5)


def test_a_fold_embeds_written_documents_with_every_encoder(root):
    log = ChangeLog(root["root"] / CHANGES_DIR)
    log.append([{"id": "n001", "title": "zebra", "text": "zebra stripes on the savanna " * 12, "metadata": {}},
                {"id": "d003", "title": "replaced", "text": "a telescope saw a galaxy over the oven", "metadata": {}}],
               ["d007"])
    summary = fold(root["root"])
    folded = version_of(root["root"], summary.version)
    manifest = verify_version(folded)
    assert set(manifest.encoders) == {"small"}
    stored, oracle = named_vectors(folded, "small"), oracle_vectors(folded)
    assert stored.keys() == oracle.keys()
    assert any(c.startswith("n001#") for c in stored) and not any(c.startswith("d007#") for c in stored)
    for cid, vector in oracle.items():
        np.testing.assert_allclose(stored[cid], vector, atol=1e-6, err_msg=cid)


def test_written_documents_are_embedded_with_every_encoder(root):
    """The fresh segment of a version holding a named encoder: a written document's chunks get that encoder's
    vectors at once, so its dense leg and its cosine feature find them before any fold."""
    version_dir = version_of(root["root"], root["added"].version)
    manifest = read_version_manifest(version_dir)
    docs = open_documents("default", root["root"], version_dir, InProcessEncoder(EncoderSpec.of(manifest)), 32,
                          {"small": InProcessEncoder(manifest.encoders["small"].spec)})
    change = Change(1, [{"id": "fresh-1", "title": "zebra", "text": "a zebra crossed the savanna at dusk " * 12,
                         "metadata": {}}])
    asyncio.run(docs._apply([change]))
    ids = [r["chunk_id"] for _, rows, _ in docs.segment.chunk(change) for r in rows]
    texts = [t for *_, ts in docs.segment.chunk(change) for t in ts]
    oracle = dict(zip(ids, HashingEncoder(16).encode(texts, prompt="passage: "), strict=True))
    query = HashingEncoder(16).encode(["zebra savanna"])[0]
    got = asyncio.run(docs.segment.search(ShardQuery(vector=query, k_dense=10, encoder="small")))
    assert dict(got.dense) == pytest.approx({c: float(v @ query) for c, v in oracle.items()}, abs=1e-5)
    features = asyncio.run(docs.segment.features(FeatureQuery("zebra savanna", ids, None, None, {"small": query})))
    np.testing.assert_allclose(features["dense_small"], [oracle[c] @ query for c in ids], atol=1e-5)


PORT = SERVE_PORT


def test_served_the_named_encoder_has_its_query_encoder_and_answers_as_in_process(root, pipeline):
    """Through Serve (the named encoder's query encoder a deployment of its own): a search under it answers as the
    in-process pipeline does, and one naming an encoder the version lacks is a 400 naming those it has."""
    import httpx
    from ray import serve

    from deployments.serve.app import build_app

    start_serve()
    try:
        serve.run(build_app({"index": str(version_of(root["root"], root["added"].version)),
                             "router": {"shard_timeout_s": 10, "cache_size": 0}}),
                  name="named", route_prefix="/", blocking=False)
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as client:
            wait_until(lambda: client.get("/health").status_code == 200, 120, "the app answers", every_s=0.5)
            for text in QUERIES[:2]:
                body = {"query": text, "method": "hybrid", "encoder": "small", "limit": 8}
                r = client.post("/search", json=body)
                assert r.status_code == 200, r.text
                local = asyncio.run(pipeline.search(SearchRequest(**body)))
                assert [x["chunk_id"] for x in r.json()["results"]] == [x.chunk_id for x in local.results]
            r = client.post("/search", json={"query": "piano", "encoder": "large"})
            assert r.status_code == 400 and "it holds: small" in r.json()["error"]
    finally:
        stop_serving()
