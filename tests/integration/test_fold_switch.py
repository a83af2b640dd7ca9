"""A replica's fresh segment across version switches: a fold's version takes over what it holds (the segment lets
go of it, keeps what came after), a rollback to a version holding fewer writes gets them back from the log, and
the segment requests on the old version still use is left as it was (real Lucene, FAISS, Ray tasks)."""

from __future__ import annotations

import asyncio

import pytest

from deployments.documents.service import open_documents
from deployments.search.inprocess import InProcessEncoder
from index_build.build import build_index
from index_build.config import BuildConfig
from index_build.fold import fold
from index_format.prompts import EncoderSpec
from index_format.versions import versions_dir
from tests.conftest import make_corpus, write_jsonl

ENCODER = "hashing:64"


def Encoder():  # noqa: N802 - the collection's encoder as the router's client, in process
    return InProcessEncoder(EncoderSpec(ENCODER))


def _doc(doc_id: str, text: str) -> dict:
    return {"id": doc_id, "title": "", "text": text, "metadata": {}}


@pytest.fixture(scope="module")
def root(ray_local, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fold-switch")
    build_index(BuildConfig(corpus=write_jsonl(folder / "v1.jsonl", make_corpus(30)), out=folder / "index",
                            version="v1", encoder=ENCODER, shards=2, chunk_size=40, chunk_overlap=8, progress=False))
    return folder / "index"


def test_a_switch_to_a_fold_lets_go_of_what_it_holds_and_a_rollback_gets_it_back(root):
    docs = open_documents("default", root, versions_dir(root) / "v1", Encoder(), 64)
    run = asyncio.run
    run(docs.write([_doc("w1", "first written words"), _doc("d003", "replaced text")], [], None))
    run(docs.write([], ["d004"], None))
    folded = fold(root, version="v2")
    assert folded.log_seq == 2
    run(docs.write([_doc("w2", "written after the fold")], ["w1"], None))
    before = docs.segment
    assert set(before.docs) == {"w1", "d003", "d004", "w2"} and before.applied_seq == 3

    after = run(docs.rebase(versions_dir(root) / "v2"))
    assert docs.segment is after and after.log_seq == 2 and after.applied_seq == 3
    assert set(after.docs) == {"w1", "w2"}  # w1 deleted at seq 3 stays masked; d003, d004 are in v2 now
    assert after.document("w1") == (True, None, []) and after.live == 1
    assert set(before.docs) == {"w1", "d003", "d004", "w2"}  # requests still on v1 see what they saw

    run(docs.write([_doc("w3", "after the switch")], [], None))
    assert "w3" in docs.segment.docs and "w3" not in before.docs

    back = run(docs.rebase(versions_dir(root) / "v1"))  # v1 holds none of the writes: all of them again
    assert back.log_seq == 0 and back.applied_seq == 4
    assert set(back.docs) == {"w1", "d003", "d004", "w2", "w3"}
    assert back.document("d004") == (True, None, []) and back.document("d003")[1].text == "replaced text"


def test_a_replica_started_on_a_folded_version_reads_only_the_writes_past_it(root):
    docs = open_documents("default", root, versions_dir(root) / "v2", Encoder(), 64)
    assert asyncio.run(docs.catch_up()) == 4
    assert set(docs.segment.docs) == {"w1", "w2", "w3"}  # seq 3 and 4; seq 1 and 2 are in v2
