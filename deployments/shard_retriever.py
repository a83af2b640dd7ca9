"""Serve deployment: one shard slot of a collection, serving that shard of any published index version.

The version of each call is its multiplexed model id: the router pins one version per request and
sends it with every shard call, so no response mixes versions. Serve routes a version's calls to the
replicas that have it loaded; a replica holds ``max_versions`` versions (the active one and the one
before it, so a rollback is instant) and loads a newly activated one when the router warms it up or,
failing that, on its first call. Loading happens off the event loop, so the replica keeps answering
the version it already holds meanwhile.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
from ray import serve

from index_build.manifest import IndexMismatch
from index_build.versions import list_versions, versions_dir

from .shard_service import ShardAnswer, ShardService


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=32, health_check_period_s=10)
class ShardRetriever:
    def __init__(self, index_root: str | None, version_dir: str, shard: str, expect: dict,
                 verify_checksums: bool = True, lucene_heap: str = "512m", max_versions: int = 2,
                 search_device: str = "cpu"):
        os.environ["LUCENE_JVM_HEAP"] = lucene_heap  # before the JVM starts in this replica
        self.root = Path(index_root) if index_root else None  # None: pinned to one version folder
        self.shard, self.expect, self.verify_checksums = shard, dict(expect), verify_checksums
        self.search_device = search_device
        initial = Path(version_dir)
        self.initial_version = initial.name
        # Opened now, so a broken index fails the deployment instead of its first request.
        self._opened: dict[str, ShardService] = {initial.name: self._open(initial)}

        async def load(version: str) -> ShardService:
            return await asyncio.to_thread(self._open_version, version)

        self._service_for = serve.multiplexed(max_num_models_per_replica=max_versions)(load)

    def _open(self, version_dir: Path) -> ShardService:
        from index_build.bm25_stats import read_stats

        from .local_index import corpus_df_map

        shard_dir = version_dir / "shards" / self.shard
        if not shard_dir.is_dir():
            raise IndexMismatch(f"index version {version_dir.name!r} has no {self.shard}")
        stats, terms = read_stats(version_dir / "bm25")
        return ShardService(shard_dir, stats, corpus_df_map(terms), self.expect, self.verify_checksums,
                            self.search_device)

    def _open_version(self, version: str) -> ShardService:
        opened = self._opened.pop(version, None)
        if opened is not None:
            return opened
        # The name came over the wire: only a published version's folder is ever opened.
        if self.root is None or version not in list_versions(self.root):
            raise IndexMismatch(f"index version {version!r} is not published here")
        return self._open(versions_dir(self.root) / version)

    async def _service(self) -> ShardService:
        return await self._service_for(serve.get_multiplexed_model_id() or self.initial_version)

    async def search(self, vector, text, k_dense: int, k_keyword: int, filters=None, rows_for_top: int = 0,
                     acl=None) -> ShardAnswer:
        service = await self._service()
        # FAISS and Lucene release the GIL while searching: a worker thread keeps the loop free.
        return await asyncio.to_thread(service.search, vector, text, k_dense, k_keyword, filters, rows_for_top, acl)

    async def fetch(self, chunk_ids: list[str]) -> list[dict]:
        return (await self._service()).fetch(chunk_ids)

    async def vectors(self, chunk_ids: list[str]) -> np.ndarray:
        return (await self._service()).vectors(chunk_ids)

    async def vocabulary(self, acl=None) -> dict[str, int]:
        service = await self._service()
        return await asyncio.to_thread(service.vocabulary, acl)

    async def info(self) -> dict:
        """Loading the call's version first makes ``info`` the warm-up call of an activation."""
        service = await self._service()
        return {"shard": service.name, "chunks": service.chunks, "fields": service.fields(),
                "version": serve.get_multiplexed_model_id() or self.initial_version}
