"""One shard opened for search: its manifest checked, its chunk table, FAISS index and Lucene index."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from index_build.bm25_stats import CollectionStats
from index_build.build import CHUNKS_FILE, EMBEDDINGS_FILE, FAISS_FILE, LUCENE_DIR
from index_build.manifest import ShardManifest, verify_shard

from .dense_shard import DenseShard, TorchDenseShard
from .hits import Hit
from .lucene_shard import LuceneShard


class ShardSearcher:
    def __init__(
        self,
        shard_dir: Path,
        corpus: CollectionStats,
        corpus_df: Mapping[str, int],
        expect: Mapping[str, Any] | None = None,
        verify_checksums: bool = True,
        search_device: str = "cpu",
    ):
        import faiss

        from index_build.encoders import resolve_device

        self.folder = Path(shard_dir)
        self.manifest: ShardManifest = verify_shard(self.folder, expect=dict(expect or {}), checksums=verify_checksums)
        self.shard = self.manifest.shard
        self.chunks: pa.Table = pq.read_table(self.folder / CHUNKS_FILE)
        chunk_ids = self.chunks["chunk_id"].to_pylist()
        self.row_of = {cid: i for i, cid in enumerate(chunk_ids)}
        if resolve_device(search_device) == "cuda":  # exact search on the GPU, from the shard's vectors
            self.dense = TorchDenseShard(np.load(self.folder / EMBEDDINGS_FILE), chunk_ids, self.shard, "cuda")
        else:
            self.dense = DenseShard(faiss.read_index(str(self.folder / FAISS_FILE)), chunk_ids, self.shard)
        self.lucene = LuceneShard(self.folder / LUCENE_DIR, chunk_ids, self.manifest.lucene, corpus, corpus_df,
                                  self.shard)

    def dense_search(self, vectors: np.ndarray, k: int, allowed_rows: np.ndarray | None = None) -> list[list[Hit]]:
        return self.dense.search(vectors, k, allowed_rows)

    def bm25_search(self, query: str | list[str], k: int, allowed_rows: np.ndarray | None = None) -> list[Hit]:
        return self.lucene.search(query, k, None if allowed_rows is None else allowed_rows.tolist())

    def fetch(self, chunk_ids: list[str]) -> list[dict]:
        """Chunk rows (text and metadata) for ids held by this shard, in the order asked."""
        rows = [self.row_of[c] for c in chunk_ids if c in self.row_of]
        return self.chunks.take(pa.array(rows, pa.int64())).to_pylist() if rows else []
