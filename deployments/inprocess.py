"""The search pipeline without Ray: the same cores, called directly.

Used by tests ("the app in-process") and by the speed benchmark as the in-process cost of the same
retrieval work, next to which the served path's overhead is measured.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from index_build.encoders import load_encoder

from .config import RouterSettings
from .local_index import open_version
from .pipeline import Collection, SearchPipeline
from .shard_group import ShardGroup
from .shard_service import ShardAnswer, ShardService


class InProcessShard:
    """A shard group called directly (what a shard deployment serves), as a pipeline's shard client."""

    def __init__(self, service: ShardGroup, threaded: bool = False):
        self.service, self.name, self.threaded = service, service.name, threaded
        self.size = service.size

    async def _call(self, fn, *args):
        return await asyncio.to_thread(fn, *args) if self.threaded else fn(*args)

    async def search(self, vector, text, k_dense, k_keyword, filters, rows_for_top=0, acl=None) -> ShardAnswer:
        return await self._call(self.service.search, vector, text, k_dense, k_keyword, filters, rows_for_top, acl)

    async def fetch(self, chunk_ids):
        return self.service.fetch(chunk_ids)

    async def vectors(self, chunk_ids) -> np.ndarray:
        return self.service.vectors(chunk_ids)

    async def vocabulary(self, acl=None) -> dict[str, int]:
        return self.service.vocabulary(acl)


class InProcessReranker:
    def __init__(self, scorer):
        self.scorer = scorer

    async def score(self, query: str, passages: list[str]) -> list[float]:
        return (await asyncio.to_thread(self.scorer.score, [(query, p) for p in passages])).tolist()


class InProcessEncoder:
    def __init__(self, name: str, backend: str = "onnx"):
        self.encoder = load_encoder(name, "cpu", backend, threads=1)

    async def embed(self, text: str) -> np.ndarray:
        return self.encoder.encode([text])[0]


def open_collection(name: str, index: Path, version: str | None = None, threaded: bool = False,
                    verify_checksums: bool = True, group_size: int = 0, encoder_backend: str = "onnx") -> Collection:
    """A collection as the app serves it: its shards in groups of ``group_size`` (0: one group, the
    default deployment), queries embedded with ``encoder_backend``."""
    version_dir, manifest, stats, df, expect = open_version(index, version)
    services = [ShardService(version_dir / "shards" / s, stats, df, expect, verify_checksums) for s in manifest.shards]
    size = group_size or len(services)
    groups = [ShardGroup(services[i:i + size]) for i in range(0, len(services), size)]
    fields: dict[str, str] = {}
    for g in groups:
        fields.update(g.fields())
    return Collection(name, manifest.version, [InProcessShard(g, threaded) for g in groups],
                      InProcessEncoder(manifest.encoder, encoder_backend), fields)


def inprocess_pipeline(collections: dict[str, Path], settings: RouterSettings | None = None,
                       default: str | None = None, threaded: bool = False, reranker=None,
                       synthesizer=None, acl_field: str | None = None, group_size: int = 0,
                       encoder_backend: str = "onnx") -> SearchPipeline:
    opened = {name: open_collection(name, path, threaded=threaded, group_size=group_size,
                                    encoder_backend=encoder_backend)
              for name, path in collections.items()}
    return SearchPipeline(opened, default or next(iter(opened)), settings or RouterSettings(),
                          reranker=reranker, synthesizer=synthesizer, acl_field=acl_field)
