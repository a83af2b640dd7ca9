"""Index files mapped for random reads (``index_format.mapping``): the same arrays ``np.load`` reads, read-only."""

from __future__ import annotations

import numpy as np
import pytest

from index_format.mapping import map_for_random_reads, mapped_npy


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.zeros((0, 384), dtype=np.float32),  # a shard with no vectors
    np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
    np.arange(5, dtype=np.int32),
])
def test_a_mapped_npy_is_the_array_np_load_reads_and_cannot_be_written(tmp_path, array):
    np.save(tmp_path / "a.npy", array)
    got = mapped_npy(tmp_path / "a.npy")
    want = np.load(tmp_path / "a.npy")
    assert got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)
    assert not got.flags.writeable
    with pytest.raises(ValueError):
        got[...] = 0


def test_a_mapped_file_is_its_bytes(tmp_path):
    (tmp_path / "f").write_bytes(b"0123456789" * 1000)
    assert bytes(map_for_random_reads(tmp_path / "f")[5:15]) == b"5678901234"
