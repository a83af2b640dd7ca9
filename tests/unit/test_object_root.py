"""A root in object storage: publish, activate with compare-and-swap, fetch to a node's cache, remove."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from index_format import versions
from index_format.manifest import IndexMismatch
from index_format.object_root import ObjectRoot
from index_format.store import Conflict
from tests.conftest import fake_version


def local_version(folder: Path, name: str, shards: int = 2, payload: bytes = b"") -> Path:
    fake_version(folder, name, shards=shards)
    for i in range(shards):
        (folder / "shards" / f"shard-{i:03d}" / "chunks.parquet").write_bytes(f"shard {i} rows".encode() + payload)
    (folder / "bm25").mkdir()
    (folder / "bm25" / "stats.json").write_text("{}")
    return folder


@pytest.fixture
def root(s3_root, tmp_path) -> ObjectRoot:
    return ObjectRoot(s3_root, cache_dir=tmp_path / "cache")


def test_publish_then_fetch_equals_the_local_folder(root, tmp_path):
    src = local_version(tmp_path / "v1", "v1")
    sent = root.upload_version(src, "v1")
    assert root.versions() == ["v1"] and root.active() is None
    assert sent["bytes_uploaded"] == sent["bytes"] == sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    folder, got = root.fetch("v1")
    assert sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file()) == \
        sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
    assert all((folder / p.relative_to(src)).read_bytes() == p.read_bytes() for p in src.rglob("*") if p.is_file())
    assert got["bytes_downloaded"] == sent["bytes"]
    assert root.fetch("v1")[1]["bytes_downloaded"] == 0  # a second start downloads nothing
    other = ObjectRoot(root.url, cache_dir=root.cache_dir)  # another replica on the same node
    assert other.fetch("v1")[1]["bytes_downloaded"] == 0


def test_a_replica_fetches_only_its_shards(root, tmp_path):
    root.upload_version(local_version(tmp_path / "v1", "v1", shards=3), "v1")
    folder, _ = root.fetch("v1", shards=["shard-001"])
    assert sorted(p.name for p in (folder / "shards").iterdir()) == ["shard-001"]
    assert (folder / "manifest.json").is_file() and (folder / "bm25" / "stats.json").is_file()


def test_a_shared_file_is_uploaded_and_downloaded_once(root, tmp_path):
    """A second version with one shard changed sends and fetches only that shard's new bytes."""
    one = local_version(tmp_path / "v1", "v1")
    root.upload_version(one, "v1")
    two = tmp_path / "v2"
    shutil.copytree(one, two)
    (two / "shards" / "shard-001" / "chunks.parquet").write_bytes(b"changed")
    (two / "manifest.json").write_text((two / "manifest.json").read_text().replace('"v1"', '"v2"'))
    sent = root.upload_version(two, "v2")
    assert sent["bytes_uploaded"] == len(b"changed") + (two / "manifest.json").stat().st_size
    root.fetch("v1")
    assert root.fetch("v2")[1]["bytes_downloaded"] == sent["bytes_uploaded"]


def test_a_corrupt_blob_is_refused(root, tmp_path):
    root.upload_version(local_version(tmp_path / "v1", "v1"), "v1")
    sha = root.files("v1")["shards/shard-000/chunks.parquet"]["sha256"]
    root.store.put(f"blobs/{sha}", b"bit rot")
    with pytest.raises(IndexMismatch, match="do not match its checksum"):
        root.fetch("v1")
    assert not (root.cache_dir / "blobs" / sha).exists()


def test_activate_is_a_compare_and_swap(root, tmp_path):
    for name in ("v1", "v2", "v3"):
        root.upload_version(local_version(tmp_path / name, name), name)
    assert root.activate("v1") is None
    seen = root.active_tagged()  # a build reads ACTIVE when it starts ...
    assert root.activate("v2", by="other") == "v1"  # ... another publisher wins meanwhile
    with pytest.raises(Conflict, match="moved from v1 to v2"):
        root.activate("v3", expect=seen)
    assert root.active() == "v2"
    assert [(e["version"], e["previous"]) for e in root.history()] == [("v1", None), ("v2", "v1")]
    with pytest.raises(IndexMismatch):
        root.activate("nope")


def test_publish_refuses_an_existing_name(root, tmp_path):
    root.upload_version(local_version(tmp_path / "v1", "v1"), "v1")
    with pytest.raises(FileExistsError):
        root.upload_version(local_version(tmp_path / "again", "v1"), "v1")


def test_remove_keeps_the_blobs_another_version_shares(root, tmp_path):
    one = local_version(tmp_path / "v1", "v1")
    root.upload_version(one, "v1")
    two = tmp_path / "v2"
    shutil.copytree(one, two)
    (two / "shards" / "shard-000" / "chunks.parquet").write_bytes(b"only in v2")
    root.upload_version(two, "v2")
    root.activate("v2")
    with pytest.raises(ValueError, match="active"):
        root.remove("v2")
    assert root.remove("v1") == {"collected": True, "files_deleted": 1}  # v1's own shard-000 bytes; v2 shares the rest
    assert root.versions() == ["v2"]
    folder, _ = ObjectRoot(root.url, cache_dir=tmp_path / "fresh").fetch("v2")
    assert (folder / "shards" / "shard-001" / "chunks.parquet").read_bytes() == b"shard 1 rows"


def test_versions_functions_take_a_url(root, tmp_path):
    """The versions API a local root has, on a URL: list, activate, history, rollback, resolve, remove."""
    url = root.url
    for name in ("v1", "v2"):
        root.upload_version(local_version(tmp_path / name, name), name)
    with pytest.raises(IndexMismatch, match="no active index version; versions there: v1, v2"):
        versions.resolve_version_dir(url, cache_dir=root.cache_dir)
    versions.activate(url, "v1")
    versions.activate(url, "v2")
    assert versions.list_versions(url) == ["v1", "v2"] and versions.active_version(url) == "v2"
    assert versions.rollback(url) == ("v2", "v1")
    folder = versions.resolve_version_dir(url, cache_dir=root.cache_dir)
    assert versions.read_version_manifest(folder).version == "v1"
    versions.remove_version(url, "v2")
    assert versions.list_versions(url) == ["v1"]


def test_publish_neither_reads_nor_sends_what_the_shard_tasks_uploaded(root, tmp_path):
    src = local_version(tmp_path / "v1", "v1")
    shard = src / "shards" / "shard-000"
    files, sent = root.upload_files(shard)  # what a shard task does once it commits
    rest = sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and shard not in p.parents)
    original = (shard / "chunks.parquet").read_bytes()
    (shard / "chunks.parquet").write_bytes(b"not read by publish")  # (the driver may not even see a shard's files)
    sent_now = root.upload_version(src, "v1", {f"shards/shard-000/{rel}": f for rel, f in files.items()})
    assert sent > 0 and sent_now["bytes_uploaded"] == rest and sent_now["bytes"] == rest + sent
    (shard / "chunks.parquet").write_bytes(original)
    folder, _ = ObjectRoot(root.url, cache_dir=tmp_path / "fresh").fetch("v1")  # and the version has every file
    assert sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file()) == \
        sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())


def test_a_version_published_from_this_node_is_its_cached_copy(root):
    staged = local_version(root.local_root() / "staging" / "key", "v1")
    root.upload_version(staged, "v1")
    folder = root.keep(staged, "v1")
    assert folder == root.local_root() / "versions" / "v1" and not staged.exists()
    assert root.fetch("v1")[1]["bytes_downloaded"] == 0  # serving it, or reusing it, downloads nothing here
