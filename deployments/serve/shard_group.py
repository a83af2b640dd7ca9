"""Serve deployment: one shard slot of a collection, serving its group of shards (one or more) of any
published index version, in one process with one JVM.

The version of each call is its multiplexed model id: the router pins one version per request and
sends it with every shard call, so no response mixes versions. Serve routes a version's calls to the
replicas that have it loaded; a replica holds ``max_versions`` versions (the active one and the one
before it, so a rollback is instant) and loads a newly activated one when the router warms it up or,
failing that, on its first call. Loading happens off the event loop, so the replica keeps answering
the version it already holds meanwhile.

The versions themselves are opened and closed by ``deployments.shard.host.ShardHost`` (also what the router uses
when it holds the shards itself, ``shards.placement: router``).
"""

from __future__ import annotations

import asyncio

import numpy as np
from ray import serve

from deployments.rebalance.retire import retiring
from deployments.serve.heap import settle_heap
from deployments.shard.features import FeatureQuery
from deployments.shard.group import ShardGroup
from deployments.shard.host import MultiplexedVersion, ShardHost
from deployments.shard.query import DocumentsAnswer, DocumentsQuery, ShardAnswer, ShardQuery


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=32, health_check_period_s=10)
class ShardRetriever:
    def __init__(self, index_root: str | None, version_dir: str | None, shards: list[str] | str, expect: dict,
                 verify_checksums: bool = True, lucene_heap: str = "512m", max_versions: int = 2,
                 search_device: str = "cpu", warmup_searches: int = 0, version: str | None = None):
        self.host = ShardHost(index_root, version_dir, shards, expect, verify_checksums, lucene_heap, search_device,
                              warmup_searches, version)

        async def load(version: str) -> MultiplexedVersion:  # a plain function: Serve sets attributes on it
            return await MultiplexedVersion.load(self.host, version)

        # Serve's multiplexing is this deployment's cache of versions (it also tells Serve's router which replicas
        # hold which): the host loads them, and closes those it evicts (deployments.shard.host).
        self._version = serve.multiplexed(max_num_models_per_replica=max_versions)(load)
        self._replica_id = serve.get_replica_context().replica_id.unique_id
        settle_heap()

    async def _service(self) -> ShardGroup:
        return (await self._version(serve.get_multiplexed_model_id() or self.host.initial_version)).group

    async def search(self, query: ShardQuery) -> ShardAnswer:
        return await self.host.search(await self._service(), query)

    async def fetch(self, chunk_ids: list[str]) -> list[dict]:
        return (await self._service()).fetch(chunk_ids)

    async def vectors(self, chunk_ids: list[str]) -> np.ndarray:
        return (await self._service()).vectors(chunk_ids)

    async def features(self, query: FeatureQuery) -> dict[str, np.ndarray]:
        return await self.host.features(await self._service(), query)

    async def vocabulary(self, acl=None) -> dict[str, int]:
        group = await self._service()
        return await self.host.run(group.vocabulary, acl)

    async def documents(self, query: DocumentsQuery) -> DocumentsAnswer:
        group = await self._service()
        return await self.host.run(group.list_documents, query)

    async def check_health(self) -> None:
        """Serve's health check (every ``health_check_period_s``): a slot whose JVM ran out of heap, or whose
        index files vanished, leaves rotation and is replaced; one a rebalance moved elsewhere
        (``deployments.rebalance.retire``) fails it on purpose, so that Serve stops it gracefully."""
        if await asyncio.to_thread(retiring, self._replica_id):
            raise RuntimeError("retired by a rebalance: a replica of this group runs on another node in its place")
        await self.host.check_health()

    async def info(self) -> dict:
        """Loading the call's version first makes ``info`` the warm-up call of an activation."""
        group = await self._service()
        return group.info(serve.get_multiplexed_model_id() or self.host.initial_version)
