"""One contract, two kinds of root: every case runs on a folder and on object storage (the local S3 server)."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from index_format.manifest import IndexMismatch
from index_format.root import VersionHeld
from index_format.store import Conflict
from index_format.versions import open_root
from tests.conftest import fake_version


@pytest.fixture(params=["folder", "object storage"])
def root(request, tmp_path):
    if request.param == "folder":
        return open_root(tmp_path / "root")
    return open_root(request.getfixturevalue("s3_root"), cache_dir=tmp_path / "cache")


def staged(root, name: str, files: dict[str, bytes], manifest_says: dict[str, bytes] | None = None) -> Path:
    """A version's staging folder with one shard holding ``files`` (its manifest records ``manifest_says``' checksums
    instead, when given: a version whose files are not what was built). Staged where the root stages: its folder, or
    this node's copy of the root in object storage."""
    base = root.local_root() if root.shared_by_nodes else root.folder
    folder = fake_version(base / "staging" / name, name)
    shard = folder / "shards" / "shard-000"
    for rel, data in files.items():
        (shard / rel).write_bytes(data)
    m = json.loads((shard / "manifest.json").read_text())
    m["checksums"] = {rel: hashlib.sha256(data).hexdigest() for rel, data in (manifest_says or files).items()}
    (shard / "manifest.json").write_text(json.dumps(m))
    return folder


def published(root, name: str, files: dict[str, bytes]) -> None:
    root.publish(staged(root, name, files), name)


def read_file(root, name: str, rel: str, tmp_path: Path) -> bytes:
    """A version's file as a fresh node reads it (object storage: fetched into a new cache)."""
    fresh = open_root(root.url, cache_dir=tmp_path / f"fresh-{time.monotonic_ns()}") if root.shared_by_nodes else root
    return (fresh.version_dir(name, None) / "shards" / "shard-000" / rel).read_bytes()


def test_activation_is_a_compare_and_swap_recorded_in_one_history(root):
    for name in ("v1", "v2"):
        published(root, name, {"rows.bin": name.encode()})
    assert root.activate("v1") is None and root.activate("v2", by="api") == "v1"
    assert [(e["version"], e["previous"], e["by"]) for e in root.history()] == [("v1", None, "cli"), ("v2", "v1", "api")]
    with pytest.raises(Conflict, match="moved from none to v2"):
        root.activate("v1", expect=(None, None))  # as a job that started before any activation would
    assert root.active() == "v2"
    assert root.rollback() == ("v2", "v1") and root.active() == "v1"


def test_an_unverified_activation_is_refused_unless_skipped_by_name(root):
    published(root, "good", {"rows.bin": b"as built"})
    root.publish(staged(root, "bad", {"rows.bin": b"changed"}, manifest_says={"rows.bin": b"as built"}), "bad")
    root.activate("good")
    with pytest.raises(IndexMismatch, match="not activating 'bad'"):
        root.activate("bad")
    assert root.active() == "good"
    assert root.activate("bad", verify=False) == "good"  # --no-verify: the operator's call, by name


def _holder(root_url: str, name: str, ttl_s: float) -> subprocess.Popen:
    code = ("import sys, time; from index_format.versions import open_root; "
            f"open_root({root_url!r}).hold({name!r}, ttl_s={ttl_s}); print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_version_cannot_be_removed_and_is_let_go_when_its_holder_dies(root):
    for name in ("served", "live"):
        published(root, name, {"rows.bin": name.encode()})
    root.activate("live")
    holder = _holder(root.url, "served", ttl_s=2.0)
    try:
        time.sleep(1.5)  # past one renewal: still held
        with pytest.raises(VersionHeld, match=r"served by 1 running process.*pid \d+"):
            root.remove("served")
    finally:
        holder.kill()  # SIGKILL: no release, the lease must lapse by itself
        holder.wait()
    with pytest.raises(VersionHeld):
        root.remove("served")  # lapses within ttl_s of the last renewal, not at once
    deadline = time.monotonic() + 10
    while True:
        try:
            root.remove("served")
            break
        except VersionHeld:
            assert time.monotonic() < deadline, "the dead holder's lease never lapsed"
            time.sleep(0.2)
    assert root.versions() == ["live"]


def test_a_released_lease_lets_the_version_go_at_once(root):
    for name in ("a", "b"):
        published(root, name, {"rows.bin": name.encode()})
    root.activate("b")
    lease = root.hold("a")
    with pytest.raises(VersionHeld):
        root.remove("a")
    with pytest.raises(VersionHeld, match="active version"):
        root.remove("b")
    lease.release()
    root.remove("a")
    assert root.versions() == ["b"]


def test_removing_a_version_never_takes_a_file_a_publish_in_flight_counts_on(root, tmp_path):
    shared, own = b"rows every version shares", b"rows only the old version has"
    published(root, "old", {"rows.bin": shared, "old.bin": own})
    published(root, "live", {"other.bin": b"live"})
    root.activate("live")
    with root.publishing():
        # The new version counts on the old one's file: hard-linked in a folder; in object storage, found in the
        # store by its checksum and not uploaded again.
        staging = staged(root, "new", {"rows.bin": shared})
        if root.shared_by_nodes:
            table, sent = root.upload_files(staging)
            assert sent == sum(f["size"] for f in table.values()) - len(shared)  # the shared file: not sent
        else:
            os.unlink(staging / "shards" / "shard-000" / "rows.bin")
            os.link(root.version_dir("old") / "shards" / "shard-000" / "rows.bin",
                    staging / "shards" / "shard-000" / "rows.bin")
            table = None
        done = root.remove("old")  # between the job's listing and its manifest
        assert root.versions() == ["live"]
        if root.shared_by_nodes:
            assert done["collected"] is False and "publish" in done["why"]
        root.publish(staging, "new", table)
    assert read_file(root, "new", "rows.bin", tmp_path) == shared
    root.activate("new")
    done = root.collect_garbage()  # no publish in flight now: what only "old" held goes
    assert done["collected"] is True
    if root.shared_by_nodes:
        assert done["files_deleted"] >= 1
        blobs = set(root.store.list("blobs/"))
        assert f"blobs/{hashlib.sha256(own).hexdigest()}" not in blobs
        assert f"blobs/{hashlib.sha256(shared).hexdigest()}" in blobs
    assert read_file(root, "new", "rows.bin", tmp_path) == shared


def test_a_publish_waits_for_a_collection_in_progress(root):
    from index_format.leases import Lease

    collecting = Lease(root.store, "collect", ttl_s=30).take()
    started = time.monotonic()
    import threading

    threading.Timer(1.0, collecting.release).start()
    with root.publishing():
        waited = time.monotonic() - started
    assert 0.9 <= waited < 10


def test_a_folder_root_reads_its_history_from_before_one_object_per_activation(tmp_path):
    root = open_root(tmp_path)
    published(root, "v1", {"a.bin": b"1"})
    published(root, "v2", {"a.bin": b"2"})
    (tmp_path / "activations.jsonl").write_text(json.dumps(
        {"time": "2026-11-01T00:00:00Z", "version": "v1", "previous": None, "by": "cli"}) + "\n")
    (tmp_path / "ACTIVE").write_text("v1\n")
    root.activate("v2")
    assert [(e["version"], e["previous"]) for e in root.history()] == [("v1", None), ("v2", "v1")]
    assert root.rollback() == ("v2", "v1")


def test_judgments_written_by_two_routers_are_all_kept_and_seen_by_both(root, tmp_path, monkeypatch):
    """Two routers (two stores open on one root, as on two nodes) judging at once: none lost, each sees all at once."""
    from concurrent.futures import ThreadPoolExecutor

    from deployments.judgments import judgments_of

    monkeypatch.setenv("RAYSEARCH_STATE", str(tmp_path / "node-state"))  # where a node's disk kept them before
    target = root.url if root.shared_by_nodes else root.folder
    one, two = judgments_of(target), judgments_of(target)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: (one if i % 2 else two).add(f"query {i % 5}", f"doc-{i}", i % 3, user=f"u{i}"),
                      range(40)))
    for router in (one, two):
        records = router.records()
        assert sorted(r["doc_id"] for r in records) == sorted(f"doc-{i}" for i in range(40))
    two.add("a late question", "doc-late", 2)
    assert one.qrels()[1][next(q for q, t in one.qrels()[0].items() if t == "a late question")] == {"doc-late": 2}
    if root.shared_by_nodes:
        assert not (tmp_path / "node-state").exists()  # nothing on the node's disk
        assert len(root.store.list("judgments/")) == 41  # an object each, in the store
    else:
        assert len((root.folder / "judgments" / "judgments.jsonl").read_text().splitlines()) == 41


def test_a_build_record_is_kept_in_the_root_and_read_by_any_router(root):
    from deployments.builds import list_records, read_record, write_record

    record = {"id": "build-20261129T000000Z-abcdef", "kind": "build", "root": root.url, "state": "succeeded",
              "started": "2026-11-29T00:00:00Z", "alive": "2026-11-29T00:00:00Z"}
    write_record(record)
    assert read_record([root.url], record["id"]) == record
    assert [r["id"] for r in list_records([root.url])] == [record["id"]]
    assert root.store.exists(f"builds/{record['id']}.json")
