"""The typed app builder: one Serve application (router -> encoders + shard retrievers) from AppConfig.

``serve run serve_config.yaml`` calls ``build_app(args)`` with the YAML's ``args``; the same model
is filled by ``python -m deployments``. Everything is validated before any replica starts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ray.serve import Application

from index_build.versions import read_version_manifest, resolve_version_dir

from .config import AppConfig
from .query_encoder import QueryEncoder
from .router import SearchRouter
from .shard_retriever import ShardRetriever

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,48}$")


def build_app(args: dict[str, Any] | AppConfig) -> Application:
    cfg = args if isinstance(args, AppConfig) else AppConfig.model_validate(args)
    encoders: dict[str, Any] = {}
    collections: dict[str, dict[str, Any]] = {}
    for name, coll in cfg.resolved_collections().items():
        if not _NAME.match(name):
            raise ValueError(f"collection name {name!r}: use 1-48 letters, digits, '-' or '_'")
        version_dir = resolve_version_dir(Path(coll.index).resolve(), coll.version)
        manifest = read_version_manifest(version_dir)
        if manifest.encoder not in encoders:
            encoders[manifest.encoder] = QueryEncoder.options(
                name=f"encoder-{len(encoders)}",
                num_replicas=cfg.encoder_replicas,
                ray_actor_options={"num_cpus": cfg.encoder_num_cpus, "num_gpus": cfg.encoder_num_gpus},
            ).bind(manifest.encoder, cfg.encoder_max_batch_size, cfg.encoder_batch_wait_s,
                   max(1, int(cfg.encoder_num_cpus)), "cuda" if cfg.encoder_num_gpus else "cpu")
        expect = {"encoder": manifest.encoder, "dimension": manifest.dimension}
        shards = [
            (shard, ShardRetriever.options(
                name=f"{name}-{shard}",
                num_replicas=cfg.shard_replicas,
                max_ongoing_requests=cfg.shard_max_ongoing_requests,
                ray_actor_options={"num_cpus": cfg.shard_num_cpus},
            ).bind(str(version_dir / "shards" / shard), str(version_dir), expect, cfg.verify_checksums,
                   cfg.lucene_heap))
            for shard in manifest.shards
        ]
        collections[name] = {"version": manifest.version, "shards": shards, "encoder": encoders[manifest.encoder]}
    default = cfg.default_collection if cfg.collections else next(iter(collections))
    return SearchRouter.options(
        name="router",
        num_replicas=cfg.router_replicas,
        ray_actor_options={"num_cpus": cfg.router_num_cpus},
        user_config=cfg.router.model_dump(mode="json"),
    ).bind(collections, default)
