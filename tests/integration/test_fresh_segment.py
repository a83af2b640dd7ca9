"""The fresh segment against the oracle of a full build: a document written through the API scores as the same
document does in a version built with it (real Lucene, real FAISS), and nothing in a change is applied twice."""

from __future__ import annotations

import asyncio

import numpy as np
import pyarrow.parquet as pq
import pytest

from deployments.documents.service import open_documents
from deployments.search.inprocess import InProcessEncoder, LocalIndex, open_collection
from deployments.shard.query import ShardQuery
from index_build.build import build_index
from index_build.config import BuildConfig
from index_build.tables import contents_of
from index_format.change_log import Change
from index_format.encoders import HashingEncoder
from index_format.manifest import CHUNKS_FILE, EMBEDDINGS_FILE, read_shard_manifest
from index_format.prompts import EncoderSpec
from index_format.versions import read_version_manifest
from tests.conftest import make_corpus, write_jsonl

ENCODER = "hashing:64"
COPY = 12  # the document written again under a new id


PROMPTS = {"query_prompt": "query: ", "document_prompt": "passage: "}  # each side embedded as the build did


def encoder_of(version_dir):
    """The collection's encoder as the router's client, in process: the version's model and prompts."""
    return InProcessEncoder(EncoderSpec.of(read_version_manifest(version_dir)))


@pytest.fixture(scope="module")
def indexes(ray_local, tmp_path_factory):
    """The version without the new document, and the oracle: a full build of the same corpus with it."""
    folder = tmp_path_factory.mktemp("fresh")
    docs = make_corpus(30)
    new = {**docs[COPY], "_id": "new-doc"}
    common = {"shards": 2, "encoder": ENCODER, "chunk_size": 40, "chunk_overlap": 8, "progress": False,
              "activate": True, **PROMPTS}
    base = build_index(BuildConfig(corpus=write_jsonl(folder / "base.jsonl", docs), out=folder / "base", **common))
    full = build_index(BuildConfig(corpus=write_jsonl(folder / "full.jsonl", [*docs, new]), out=folder / "full",
                                   **common))
    return folder / "base", base.version_dir, full.version_dir, new


def test_a_written_document_scores_as_in_a_full_build_on_both_legs(indexes):
    root, base_dir, full_dir, new = indexes
    docs = open_documents("default", root, base_dir, encoder_of(base_dir), 64)
    change = Change(1, [{"id": new["_id"], "title": new["title"], "text": new["text"], "metadata": new["metadata"]}])
    asyncio.run(docs._apply([change]))
    oracle = LocalIndex(full_dir)
    query = " ".join(new["text"].split()[:6])
    want_keyword = {h.chunk_id: h.score for h in oracle.bm25(query, 200) if h.chunk_id.startswith("new-doc#")}
    vector = oracle.embed([query])[0]
    want_dense = {h.chunk_id: h.score for h in oracle.dense(vector, 200) if h.chunk_id.startswith("new-doc#")}
    got = asyncio.run(docs.segment.search(ShardQuery(vector, query, 50, 50)))
    assert want_keyword and dict(got.keyword).keys() == want_keyword.keys()
    for chunk_id, score in got.keyword:  # Lucene keeps lengths lossily: equal to within it
        assert score == pytest.approx(want_keyword[chunk_id], rel=0.01), chunk_id
    assert dict(got.dense) == pytest.approx(want_dense, abs=1e-5)
    # The title as a field of its own, weighted: scored with the title's statistics, as the full build's shards do.
    titled = f"{new['title']} {query}"
    for weights in ({"contents": 1.0, "title": 0.5}, {"title": 1.0}):
        want = {h.chunk_id: h.score for h in oracle.bm25(titled, 200, weights=weights)
                if h.chunk_id.startswith("new-doc#")}
        got_weighted = asyncio.run(docs.segment.search(ShardQuery(vector, titled, 50, 50, field_weights=weights)))
        assert want and dict(got_weighted.keyword).keys() == want.keys()
        assert dict(got_weighted.keyword) == pytest.approx(want, rel=0.01), weights
    fields = docs.segment.field_scores(docs.segment.analyze(titled), [*want, "not-held#0"])
    assert sorted(fields) == ["contents", "title"] and fields["title"][-1] == 0.0
    assert fields["title"][:-1] == pytest.approx(list(want.values()), rel=0.01)  # ({"title": 1.0}, the last asked)
    # The same chunks as the build makes: ids, offsets, titles and texts.
    built = {r["chunk_id"]: r for r in oracle.fetch([h for h in oracle.bm25(query, 200) if h.chunk_id in want_keyword])}
    rows = asyncio.run(docs.segment.fetch(list(want_keyword)))
    for row in rows:
        keys = ("chunk_id", "doc_id", "char_start", "char_end", "title", "section", "text", "metadata")
        assert {k: row[k] for k in keys} == {k: built[row["chunk_id"]][k] for k in keys}


def test_the_prompts_are_recorded_and_each_side_is_embedded_with_its_own(indexes):
    """Oracle by hand: a stored chunk's vector is the model's vector of ``document_prompt + contents``; a query the
    service embeds (in process, in the router, as the evaluation does) is that of ``query_prompt + query``; and the
    prompt does change the vector (or this test would prove nothing)."""
    from deployments.serve.handles import LocalEncoder

    _, base_dir, _, _ = indexes
    manifest = read_version_manifest(base_dir)
    assert (manifest.query_prompt, manifest.document_prompt) == ("query: ", "passage: ")
    model = HashingEncoder(64)
    for shard in manifest.shards:
        folder = base_dir / "shards" / shard
        assert read_shard_manifest(folder).document_prompt == "passage: "
        contents = contents_of(pq.read_table(folder / CHUNKS_FILE), manifest.build_config["prepend_title"])
        stored = np.load(folder / EMBEDDINGS_FILE)
        np.testing.assert_allclose(stored, model.encode(["passage: " + c for c in contents]), atol=1e-6)
        assert np.abs(stored - model.encode(contents)).max() > 0.1
    query = "telescope galaxy words"
    want = model.encode(["query: " + query])[0]
    assert np.abs(want - model.encode([query])[0]).max() > 0.1
    for client in (open_collection("default", base_dir).encoder, LocalEncoder(EncoderSpec.of(manifest), "onnx")):
        np.testing.assert_allclose(asyncio.run(client.embed(query)), want, atol=1e-6)
        np.testing.assert_allclose(asyncio.run(client.embed_many(["other", query]))[1], want, atol=1e-6)
    np.testing.assert_allclose(LocalIndex(base_dir).embed([query])[0], want, atol=1e-6)


def test_a_change_is_applied_once_and_in_order(indexes):
    root, base_dir, _, _ = indexes
    docs = open_documents("default", root, base_dir, encoder_of(base_dir), 64)
    first = Change(1, [{"id": "a", "title": "", "text": "alpha words here", "metadata": {}}])
    second = Change(2, [], ["a"])
    asyncio.run(docs._apply([first, second]))
    assert docs.segment.masked == {"a"} and docs.segment.live == 0  # deleted after it was written
    assert docs.segment.apply(first, {"a": np.zeros((1, 64), np.float32)}) is False  # never again, never back
    assert docs.segment.document("a") == (True, None, []) and docs.segment.applied_seq == 2


def test_replacing_a_document_again_and_again_costs_rows_only_until_they_are_compacted(indexes, monkeypatch):
    """Dead rows are kept for points in time (``HISTORY_S``), then dropped once they outnumber the live ones."""
    import deployments.documents.segment as segment_module

    root, base_dir, _, _ = indexes
    changes = [Change(i, [{"id": "same", "title": "", "text": f"version {i} of the ocelot note", "metadata": {}}])
               for i in range(1, 1103)]
    kept = open_documents("default", root, base_dir, encoder_of(base_dir), 64)
    asyncio.run(kept._apply(changes))
    assert kept.segment.live == 1 and len(kept.segment.rows) == 1102 and kept.segment.holds(1)  # within HISTORY_S
    old = asyncio.run(kept.segment.at(7).fetch(["same#0"]))
    assert old[0]["text"] == "version 7 of the ocelot note"
    monkeypatch.setattr(segment_module, "HISTORY_S", 0.0)
    docs = open_documents("default", root, base_dir, encoder_of(base_dir), 64)
    asyncio.run(docs._apply(changes))
    segment = docs.segment
    assert segment.live == 1 and len(segment.rows) < 1002  # the dead rows were dropped once they outnumbered
    assert not segment.holds(7) and segment.holds(1102)  # a point in time before a dropped row is not whole
    got = asyncio.run(segment.search(ShardQuery(text="ocelot version 1102", k_keyword=10)))
    assert [c for c, _ in got.keyword] == ["same#0"]
    assert asyncio.run(segment.fetch(["same#0"]))[0]["text"] == "version 1102 of the ocelot note"


def test_writes_arriving_together_are_stored_and_embedded_together_each_with_its_own_seq(indexes, tmp_path):
    """Group commit: 12 writes at once cost fewer embedding calls than writes (and as few fsyncs), and every one
    is acknowledged with a seq of its own, searchable when its answer comes."""
    _, base_dir, _, _ = indexes
    encoder = encoder_of(base_dir)
    calls = []
    embed = encoder.embed_documents

    async def counted(texts):
        calls.append(len(texts))
        return await embed(texts)

    encoder.embed_documents = counted
    docs = open_documents("default", tmp_path, base_dir, encoder, 64)

    async def burst():
        return await asyncio.gather(*(docs.write([{"id": f"g{i}", "title": "", "text": f"groupword{i} words",
                                                   "metadata": {}}], [], None) for i in range(12)))

    answers = asyncio.run(burst())
    assert sorted(change.seq for change, _ in answers) == list(range(1, 13)) and all(live for _, live in answers)
    assert len(calls) < 12 and sum(calls) == 12  # the first write alone, the other 11 in one group
    assert {f"g{i}" for i in range(12)} == set(docs.segment.docs)
    from index_format.change_log import CHANGES_DIR, ChangeLog

    assert [c.seq for c in ChangeLog(tmp_path / CHANGES_DIR).read_new()] == list(range(1, 13))


def test_a_point_in_time_answers_as_a_segment_that_applied_the_log_only_that_far(indexes):
    """``at(seq)`` of a segment that went on applying writes (documents added, replaced, deleted) answers each query
    as the oracle does: a segment of the same version that applied only the writes up to ``seq``: the same hits and
    scores on both legs, the same version documents masked, the same rows fetched."""
    import random

    root, base_dir, _, _ = indexes
    rng = random.Random(5)
    words = ["ocelot", "heron", "badger", "lynx", "otter", "marten", "stoat", "vole", "shrew", "mole"]
    base_ids = [f"d{i:03d}" for i in range(6)]  # documents of the version (make_corpus's ids)
    ids = [f"w{i}" for i in range(8)] + base_ids

    def record(doc_id: str, seq: int) -> dict:
        text = " ".join(rng.choice(words) for _ in range(rng.randint(4, 30)))
        return {"id": doc_id, "title": rng.choice(words), "text": f"{text} {seq}", "metadata": {"n": seq % 3}}

    changes = []
    for seq in range(1, 41):
        doc_id = rng.choice(ids)
        changes.append(Change(seq, [], [doc_id]) if rng.random() < 0.25 and seq > 3 else
                       Change(seq, [record(doc_id, seq)]))
    moving = open_documents("default", root, base_dir, encoder_of(base_dir), 64)
    asyncio.run(moving._apply(changes))
    vector = np.asarray(asyncio.run(encoder_of(base_dir).embed("ocelot heron lynx")), dtype=np.float32)
    query = ShardQuery(text="ocelot heron lynx", vector=vector, k_dense=20, k_keyword=20)
    filtered = ShardQuery(text="otter vole", vector=vector, k_dense=20, k_keyword=20, filters={"n": {"ne": 1}})
    for seq in (3, 11, 24, 39):
        oracle = open_documents("default", root, base_dir, encoder_of(base_dir), 64)
        asyncio.run(oracle._apply(changes[:seq]))
        view = moving.segment.at(seq)
        assert view.applied_seq == seq and view.masked == oracle.segment.masked and view.live == oracle.segment.live
        for q in (query, filtered):
            got, want = asyncio.run(view.search(q)), asyncio.run(oracle.segment.search(q))
            assert [c for c, _ in got.dense] == [c for c, _ in want.dense], seq
            assert [c for c, _ in got.keyword] == [c for c, _ in want.keyword], seq
            np.testing.assert_allclose([s for _, s in got.dense + got.keyword],
                                       [s for _, s in want.dense + want.keyword], rtol=1e-6)
            hits = [c for c, _ in want.dense + want.keyword]
            assert asyncio.run(view.fetch(hits)) == asyncio.run(oracle.segment.fetch(hits))
    assert moving.segment.at(40) is moving.segment  # the last write's point in time is the segment itself
