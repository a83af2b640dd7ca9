"""The store layer's one contract, over a folder and over a local S3-compatible server."""

from __future__ import annotations

import os

import pytest

from index_format.store import Conflict, StoreError, open_store


@pytest.fixture(params=["folder", "s3"])
def store(request, tmp_path):
    if request.param == "folder":
        return open_store(tmp_path / "root")
    return open_store(request.getfixturevalue("s3_root"))


def test_put_get_list_delete(store, tmp_path):
    store.put("a/b.txt", b"hello")
    store.put("c.txt", b"x" * 10)
    assert store.get("a/b.txt") == b"hello"
    assert store.text("a/b.txt") == "hello" and store.text("missing") is None
    assert store.list() == {"a/b.txt": 5, "c.txt": 10}
    assert store.list("a/") == {"a/b.txt": 5}
    assert store.exists("c.txt") and not store.exists("nope")
    with pytest.raises(FileNotFoundError):
        store.get("nope")
    store.delete(["a/b.txt", "never-there"])
    assert store.list() == {"c.txt": 10}


def test_files_round_trip(store, tmp_path):
    data = os.urandom(3 << 20)
    (tmp_path / "in.bin").write_bytes(data)
    store.upload(tmp_path / "in.bin", "blobs/one")
    store.download("blobs/one", tmp_path / "out.bin")
    assert (tmp_path / "out.bin").read_bytes() == data


def test_compare_and_swap(store):
    """Create-if-absent refuses a second creator; an update on a stale tag is refused, on the current one taken."""
    data, tag = store.get_tagged("ACTIVE")
    assert (data, tag) == (None, None)
    first = store.put_if("ACTIVE", b"v1", None)
    with pytest.raises(Conflict):
        store.put_if("ACTIVE", b"v2", None)
    second = store.put_if("ACTIVE", b"v2", first)
    with pytest.raises(Conflict):
        store.put_if("ACTIVE", b"v3", first)  # stale: another writer moved it to v2
    assert store.get_tagged("ACTIVE") == (b"v2", second)


def test_unreachable_endpoint_fails_fast(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(StoreError, match=r"cannot read s3://bucket/idx/ACTIVE"):
        open_store("s3://bucket/idx").get_tagged("ACTIVE")
