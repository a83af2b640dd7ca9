"""Where each shard group's replicas go and what they reserve, and whether the running cluster has a node for them.

Ray-free: the app builder (``deployments.serve.app``) resolves every group with ``group_options`` into the options
its shard deployment gets, and hands ``unplaceable`` the nodes Ray reports. Ray itself keeps a replica pending until
a node has everything it asks for (memory included), so a group too large for every node waits, never packed onto a
node that cannot hold it; ``unplaceable`` only says so at start, in words, since Serve's own message is a replica
"taking long to be scheduled".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from deployments.config import ShardsConfig, replica_options

GIB = 2**30


def replica_memory(shards: ShardsConfig, group_bytes: int) -> int | None:
    """The bytes a replica of a group whose shard files hold ``group_bytes`` reserves (``memory_per_replica``):
    None, a fixed size, or auto: ``memory_base + memory_factor * max_versions * group_bytes`` (a replica holds up
    to ``max_versions`` versions loaded at once, each about its files' size)."""
    if shards.memory_per_replica is None:
        return None
    if shards.memory_per_replica != "auto":
        return int(shards.memory_per_replica)
    return int(shards.memory_base + shards.memory_factor * shards.max_versions * group_bytes)


def actor_options(num_cpus: float, num_gpus: float = 0, resources: Mapping[str, float] | None = None,
                  label_selector: Mapping[str, str] | None = None, memory: int | None = None) -> dict[str, Any]:
    """Serve's ``ray_actor_options`` of a replica: what it reserves, and where it may run (empty ones left out)."""
    options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": dict(resources or {})}
    if label_selector:
        options["label_selector"] = dict(label_selector)
    if memory is not None:
        options["memory"] = memory
    return options


def per_node(max_replicas_per_node: int | None) -> dict[str, Any]:
    """Serve's ``max_replicas_per_node`` option when one is set (Serve's default, no limit, when not)."""
    return {"max_replicas_per_node": max_replicas_per_node} if max_replicas_per_node is not None else {}


def group_options(shards: ShardsConfig, index: int, group_bytes: int) -> dict[str, Any]:
    """The deployment options of shard group ``index`` (``.options(**these)``): its replicas, what each reserves and
    where it may run, from ``shards`` with the group's own entry of ``shards.groups`` over it."""
    group = shards.group(index)
    return {
        **replica_options(group.num_replicas, group.autoscaling),
        "ray_actor_options": actor_options(shards.num_cpus, shards.num_gpus, group.resources, group.label_selector,
                                           replica_memory(shards, group_bytes)),
        **per_node(shards.max_replicas_per_node),
    }


def check_groups_exist(collection: str, shards: ShardsConfig, groups: int) -> None:
    """A ``shards.groups`` entry for a group the collection does not have is a mistake (a typo, or a group_size
    that makes fewer groups than planned): refused with the count and the rule."""
    extra = sorted(i for i in shards.groups if i >= groups)
    if extra:
        raise ValueError(f"shards.groups places group(s) {extra} but collection {collection!r} has {groups} group(s) "
                         f"(group_size {shards.group_size}, numbered from 0): fix the numbers, or give this collection "
                         "its own shards.groups (collections.<name>.shards)")


@dataclass(frozen=True)
class GroupNeed:
    """What one replica of a shard group asks of a node (Ray's resource names: CPU, GPU, memory, custom ones)."""

    collection: str
    group: int
    shards: list[str]
    resources: dict[str, float] = field(default_factory=dict)
    group_bytes: int = 0


def group_need(collection: str, index: int, shards_in_group: list[str], options: dict[str, Any],
               group_bytes: int) -> GroupNeed:
    """A group's need, read from the options ``group_options`` gave its deployment."""
    actor = options["ray_actor_options"]
    need = {"CPU": actor["num_cpus"], "GPU": actor["num_gpus"], **actor["resources"]}
    if "memory" in actor:
        need["memory"] = actor["memory"]
    return GroupNeed(collection, index, shards_in_group, {k: v for k, v in need.items() if v}, group_bytes)


def unplaceable(needs: Iterable[GroupNeed], nodes: list[Mapping[str, float]]) -> list[str]:
    """One warning for each group no node of ``nodes`` (each node's total resources, as ``ray.nodes()`` gives them)
    can hold a replica of: naming the collection, the group, what a replica needs, and the largest node. Not an
    error: a node that can hold it may join later (an autoscaler, a new worker group)."""
    warnings = []
    for need in needs:
        if any(all(node.get(k, 0) >= v for k, v in need.resources.items()) for node in nodes):
            continue
        custom = {k: v for k, v in need.resources.items() if k not in ("CPU", "GPU", "memory")}
        having = [n for n in nodes if all(n.get(k, 0) >= v for k, v in custom.items())]
        what = f"collection {need.collection!r}, shard group {need.group} ({', '.join(need.shards)})"
        if not having:
            problem = f"no node has the custom resources {custom}"
        else:
            largest = max(having, key=lambda n: n.get("memory", 0))
            asked = ", ".join(f"{k} {_amount(k, v)}" for k, v in need.resources.items())
            have = ", ".join(f"{k} {_amount(k, largest.get(k, 0))}" for k in need.resources)
            files = f" (its shard files: {_amount('memory', need.group_bytes)})" if need.group_bytes else ""
            problem = (f"a replica needs {asked}{files}; the largest node{' with ' + str(custom) if custom else ''} "
                       f"has {have}")
        warnings.append(f"{what}: {problem}. Its replicas stay pending until a node that can hold one joins the "
                        "cluster (or lower shards.memory_per_replica, or use more, smaller groups: shards.group_size)")
    return warnings


def _amount(resource: str, value: float) -> str:
    return f"{value / GIB:.1f} GiB" if resource == "memory" else f"{value:g}"
