"""The typed app builder: one Serve application (router [-> encoders] [-> shard retrievers]) from AppConfig.

``serve run serve_config.yaml`` calls ``build_app(args)`` with the YAML's ``args``; the same model
is filled by ``python -m deployments``. Everything is validated before any replica starts.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ray.serve import Application

from deployments.config import AppConfig, RerankerConfig, ShardsConfig, SynthesisConfig, replica_options
from deployments.placement import (
    GroupNeed,
    actor_options,
    check_groups_exist,
    group_need,
    group_options,
    per_node,
    unplaceable,
)
from deployments.serve.query_encoder import QueryEncoder
from deployments.serve.reach import check_nodes_reach
from deployments.serve.rebalancer import Rebalancer
from deployments.serve.reranker import Reranker
from deployments.serve.router import SearchRouter
from deployments.serve.shard_group import ShardRetriever
from deployments.serve.specs import (
    CollectionSpec,
    CreatedOptions,
    HeldSlot,
    HostSpec,
    SlotSpec,
    served_version,
    slot_name,
)
from deployments.serve.synthesis import Synthesis
from index_format.manifest import MANIFEST, VersionManifest
from index_format.object_root import CACHE_DIR_ENV, STATE_ENV
from index_format.prompts import EncoderSpec
from index_format.versions import (
    absolute_root,
    open_root,
    shard_bytes,
)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
logger = logging.getLogger("ray.serve")


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
    return Reranker.options(
        name="reranker",
        max_ongoing_requests=cfg.max_ongoing_requests,
        ray_actor_options=actor_options(cfg.num_cpus, cfg.num_gpus, cfg.resources),
        **per_node(cfg.max_replicas_per_node),
        **cfg.autoscaling.serve_options(),
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


def judgments_root(index: str, version_dir: Path | None) -> str:
    """The root whose judgments a collection keeps (``deployments.judgments.judgments_of``): the index root, in a
    folder or in object storage; the root above it when the config names a version folder."""
    if version_dir is None or Path(index) != version_dir:
        return index
    return str(version_dir.parent.parent if version_dir.parent.name == "versions" else version_dir)



def node_env(cfg: AppConfig) -> dict[str, str]:
    """What every replica that opens an index root is told of its node's disks (``shards.cache_dir``,
    ``state_dir``), as Ray's runtime environment."""
    env = {}
    if cfg.shards.cache_dir is not None:
        env[CACHE_DIR_ENV] = str(Path(cfg.shards.cache_dir).expanduser().resolve())
    if cfg.state_dir is not None:
        env[STATE_ENV] = str(Path(cfg.state_dir).expanduser().resolve())
    return env


def with_env(options: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    return options | {"runtime_env": {"env_vars": env}} if env else options


def shard_groups(shards: list[str], group_size: int) -> list[list[str]]:
    """The shards each shard deployment serves: all in one group (0), or consecutive groups of ``group_size``."""
    size = group_size or len(shards) or 1
    return [shards[i:i + size] for i in range(0, len(shards), size)]


def logical_cpus_needed(cfg: AppConfig) -> float:
    """Ray CPUs the app reserves to start (the reranker at its initial replicas), so a machine too small
    for it is told so instead of leaving replicas unscheduled forever."""
    need, manifests = 0.0, []
    for name, c in cfg.resolved_collections().items():
        manifests.append(served_version(absolute_root(c.index), c.version)[0])
        s = cfg.shards_of(name)
        if not s.in_router:
            groups = len(shard_groups(list(manifests[-1].shards), s.group_size))
            need += sum(s.group(i).starting_replicas for i in range(groups)) * s.num_cpus
    if not cfg.encoder.in_router:
        models = {m.encoder for m in manifests} | {e.encoder for m in manifests for e in m.encoders.values()}
        need += len(models) * cfg.encoder.num_replicas * cfg.encoder.num_cpus
    need += (cfg.router.autoscaling.starting_replicas if cfg.router.autoscaling else cfg.router.num_replicas) \
        * cfg.router.num_cpus
    if cfg.reranker.model:
        need += cfg.reranker.autoscaling.starting_replicas * cfg.reranker.num_cpus
    if cfg.synthesis.enabled:
        need += cfg.synthesis.num_replicas * cfg.synthesis.num_cpus
    return need


def logging_config(cfg: AppConfig) -> dict[str, Any]:
    """Serve's logging for every deployment: JSON lines by default (each written during a request carries its
    request id), and no access log: a line per request costs every replica CPU at high rates, and the router
    writes one line per search itself (Serve's own metrics stay on)."""
    return {"encoding": cfg.log_encoding, "enable_access_log": False}


def encoder_deployment(cfg: AppConfig, spec: EncoderSpec, index: int):
    """A batching query-encoder deployment for one model and its prompts (``encoder.placement: deployment``)."""
    e = cfg.encoder
    return QueryEncoder.options(
        name=f"encoder-{index}",
        num_replicas=e.num_replicas,
        ray_actor_options=actor_options(e.num_cpus, e.num_gpus, e.resources),
        **per_node(e.max_replicas_per_node),
        logging_config=logging_config(cfg),
    ).bind(spec, e.max_batch_size, e.batch_wait_s, max(1, int(e.num_cpus)), "cuda" if e.num_gpus else "cpu",
           e.backend)


@dataclass(frozen=True)
class PlacedGroup:
    """One shard group of a collection as the app starts it: its shards, and its deployment's options (None: it is
    searched inside the router) and what a replica of it asks of a node."""

    index: int
    shards: list[str]
    options: dict[str, Any] | None
    need: GroupNeed | None


def placed_groups(shards: ShardsConfig, collection: str, index: str, manifest: VersionManifest) -> list[PlacedGroup]:
    """Each group of the served version's shards, placed by ``shards`` (``deployments.placement``); the bytes of
    its files are read (``index_format.versions.shard_bytes``) only when its memory is sized by them."""
    groups = shard_groups(list(manifest.shards), shards.group_size)
    check_groups_exist(collection, shards, len(groups))
    if shards.in_router:
        return [PlacedGroup(i, group, None, None) for i, group in enumerate(groups)]
    sizes = shard_bytes(index, manifest.version) if shards.memory_per_replica == "auto" else {}
    placed = []
    for i, group in enumerate(groups):
        group_bytes = sum(sizes.get(shard, 0) for shard in group)
        options = group_options(shards, i, group_bytes)
        placed.append(PlacedGroup(i, group, options, group_need(collection, i, group, options, group_bytes)))
    return placed


def shard_slots(cfg: AppConfig, collection: str, host: HostSpec, groups: list[PlacedGroup]) -> list[SlotSpec]:
    """One slot per group of shards: slot i serves group i of whichever version a request is pinned to, from a
    shard deployment or from inside the router (``shards.placement``)."""
    s = cfg.shards_of(collection)
    slots = []
    for g in groups:
        name, group_host = slot_name(collection, g.shards, g.index), replace(host, shards=g.shards)
        if g.options is None:
            slots.append(SlotSpec(name, HeldSlot(group_host, s.max_versions), g.shards))
            continue
        options = g.options | {"ray_actor_options": with_env(g.options["ray_actor_options"], node_env(cfg))}
        slots.append(SlotSpec(name, ShardRetriever.options(
            name=name,
            max_ongoing_requests=s.max_ongoing_requests,
            logging_config=logging_config(cfg),
            **options,
        ).bind(max_versions=s.max_versions, **asdict(group_host)), g.shards))
    return slots


def rebalancer_deployment(cfg: AppConfig, collections) -> Any:
    """The deployment that moves shard replicas onto nodes that join (``rebalance.enabled``), over every shard
    deployment of the app; None when off or when every collection's shards are searched inside the router."""
    groups = [slot.name for c in collections for slot in c.slots if not isinstance(slot.target, HeldSlot)]
    if not cfg.rebalance.enabled or not groups:
        return None
    return Rebalancer.options(name="rebalancer", logging_config=logging_config(cfg)).bind(
        groups, cfg.rebalance.model_dump(mode="json"))


def cluster_nodes() -> list[dict[str, float]] | None:
    """Each alive node's total resources (CPU, GPU, memory, custom ones) when Ray runs in this process; else None."""
    import ray

    if not ray.is_initialized():
        return None
    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def placement_warnings(cfg: AppConfig, nodes: list[dict[str, float]] | None = None) -> list[str]:
    """The shard groups no node of the cluster (``nodes``, default: the running one's) can hold a replica of, each as
    one line; none before Ray runs. ``python -m deployments`` prints them; ``build_app`` logs its own."""
    nodes = cluster_nodes() if nodes is None else nodes
    if not nodes:
        return []
    needs = []
    for name, coll in cfg.resolved_collections().items():
        index = absolute_root(coll.index)
        needs += [g.need for g in placed_groups(cfg.shards_of(name), name, index, served_version(index, coll.version)[0])
                  if g.need is not None]
    return unplaceable(needs, nodes)



def created_options(cfg: AppConfig) -> CreatedOptions | None:
    """How the router serves the collections created through the API; None: ``collections_root`` unset."""
    if cfg.collections_root is None:
        return None
    s = cfg.shards
    return CreatedOptions(collections_root=absolute_root(cfg.collections_root), verify_checksums=s.verify_checksums,
                          lucene_heap=s.lucene_heap, search_device=s.search_device,
                          warmup_searches=s.warmup_searches, max_versions=s.max_versions,
                          encoder_backend=cfg.encoder.backend, encoder_threads=cfg.encoder.router_threads)


def build_app(args: dict[str, Any] | AppConfig) -> Application:
    cfg = args if isinstance(args, AppConfig) else AppConfig.model_validate(args)
    check_nodes_reach(sorted({absolute_root(c.index) for c in cfg.resolved_collections().values()}))
    encoders: dict[EncoderSpec, Any] = {}
    collections: dict[str, CollectionSpec] = {}
    needs: list[GroupNeed] = []
    for name, coll in cfg.resolved_collections().items():
        if not _NAME.match(name):
            raise ValueError(f"collection name {name!r}: use 1-48 letters, digits, '-' or '_'")
        index = absolute_root(coll.index)
        manifest, version_dir = served_version(index, coll.version)
        # An index root without a pinned version follows its ACTIVE pointer; a version folder never moves. A root in
        # object storage is named to the hosts either way: they fetch their files from it.
        shared = open_root(index).shared_by_nodes
        follows = coll.version is None and (shared or not (Path(index) / MANIFEST).is_file())
        host_root = index if follows or shared else None
        spec = EncoderSpec.of(manifest)  # one query encoder a model and its prompts, shared by the collections
        for each in (spec, *(e.spec for e in manifest.encoders.values())):
            if each not in encoders:
                encoders[each] = None if cfg.encoder.in_router else encoder_deployment(cfg, each, len(encoders))
        s = cfg.shards_of(name)
        host = HostSpec(index_root=host_root, version_dir=str(version_dir) if version_dir else None,
                        version=manifest.version,
                        shards=list(manifest.shards),
                        expect=manifest.shard_expect(),
                        verify_checksums=s.verify_checksums, lucene_heap=s.lucene_heap,
                        search_device=s.search_device, warmup_searches=s.warmup_searches)
        groups = placed_groups(s, name, index, manifest)
        needs += [g.need for g in groups if g.need is not None]
        collections[name] = CollectionSpec(
            name=name, version=manifest.version, slots=shard_slots(cfg, name, host, groups),
            encoder_spec=spec, dimension=manifest.dimension,
            # Beside the versions, so judgments outlive restarts and reindexing.
            judgments=judgments_root(index, version_dir),
            encoder=encoders[spec], encoder_backend=cfg.encoder.backend,
            encoder_threads=cfg.encoder.router_threads, root=str(index) if follows else None,
            rerank=coll.rerank, ann=coll.ann, counts=dict(manifest.counts), bm25=dict(manifest.bm25),
            field_weights=coll.field_weights,
            named_encoders={n: (e.spec, encoders[e.spec]) for n, e in manifest.encoders.items()})
    # Never a failure: a node that can hold the group may join later. Ray keeps its replicas pending meanwhile.
    nodes = cluster_nodes()
    for warning in unplaceable(needs, nodes) if nodes else []:
        logger.warning("shard placement: %s", warning)
    default = cfg.default_collection if cfg.collections else next(iter(collections))
    reranker = reranker_deployment(cfg.reranker, logging_config(cfg)) if cfg.reranker.model else None
    synthesis = synthesis_deployment(cfg.synthesis, logging_config(cfg)) if cfg.synthesis.enabled else None
    rebalancer = rebalancer_deployment(cfg, collections.values())
    r = cfg.router
    return SearchRouter.options(
        name="router",
        **replica_options(r.num_replicas, r.autoscaling),
        ray_actor_options=with_env({"num_cpus": r.num_cpus, "resources": dict(r.resources)}, node_env(cfg)),
        max_queued_requests=r.max_queued_requests,
        user_config=r.settings().model_dump(mode="json"),
        logging_config=logging_config(cfg),
    ).bind(collections, default, reranker, synthesis, cfg.synthesis.llm_rerank, cfg.security,
           otlp_endpoint=cfg.otlp_endpoint, rebalancer=rebalancer, created=created_options(cfg))
