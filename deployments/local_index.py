"""A whole index version searched in one process, without Ray or HTTP.

Used by the demo and by benchmarks as the in-process baseline that the served path is compared with.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from index_build.bm25_stats import read_stats
from index_build.encoders import load_encoder
from index_build.versions import read_version_manifest, resolve_version_dir

from .hits import Hit, merge_top_k
from .shard_searcher import ShardSearcher


def corpus_df_map(terms) -> dict[str, int]:
    return dict(zip(terms["term"].to_pylist(), terms["df"].to_pylist(), strict=True))


def open_version(path: Path, version: str | None = None):
    """(version folder, its manifest, corpus BM25 stats, df per term, what every shard must match)."""
    version_dir = resolve_version_dir(Path(path), version)
    manifest = read_version_manifest(version_dir)
    stats, terms = read_stats(version_dir / "bm25")
    expect = {"encoder": manifest.encoder, "dimension": manifest.dimension}
    return version_dir, manifest, stats, corpus_df_map(terms), expect


class LocalIndex:
    def __init__(self, path: Path, version: str | None = None, verify_checksums: bool = True):
        self.version_dir, self.manifest, stats, df, expect = open_version(path, version)
        self.shards = [
            ShardSearcher(self.version_dir / "shards" / name, stats, df, expect, verify_checksums)
            for name in self.manifest.shards
        ]
        self._encoder = None

    @property
    def encoder(self):
        if self._encoder is None:
            self._encoder = load_encoder(self.manifest.encoder)
        return self._encoder

    def embed(self, queries: list[str]) -> np.ndarray:
        return self.encoder.encode(queries)

    def bm25(self, query: str, k: int = 10) -> list[Hit]:
        return merge_top_k((s.bm25_search(query, k) for s in self.shards), k)

    def dense(self, query: str | np.ndarray, k: int = 10) -> list[Hit]:
        vector = self.embed([query]) if isinstance(query, str) else np.atleast_2d(query)
        return merge_top_k((s.dense_search(vector, k)[0] for s in self.shards), k)

    def fetch(self, hits: list[Hit]) -> list[dict]:
        by_shard: dict[int, list[str]] = {}
        for h in hits:
            by_shard.setdefault(h.shard, []).append(h.chunk_id)
        rows = {}
        for s, ids in by_shard.items():
            for row in self.shards[s].fetch(ids):
                rows[row["chunk_id"]] = row
        return [rows[h.chunk_id] for h in hits]
