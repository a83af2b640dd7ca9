from collections import Counter

from index_format.sharding import shard_name, shard_of


def test_stable_across_processes_and_runs():
    # Pinned: blake2b-64 of the id, big-endian, modulo the shard count. A change here would move
    # documents between shards of existing indexes.
    assert [shard_of(f"doc{i}", 3) for i in range(8)] == [shard_of(f"doc{i}", 3) for i in range(8)]
    import hashlib

    expected = int.from_bytes(hashlib.blake2b(b"doc1", digest_size=8).digest(), "big") % 7
    assert shard_of("doc1", 7) == expected


def test_spread_is_roughly_even_and_in_range():
    counts = Counter(shard_of(f"id-{i}", 4) for i in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(900 < c < 1100 for c in counts.values())


def test_one_shard_takes_everything_and_names_sort():
    assert {shard_of(str(i), 1) for i in range(50)} == {0}
    assert shard_name(2) == "shard-002" and sorted([shard_name(10), shard_name(9)]) == ["shard-009", "shard-010"]
