"""Serve deployment: one shard slot of a collection, serving its group of shards (one or more) of any
published index version, in one process with one JVM.

The version of each call is its multiplexed model id: the router pins one version per request and
sends it with every shard call, so no response mixes versions. Serve routes a version's calls to the
replicas that have it loaded; a replica holds ``max_versions`` versions (the active one and the one
before it, so a rollback is instant) and loads a newly activated one when the router warms it up or,
failing that, on its first call. Loading happens off the event loop, so the replica keeps answering
the version it already holds meanwhile.

All index work runs on one thread of the replica: pyjnius keeps per-method state that is not
thread-safe, and one thread per process is also what two cores can give.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from ray import serve

from deployments.shard.group import ShardGroup
from deployments.shard.service import ShardAnswer, ShardService
from index_build.manifest import IndexMismatch
from index_build.versions import list_versions, versions_dir


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=32, health_check_period_s=10)
class ShardRetriever:
    def __init__(self, index_root: str | None, version_dir: str, shards: list[str] | str, expect: dict,
                 verify_checksums: bool = True, lucene_heap: str = "512m", max_versions: int = 2,
                 search_device: str = "cpu", warmup_searches: int = 0):
        os.environ["LUCENE_JVM_HEAP"] = lucene_heap  # before the JVM starts in this replica
        self.root = Path(index_root) if index_root else None  # None: pinned to one version folder
        self.shards = [shards] if isinstance(shards, str) else list(shards)
        self.expect, self.verify_checksums = dict(expect), verify_checksums
        self.search_device = search_device
        self.warmup_searches = warmup_searches
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-search")
        initial = Path(version_dir)
        self.initial_version = initial.name
        # Opened now, so a broken index fails the deployment instead of its first request.
        self._opened: dict[str, ShardGroup] = {initial.name: self._open(initial)}

        async def load(version: str) -> ShardGroup:
            return await self._run(self._open_version, version)

        self._service_for = serve.multiplexed(max_num_models_per_replica=max_versions)(load)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.worker, fn, *args)

    def _open(self, version_dir: Path) -> ShardGroup:
        from deployments.shard.service import corpus_df_map
        from index_build.bm25_stats import read_stats

        stats, terms = read_stats(version_dir / "bm25")
        df = corpus_df_map(terms)
        # A version with fewer shards than the app was deployed with is served by the first slots, each
        # with the shards of its group that the version has (activation.check_switchable).
        held = [shard for shard in self.shards if (version_dir / "shards" / shard).is_dir()]
        if not held:
            raise IndexMismatch(f"index version {version_dir.name!r} has none of {', '.join(self.shards)}")
        group = ShardGroup([ShardService(version_dir / "shards" / shard, stats, df, self.expect,
                                         self.verify_checksums, self.search_device) for shard in held])
        group.warm_up(self.warmup_searches)
        return group

    def _open_version(self, version: str) -> ShardGroup:
        opened = self._opened.pop(version, None)
        if opened is not None:
            return opened
        # The name came over the wire: only a published version's folder is ever opened.
        if self.root is None or version not in list_versions(self.root):
            raise IndexMismatch(f"index version {version!r} is not published here")
        return self._open(versions_dir(self.root) / version)

    async def _service(self) -> ShardGroup:
        return await self._service_for(serve.get_multiplexed_model_id() or self.initial_version)

    async def search(self, vector, text, k_dense: int, k_keyword: int, filters=None, rows_for_top: int = 0,
                     acl=None) -> ShardAnswer:
        group = await self._service()
        # FAISS and Lucene release the GIL while searching: the worker thread keeps the loop free.
        return await self._run(group.search, vector, text, k_dense, k_keyword, filters, rows_for_top, acl)

    async def fetch(self, chunk_ids: list[str]) -> list[dict]:
        return (await self._service()).fetch(chunk_ids)

    async def vectors(self, chunk_ids: list[str]) -> np.ndarray:
        return (await self._service()).vectors(chunk_ids)

    async def vocabulary(self, acl=None) -> dict[str, int]:
        group = await self._service()
        return await self._run(group.vocabulary, acl)

    async def info(self) -> dict:
        """Loading the call's version first makes ``info`` the warm-up call of an activation."""
        group = await self._service()
        return {"shard": group.name, "shards": {s.name: s.chunks for s in group.services}, "chunks": group.chunks,
                "fields": group.fields(), "version": serve.get_multiplexed_model_id() or self.initial_version}
