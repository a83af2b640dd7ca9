"""Builds into a root in object storage (a local S3 server): the version equals a local build of the same corpus,
a rebuild uploads only manifests, ACTIVE moves only by compare-and-swap, a corpus or a delta may be a URL, and the
versions command takes a URL. Real Ray, FAISS and Lucene; the hashing encoder, so vectors are exact."""

from __future__ import annotations

import random

import boto3
import numpy as np
import pyarrow.parquet as pq
import pytest

from index_build.build import build_index
from index_build.config import BuildConfig
from index_build.target import ActivationRefused
from index_build.versions import main as versions_main
from index_format import object_root
from index_format.manifest import CHUNKS_FILE, EMBEDDINGS_FILE, sha256_file
from index_format.object_root import ObjectRoot
from index_format.store import open_store
from index_format.versions import active_version, list_versions, read_version_manifest
from tests.conftest import fake_version, write_jsonl
from tests.integration.conftest import ENCODER
from tests.versions_equal import assert_versions_equal

OPTIONS = {"encoder": ENCODER, "chunk_size": 40, "chunk_overlap": 8, "shards": 3, "progress": False}  # as `built`


@pytest.fixture(scope="module")
def node_cache(tmp_path_factory):
    """This node's cache (ObjectRoot's default) in a temporary folder, for the module."""
    cache = tmp_path_factory.mktemp("node-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(object_root, "default_cache_dir", lambda: cache)
        yield cache


@pytest.fixture(scope="module")
def builds(corpus, built, s3_server, node_cache):
    """The corpus's local 3-shard build (``built``), and the same built into a root in object storage (v1), then
    into that root again (v2)."""
    path, _ = corpus
    bucket = f"remote-build-{random.randrange(10**9)}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/idx"
    first = build_index(BuildConfig(corpus=path, out=url, version="v1", **OPTIONS))
    again = build_index(BuildConfig(corpus=path, out=url, version="v2", **OPTIONS))
    cfg, local = built[3]
    return {"url": url, "bucket": bucket, "local": local, "local_root": cfg.out, "first": first, "again": again}


def test_a_build_into_object_storage_equals_a_local_build(builds, tmp_path):
    """Searched in the version as a fresh node fetches it from the store."""
    url, local, first = builds["url"], builds["local"], builds["first"]
    folder, fetched = ObjectRoot(url, cache_dir=tmp_path / "fresh-node").fetch("v1")
    assert fetched["bytes_downloaded"] == first.publish["bytes"] > 0
    assert read_version_manifest(folder).corpus == read_version_manifest(local.version_dir).corpus
    assert_versions_equal(local.version_dir, folder)
    assert (first.docs, first.chunks, first.bad_count) == (local.docs, local.chunks, local.bad_count) == (60, local.chunks, 3)
    assert list_versions(url) == ["v1", "v2"] and active_version(url) == "v2"
    assert f"{url}/versions/v1" in first.render() and "uploaded" in first.render()


def test_the_shard_tasks_upload_the_shards_and_a_rebuild_uploads_only_manifests(builds):
    first, again = builds["first"], builds["again"]
    shard_files = sum(p.stat().st_size for p in (first.version_dir / "shards").rglob("*") if p.is_file())
    assert first.publish["bytes_uploaded_by_shards"] == shard_files  # the driver sent only the top-level files
    assert first.publish["bytes_uploaded"] == first.publish["bytes"]  # a new root: every byte once
    # The same corpus again: its shards are linked from v1 (already on this node: nothing fetched) and their files
    # are blobs already there; only what names the new version is new. A shard manifest rewritten within the second
    # v1 wrote its own is the same bytes, hence the same blob: the oracle is the set of checksums v1 does not have.
    assert again.reuse["shards_linked"] == {"0": "v1", "1": "v1", "2": "v1"} and again.fetched["bytes_downloaded"] == 0
    def blobs(folder):
        return {sha256_file(p): p for p in sorted(folder.rglob("*")) if p.is_file()}
    new = {sha: p for sha, p in blobs(again.version_dir).items() if sha not in blobs(first.version_dir)}
    assert {p.name for p in new.values()} <= {"manifest.json", "build.json"}
    assert (again.version_dir / "manifest.json") in new.values()
    assert again.publish["bytes_uploaded"] == sum(p.stat().st_size for p in new.values())
    # Small against the version (5.1% here: the manifests name the encoder's prompts, 240 bytes over them).
    assert again.publish["bytes_uploaded"] < again.publish["bytes"] / 15


def test_an_activation_since_the_build_started_is_not_overwritten(builds, corpus, s3_root, tmp_path, monkeypatch):
    """Another publisher activates a version between this build's start and its publish: the build's compare-and-swap
    fails, its version stays published and inactive, and the message says how to activate it."""
    publish = ObjectRoot.publish

    def theirs_first(self, version_dir, name, uploaded=None):
        if name == "mine":
            publish(self, fake_version(tmp_path / "theirs", "theirs"), "theirs")
            self.activate("theirs", by="someone else")
        return publish(self, version_dir, name, uploaded)

    monkeypatch.setattr(ObjectRoot, "publish", theirs_first)
    cfg = BuildConfig(corpus=corpus[0], out=s3_root, version="mine", reuse_from=builds["local_root"],
                      **OPTIONS)  # its shards linked from the local root: no embedding, no Lucene
    with pytest.raises(ActivationRefused) as refused:
        build_index(cfg)
    message = str(refused.value)
    assert "\n" not in message and "'mine' is published" in message and "but not active" in message
    assert f"python -m index_build.versions activate {s3_root} mine" in message
    assert list_versions(s3_root) == ["mine", "theirs"] and active_version(s3_root) == "theirs"
    assert versions_main(["activate", s3_root, "mine"]) == 0 and active_version(s3_root) == "mine"


def test_a_corpus_in_object_storage_builds_what_the_local_file_builds(builds, corpus, tmp_path):
    path, _ = corpus
    corpus_url = f"s3://{builds['bucket']}/data/corpus.jsonl"
    open_store(f"s3://{builds['bucket']}").upload(path, "data/corpus.jsonl")
    summary = build_index(BuildConfig(corpus=corpus_url, out=tmp_path / "idx", reuse_from=builds["url"], **OPTIONS))
    local = builds["local"]
    manifest = read_version_manifest(summary.version_dir)
    assert manifest.corpus == {"path": corpus_url, "sha256": read_version_manifest(local.version_dir).corpus["sha256"],
                               "format": "jsonl"}
    assert [(r.file, r.line) for r in summary.bad_records] == [(corpus_url, 11), (corpus_url, 12), (corpus_url, 63)]
    for shard in manifest.shards:
        a, b = summary.version_dir / "shards" / shard, local.version_dir / "shards" / shard
        ta, tb = pq.read_table(a / CHUNKS_FILE), pq.read_table(b / CHUNKS_FILE)
        assert ta.drop(["source"]).equals(tb.drop(["source"]))
        assert [s.replace(corpus_url, str(path)) for s in ta["source"].to_pylist()] == tb["source"].to_pylist()
        assert np.array_equal(np.load(a / EMBEDDINGS_FILE), np.load(b / EMBEDDINGS_FILE))
    assert not (tmp_path / "idx" / "staging" / "_inputs").exists()  # the downloaded corpus is gone


def test_a_delta_from_object_storage_applies_to_the_active_version_there(builds, corpus, tmp_path):
    """A changes file in object storage applied to the root's active version, fetched into this node's cache."""
    url, bucket = builds["url"], builds["bucket"]
    _, docs = corpus
    # Texts the base already holds (its vectors are reused: no embedding here, only the touched shards' Lucene).
    changes = write_jsonl(tmp_path / "changes.jsonl", [docs[2] | {"_id": "d001"}, docs[3] | {"_id": "n001"}])
    open_store(f"s3://{bucket}").upload(changes, "delta/changes.jsonl")
    deletes = write_jsonl(tmp_path / "deletes.txt", ["d005", "nope"])
    summary = build_index(BuildConfig(changes=f"s3://{bucket}/delta/changes.jsonl", deletes=deletes, out=url,
                                      version="v3", activate=False, **OPTIONS))
    assert summary.delta == {"base": "v2", "replaced": 1, "added": 1, "deleted": 1}
    assert summary.docs == 60 + 1 - 1 and active_version(url) == "v2" and "v3" in list_versions(url)
    record = read_version_manifest(summary.version_dir).corpus["delta"]
    assert record["changes"]["path"] == f"s3://{bucket}/delta/changes.jsonl" and record["deletes"]["path"] == str(deletes)
    assert [(r.file, r.line) for r in summary.bad_records] == [(str(deletes), 2)]  # "nope": no such document
    assert summary.publish["bytes_uploaded"] < summary.publish["bytes"]  # unchanged blobs are references


def test_the_versions_command_takes_a_url(builds, capsys):
    url = builds["url"]
    assert versions_main(["list", url]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in listed if "v2" in line.split()[:2]] == [["*", "v2"]]
    assert any(line.split()[0] == "v1" for line in listed)
    assert versions_main(["activate", url, "v1"]) == 0 and active_version(url) == "v1"
    assert versions_main(["rollback", url]) == 0 and active_version(url) == "v2"
    assert "rolled back: active version v2 (was v1)" in capsys.readouterr().out
    assert versions_main(["history", url]) == 0
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()] == ["v1", "v2", "v1", "v2"]
    assert versions_main(["verify", url, "v1"]) == 0 and "v1: 3 shards verified" in capsys.readouterr().out
    assert versions_main(["activate", url, "nope"]) == 1 and "no such version" in capsys.readouterr().err


def test_an_encoder_added_to_a_root_in_object_storage_is_published_there(builds, capsys):
    """``add_encoder`` on a URL: each shard read and written by Ray Data's tasks (any node's; here the one), the new
    version uploaded beside its base (only its encoder's files are new bytes), its vectors the encoder's own, the
    active version left alone when asked."""
    from index_build.add_encoder import add_encoder
    from index_build.tables import contents_of
    from index_format.encoders import HashingEncoder
    from index_format.manifest import encoder_dir
    from index_format.versions import verify_published, version_dir

    url = builds["url"]
    live = active_version(url)
    added = add_encoder(url, "small", "hashing:16", base="v2", version="v2-small", do_activate=False,
                        progress=False)
    assert added.embedded == added.chunks > 0
    stages = " ".join(added.stages)
    assert "read shards: " in stages and "embed: " in stages and "write shards: " in stages, stages
    assert "v2-small" in list_versions(url) and active_version(url) == live
    manifest = verify_published(url, "v2-small")
    assert manifest.encoders["small"].encoder == "hashing:16"
    capsys.readouterr()
    assert versions_main(["list", url]) == 0
    assert any(line.split()[0] == "v2-small" and "+ small (hashing:16)" in line
               for line in capsys.readouterr().out.splitlines())
    folder = version_dir(url, "v2-small", shards=None)
    for shard in manifest.shards:
        table = pq.read_table(folder / "shards" / shard / CHUNKS_FILE)
        stored = np.load(folder / "shards" / shard / encoder_dir("small") / EMBEDDINGS_FILE)
        np.testing.assert_allclose(stored, HashingEncoder(16).encode(contents_of(table, True)), atol=1e-6)
