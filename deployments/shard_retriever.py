"""Serve deployment: one shard's retriever (a thin wrapper that owns the shard's indexes)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from ray import serve

from .shard_service import ShardAnswer, ShardService


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=32, health_check_period_s=10)
class ShardRetriever:
    def __init__(self, shard_dir: str, version_dir: str, expect: dict, verify_checksums: bool = True,
                 lucene_heap: str = "512m"):
        os.environ["LUCENE_JVM_HEAP"] = lucene_heap  # before the JVM starts in this replica
        from index_build.bm25_stats import read_stats

        from .local_index import corpus_df_map

        stats, terms = read_stats(Path(version_dir) / "bm25")
        self.service = ShardService(Path(shard_dir), stats, corpus_df_map(terms), expect, verify_checksums)

    # Sync methods: Serve runs them on worker threads; FAISS and Lucene release the GIL while searching.
    def search(self, vector, text, k_dense: int, k_keyword: int, filters=None, rows_for_top: int = 0,
               acl=None) -> ShardAnswer:
        return self.service.search(vector, text, k_dense, k_keyword, filters, rows_for_top, acl)

    def fetch(self, chunk_ids: list[str]) -> list[dict]:
        return self.service.fetch(chunk_ids)

    def vectors(self, chunk_ids: list[str]) -> np.ndarray:
        return self.service.vectors(chunk_ids)

    def info(self) -> dict:
        return {"shard": self.service.name, "chunks": self.service.chunks, "fields": self.service.fields()}
