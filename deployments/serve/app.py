"""The typed app builder: one Serve application (router [-> encoders] [-> shard retrievers]) from AppConfig.

``serve run serve_config.yaml`` calls ``build_app(args)`` with the YAML's ``args``; the same model
is filled by ``python -m deployments``. Everything is validated before any replica starts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ray.serve import Application

from deployments.config import AppConfig, RerankerConfig, SynthesisConfig
from deployments.serve.query_encoder import QueryEncoder
from deployments.serve.reranker import Reranker
from deployments.serve.router import SearchRouter
from deployments.serve.shard_group import ShardRetriever
from deployments.serve.synthesis import Synthesis
from index_format.manifest import MANIFEST
from index_format.versions import read_version_manifest, resolve_version_dir

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,48}$")


def check_model_available(model: str, what: str) -> None:
    """Fail before any replica starts when an offline machine could not load the model."""
    if Path(model).expanduser().exists() or os.environ.get("HF_HUB_OFFLINE") != "1":
        return
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(model, "config.json"), str):
        raise ValueError(f"{what} {model!r} is neither a folder nor in the local hub cache, and HF_HUB_OFFLINE=1 "
                         "forbids downloading it: give a local path, or download it once where a hub is reachable")


def reranker_deployment(cfg: RerankerConfig, logs: dict[str, Any] | None = None):
    check_model_available(cfg.model, "reranker.model")
    a = cfg.autoscaling
    return Reranker.options(
        name="reranker",
        max_ongoing_requests=cfg.max_ongoing_requests,
        ray_actor_options={"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus, "resources": dict(cfg.resources)},
        autoscaling_config={"min_replicas": a.min_replicas, "max_replicas": a.max_replicas,
                            "initial_replicas": max(1, a.min_replicas),
                            "target_ongoing_requests": a.target_ongoing_requests,
                            "upscale_delay_s": a.upscale_delay_s, "downscale_delay_s": a.downscale_delay_s},
        user_config=cfg.batching.model_dump(mode="json"),
        **({"logging_config": logs} if logs else {}),
    ).bind(cfg.model, "cuda" if cfg.num_gpus else cfg.device, cfg.dtype, cfg.max_length,
           cfg.threads or max(1, int(cfg.num_cpus)))


def synthesis_deployment(cfg: SynthesisConfig, logs: dict[str, Any] | None = None):
    if cfg.model is not None and cfg.model != "smollm2" and not cfg.model.endswith(".gguf"):
        check_model_available(cfg.model, "synthesis.model")
    return Synthesis.options(
        name="synthesis",
        num_replicas=cfg.num_replicas,
        ray_actor_options={"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus, "resources": dict(cfg.resources)},
        **({"logging_config": logs} if logs else {}),
    ).bind(cfg.model_dump(mode="json"))


def judgments_root(index: Path, version_dir: Path) -> Path:
    """The index root a collection's judgments live in, also when the config names a version folder."""
    if index != version_dir:
        return index
    return version_dir.parent.parent if version_dir.parent.name == "versions" else version_dir


def shard_groups(shards: list[str], group_size: int) -> list[list[str]]:
    """The shards each shard deployment serves: all in one group (0), or consecutive groups of ``group_size``."""
    size = group_size or len(shards) or 1
    return [shards[i:i + size] for i in range(0, len(shards), size)]


def slot_name(collection: str, group: list[str], index: int) -> str:
    """A shard deployment's name: ``<collection>-shard-000`` for one shard, ``<collection>-group-000`` else."""
    return f"{collection}-{group[0]}" if len(group) == 1 else f"{collection}-group-{index:03d}"


def logical_cpus_needed(cfg: AppConfig) -> float:
    """Ray CPUs the app reserves to start (the reranker at its initial replicas), so a machine too small
    for it is told so instead of leaving replicas unscheduled forever."""
    manifests = [read_version_manifest(resolve_version_dir(Path(c.index).resolve(), c.version))
                 for c in cfg.resolved_collections().values()]
    groups = sum(len(shard_groups(list(m.shards), cfg.shard_group_size)) for m in manifests)
    need = 0 if cfg.shards_in_router else groups * cfg.shard_num_replicas * cfg.shard_num_cpus
    if not cfg.encoder_in_router:
        need += len({m.encoder for m in manifests}) * cfg.encoder_num_replicas * cfg.encoder_num_cpus
    need += cfg.router_num_replicas * cfg.router_num_cpus
    if cfg.reranker.model:
        need += max(1, cfg.reranker.autoscaling.min_replicas) * cfg.reranker.num_cpus
    if cfg.synthesis.enabled:
        need += cfg.synthesis.num_replicas * cfg.synthesis.num_cpus
    return need


def logging_config(cfg: AppConfig) -> dict[str, Any]:
    """Serve's logging for every deployment: JSON lines by default (each written during a request carries its
    request id), and no access log: a line per request costs every replica CPU at high rates, and the router
    writes one line per search itself (Serve's own metrics stay on)."""
    return {"encoding": cfg.log_encoding, "enable_access_log": False}


def build_app(args: dict[str, Any] | AppConfig) -> Application:
    cfg = args if isinstance(args, AppConfig) else AppConfig.model_validate(args)
    encoders: dict[str, Any] = {}
    collections: dict[str, dict[str, Any]] = {}
    for name, coll in cfg.resolved_collections().items():
        if not _NAME.match(name):
            raise ValueError(f"collection name {name!r}: use 1-48 letters, digits, '-' or '_'")
        index = Path(coll.index).resolve()
        version_dir = resolve_version_dir(index, coll.version)
        manifest = read_version_manifest(version_dir)
        # An index root without a pinned version follows its ACTIVE pointer; a version folder never moves.
        follows = coll.version is None and not (index / MANIFEST).is_file()
        if manifest.encoder not in encoders:
            encoders[manifest.encoder] = None if cfg.encoder_in_router else QueryEncoder.options(
                name=f"encoder-{len(encoders)}",
                num_replicas=cfg.encoder_num_replicas,
                ray_actor_options={"num_cpus": cfg.encoder_num_cpus, "num_gpus": cfg.encoder_num_gpus},
                logging_config=logging_config(cfg),
            ).bind(manifest.encoder, cfg.encoder_max_batch_size, cfg.encoder_batch_wait_s,
                   max(1, int(cfg.encoder_num_cpus)), "cuda" if cfg.encoder_num_gpus else "cpu", cfg.encoder_backend)
        expect = {"encoder": manifest.encoder, "dimension": manifest.dimension}
        # One slot per group of shards: slot i serves group i of whichever version a request is pinned to,
        # from a shard deployment or from inside the router (shard_placement).
        slots = []
        for i, group in enumerate(shard_groups(list(manifest.shards), cfg.shard_group_size)):
            host = {"index_root": str(index) if follows else None, "version_dir": str(version_dir), "shards": group,
                    "expect": expect, "verify_checksums": cfg.verify_checksums, "lucene_heap": cfg.lucene_heap,
                    "search_device": cfg.shard_search_device, "warmup_searches": cfg.shard_warmup_searches}
            if cfg.shards_in_router:
                slots.append((slot_name(name, group, i), {"host": host, "max_versions": cfg.shard_max_versions},
                              group))
                continue
            slots.append((slot_name(name, group, i), ShardRetriever.options(
                name=slot_name(name, group, i),
                num_replicas=cfg.shard_num_replicas,
                max_ongoing_requests=cfg.shard_max_ongoing_requests,
                ray_actor_options={"num_cpus": cfg.shard_num_cpus, "num_gpus": cfg.shard_num_gpus,
                                   "resources": dict(cfg.shard_resources)},
                logging_config=logging_config(cfg),
            ).bind(max_versions=cfg.shard_max_versions, **host), group))
        collections[name] = {"version": manifest.version, "counts": dict(manifest.counts), "shards": slots, "encoder": encoders[manifest.encoder],
                             "encoder_model": manifest.encoder, "encoder_backend": cfg.encoder_backend,
                             "encoder_threads": cfg.encoder_router_threads,
                             "dimension": manifest.dimension,
                             "root": str(index) if follows else None, "rerank": coll.rerank,
                             "ann": coll.ann.model_dump() if coll.ann else None,
                             # Beside the versions, so judgments outlive restarts and reindexing.
                             "judgments": str(judgments_root(index, version_dir) / "judgments")}
    default = cfg.default_collection if cfg.collections else next(iter(collections))
    reranker = reranker_deployment(cfg.reranker, logging_config(cfg)) if cfg.reranker.model else None
    synthesis = synthesis_deployment(cfg.synthesis, logging_config(cfg)) if cfg.synthesis.enabled else None
    return SearchRouter.options(
        name="router",
        num_replicas=cfg.router_num_replicas,
        ray_actor_options={"num_cpus": cfg.router_num_cpus, "resources": dict(cfg.router_resources)},
        max_queued_requests=cfg.router_max_queued_requests,
        user_config=cfg.router.model_dump(mode="json"),
        logging_config=logging_config(cfg),
    ).bind(collections, default, reranker, synthesis, cfg.synthesis.llm_rerank, cfg.security.model_dump(mode="json"),
           otlp_endpoint=cfg.otlp_endpoint)
