"""The oracle for a version built another way (into object storage, across nodes): it equals the single-node build
of the same corpus in counts, statistics, shard files and answers."""

from __future__ import annotations

import random
from pathlib import Path

from deployments.search.inprocess import LocalIndex
from index_format.manifest import read_shard_manifest
from index_format.versions import read_version_manifest
from tests.conftest import TOPICS


def queries(n: int = 50, seed: int = 11) -> list[str]:
    """``n`` queries of 1 to 3 words from the test corpus's topics."""
    rng = random.Random(seed)
    words = " ".join(TOPICS.values()).split()
    return [" ".join(rng.sample(words, rng.choice([1, 2, 3]))) for _ in range(n)]


def assert_versions_equal(want_dir: Path, got_dir: Path, n_queries: int = 50, ignore: frozenset = frozenset()) -> None:
    """Same counts, BM25 statistics, corpus record and shards; the same shard files (checksums), and the same top 10
    on both legs for ``n_queries`` queries. Lucene's segment files carry a random segment id, so those are compared by
    name and by the index statistics, not by checksum; a shard's manifest differs in when it was made. Both must have
    read the corpus under the same name (a path or a URL): each record keeps it as its source. ``ignore``: more shard
    manifest fields that may differ (a fold's ``build_key`` names when it ran)."""
    want, got = read_version_manifest(want_dir), read_version_manifest(got_dir)
    assert (got.counts, got.bm25, got.shards) == (want.counts, want.bm25, want.shards)
    assert got.corpus == want.corpus
    for shard in want.shards:
        a, b = read_shard_manifest(want_dir / "shards" / shard), read_shard_manifest(got_dir / "shards" / shard)
        same = {"created": True, "checksums": True, "faiss": {"build_s"}} | dict.fromkeys(ignore, True)
        x, y = a.model_dump(exclude=same), b.model_dump(exclude=same)
        assert x == y, {k: (x.get(k), y.get(k)) for k in x.keys() | y.keys() if x.get(k) != y.get(k)}
        differ = sorted(k for k in a.checksums.keys() | b.checksums.keys()
                        if not k.startswith("lucene/") and a.checksums.get(k) != b.checksums.get(k))
        assert not differ, (shard, differ)
        assert sorted(a.checksums) == sorted(b.checksums)
    mine, theirs = LocalIndex(want_dir), LocalIndex(got_dir)  # verifies every file against its checksum
    for q in queries(n_queries):
        assert [(h.chunk_id, round(h.score, 5)) for h in mine.bm25(q, 10)] == \
               [(h.chunk_id, round(h.score, 5)) for h in theirs.bm25(q, 10)]
        vector = mine.embed([q])
        assert [(h.chunk_id, round(h.score, 5)) for h in mine.dense(vector, 10)] == \
               [(h.chunk_id, round(h.score, 5)) for h in theirs.dense(vector, 10)]
