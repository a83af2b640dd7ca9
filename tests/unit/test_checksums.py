"""A file's checksum remembered on the node (``index_format.manifest.sha256_file``): read once, trusted while the
file's inode, size and times say it is the same file, read again the moment they do not."""

from __future__ import annotations

import hashlib
import os

from index_format.manifest import _remembered, sha256_file


def test_a_checksum_is_read_once_and_then_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSEARCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "vectors.npy"
    path.write_bytes(b"x" * 100_000)
    real = hashlib.sha256(path.read_bytes()).hexdigest()
    assert sha256_file(path) == real
    folder, key = _remembered(path)
    assert (folder / key).read_text() == real
    (folder / key).write_text("remembered")  # what is remembered is what is returned: the bytes are not read
    assert sha256_file(path) == "remembered"
    assert sha256_file(path, remembered=False) == real


def test_a_file_written_in_place_is_read_again_even_with_its_old_size_and_modification_time(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSEARCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "dense.faiss"
    path.write_bytes(b"a" * 4096)
    before = sha256_file(path)
    st = os.stat(path)
    with open(path, "r+b") as f:  # one byte flipped: same inode, same size
        f.seek(100)
        f.write(b"b")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the modification time put back
    after = sha256_file(path)
    assert after != before and after == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_renamed_file_keeps_its_remembered_checksum(tmp_path, monkeypatch):
    """A version is staged and then renamed into place as a folder: its files keep their inodes and times."""
    monkeypatch.setenv("RAYSEARCH_CACHE", str(tmp_path / "cache"))
    staged = tmp_path / "staging" / "v1"
    staged.mkdir(parents=True)
    (staged / "chunks.arrow").write_bytes(b"rows" * 1000)
    digest = sha256_file(staged / "chunks.arrow")
    os.rename(tmp_path / "staging", tmp_path / "versions")
    folder, key = _remembered(tmp_path / "versions" / "v1" / "chunks.arrow")
    assert (folder / key).read_text() == digest
