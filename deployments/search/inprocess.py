"""An index version searched in one process, without Ray or HTTP: the whole pipeline with the same cores
called directly (``inprocess_pipeline``), or the sharded engines alone (``LocalIndex``).

Used by tests ("the app in-process", and the oracles sharded search is compared with), the demo, and
the serving benchmark as the in-process cost of the same work, next to which the served path's overhead
is measured.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from deployments.config import RouterSettings
from deployments.search.calibration import Calibration
from deployments.search.clients import Collection
from deployments.search.hits import Hit, merge_top_k
from deployments.search.learned import RankingModel
from deployments.search.pipeline import SearchPipeline
from deployments.shard.chunk_ids import ids_at
from deployments.shard.group import ShardGroup
from deployments.shard.query import ShardAnswer, ShardQuery
from deployments.shard.service import ShardService, open_version
from index_format.encoders import encode_queries, load_encoder, query_token_counts
from index_format.prompts import EncoderSpec


class InProcessShard:
    """A shard group called directly (what a shard deployment serves), as a pipeline's shard client."""

    remote = False

    def __init__(self, service: ShardGroup, threaded: bool = False):
        self.service, self.name, self.threaded = service, service.name, threaded
        self.size = service.size

    async def _call(self, fn, *args):
        return await asyncio.to_thread(fn, *args) if self.threaded else fn(*args)

    async def search(self, query: ShardQuery) -> ShardAnswer:
        return await self._call(self.service.search, query)

    async def fetch(self, chunk_ids):
        return self.service.fetch(chunk_ids)

    async def features(self, query) -> dict[str, np.ndarray]:
        return await self._call(self.service.features, query)

    async def vectors(self, chunk_ids) -> np.ndarray:
        return self.service.vectors(chunk_ids)

    async def vocabulary(self, acl=None) -> dict[str, int]:
        return self.service.vocabulary(acl)

    async def documents(self, query):
        return await self._call(self.service.list_documents, query)


class InProcessReranker:
    def __init__(self, scorer):
        self.scorer = scorer

    async def score(self, query: str, passages: list[str]) -> list[float]:
        return (await asyncio.to_thread(self.scorer.score, [(query, p) for p in passages])).tolist()


class InProcessEncoder:
    def __init__(self, spec: EncoderSpec, backend: str = "onnx"):
        self.spec = spec
        self.encoder = load_encoder(spec.model, "cpu", backend, threads=1)

    async def embed(self, text: str) -> np.ndarray:
        return self.encoder.encode([text], prompt=self.spec.query_prompt)[0]

    async def tokens(self, text: str) -> tuple[int, int] | None:
        return query_token_counts(self.encoder, self.spec.query_prompt, text)

    async def embed_many(self, texts: list[str]) -> list[np.ndarray]:
        return list(encode_queries(self.encoder, texts, self.spec.query_prompt))

    async def embed_documents(self, texts: list[str]) -> list[np.ndarray]:
        return list(self.encoder.encode(texts, prompt=self.spec.document_prompt))


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
    return Collection.at_version(name, manifest.version, [InProcessShard(g, threaded) for g in groups],
                                 InProcessEncoder(EncoderSpec.of(manifest), encoder_backend), fields=fields,
                                 counts=manifest.counts, bm25=manifest.bm25,
                                 encoders={n: InProcessEncoder(e.spec, encoder_backend)
                                           for n, e in manifest.encoders.items()})


def inprocess_pipeline(collections: dict[str, Path], settings: RouterSettings | None = None,
                       default: str | None = None, threaded: bool = False, reranker=None,
                       synthesizer=None, acl_field: str | None = None, group_size: int = 0,
                       encoder_backend: str = "onnx") -> SearchPipeline:
    opened = {name: open_collection(name, path, threaded=threaded, group_size=group_size,
                                    encoder_backend=encoder_backend)
              for name, path in collections.items()}
    pipeline = SearchPipeline(opened, default or next(iter(opened)), settings or RouterSettings(),
                              reranker=reranker, synthesizer=synthesizer, acl_field=acl_field)
    pipeline.models.update(active_models(collections))
    pipeline.calibrations.update(calibrations_of(collections))
    return pipeline


def index_roots(collections: dict[str, Path]) -> dict[str, Path]:
    """The collections given as an index root, which may hold ranking models and a calibration (a version folder
    holds neither)."""
    from index_format.versions import open_root

    return {name: path for name, path in collections.items()
            if open_root(path).shared_by_nodes or (Path(path) / "versions").is_dir()}


def calibrations_of(collections: dict[str, Path]) -> dict[str, Calibration]:
    """The calibration of each collection given as an index root that has one."""
    from index_format.calibration import read_calibration

    found = {name: read_calibration(path) for name, path in index_roots(collections).items()}
    return {name: Calibration.from_json(data) for name, data in found.items() if data is not None}


def active_models(collections: dict[str, Path]) -> dict[str, RankingModel]:
    """The active ranking model of each collection given as an index root."""
    from index_format.rankers import active_ranker, read_ranker

    models = {}
    for name, path in index_roots(collections).items():
        active = active_ranker(path)
        if active is not None:
            description, text = read_ranker(path, active)
            models[name] = RankingModel(active, description["features"], text)
    return models


class LocalIndex:
    def __init__(self, path: Path, version: str | None = None, verify_checksums: bool = True):
        self.version_dir, self.manifest, stats, df, expect = open_version(path, version)
        self.shards = [
            ShardService(self.version_dir / "shards" / name, stats, df, expect, verify_checksums)
            for name in self.manifest.shards
        ]
        self._encoder = None

    @property
    def encoder(self):
        if self._encoder is None:
            self._encoder = load_encoder(self.manifest.encoder)
        return self._encoder

    def embed(self, queries: list[str]) -> np.ndarray:
        return self.encoder.encode(queries, prompt=self.manifest.query_prompt)

    def bm25(self, query: str, k: int = 10, allowed: list[np.ndarray | None] | None = None,
             weights: dict[str, float] | None = None) -> list[Hit]:
        """The corpus-exact BM25 top k over every shard (``allowed``: per shard, the rows it may return; ``weights``:
        {field: weight}, None for ``contents`` alone)."""
        terms = self.shards[0].analyze(query) if self.shards else []
        allowed = allowed or [None] * len(self.shards)
        return merge_top_k((self._hits(i, *s.keyword_leg(terms, k, rows, weights=weights))
                            for i, (s, rows) in enumerate(zip(self.shards, allowed, strict=True))), k)

    def dense(self, query: str | np.ndarray, k: int = 10, allowed: list[np.ndarray | None] | None = None,
              ann: dict | None = None) -> list[Hit]:
        """The dense top k over every shard (``allowed`` as for ``bm25``; ``ann``: the search's options)."""
        vector = self.embed([query])[0] if isinstance(query, str) else np.atleast_2d(query)[0]
        allowed = allowed or [None] * len(self.shards)
        return merge_top_k((self._hits(i, *s.dense_leg(vector, k, rows, ann))
                            for i, (s, rows) in enumerate(zip(self.shards, allowed, strict=True))), k)

    def _hits(self, shard: int, rows: np.ndarray, scores: np.ndarray) -> list[Hit]:
        ids = ids_at(self.shards[shard].ids, rows)
        return [Hit(c, s, shard) for c, s in zip(ids, scores.tolist(), strict=True)]

    def fetch(self, hits: list[Hit]) -> list[dict]:
        by_shard: dict[int, list[str]] = {}
        for h in hits:
            by_shard.setdefault(h.shard, []).append(h.chunk_id)
        rows = {}
        for s, ids in by_shard.items():
            for row in self.shards[s].fetch(ids):
                rows[row["chunk_id"]] = row
        return [rows[h.chunk_id] for h in hits]
