"""Before anything is deployed: can every node of the cluster read each index root?

A replica scheduled on a node that cannot read its root (no shared folder mounted there, no route to the object
store, no credentials) would fail in its constructor, and Serve would retry that constructor for good. So the app
builder asks each alive node once, with a task pinned to it, and refuses to start with one line naming the node and
the root. On one machine this is one task.
"""

from __future__ import annotations

from pathlib import Path


def root_problem(root: str) -> str | None:
    """Why this process cannot read ``root`` (None: it can). Ray-free."""
    from index_format.store import StoreError
    from index_format.versions import open_root

    try:
        opened = open_root(root)
        if opened.shared_by_nodes:
            opened.active()
        elif not Path(root).exists():
            return "no such file or folder on this node"
    except (StoreError, OSError) as e:
        return str(e)
    return None


class RootUnreachable(ValueError):
    """A node cannot read an index root: the app is not started (a configuration or network problem)."""


def check_nodes_reach(roots: list[str]) -> None:
    """Raise ``RootUnreachable`` (one line) when an alive node of the Ray cluster cannot read one of ``roots``; before
    Ray runs, when this process cannot."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not roots:
        return
    if not ray.is_initialized():
        for root in roots:
            problem = root_problem(root)
            if problem:
                raise RootUnreachable(f"this machine cannot read the index root {root}: {problem}")
        return
    probe = ray.remote(num_cpus=0, max_retries=0)(lambda: [(r, root_problem(r)) for r in roots])
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    answers = ray.get([probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                       .remote() for n in nodes])
    for node, problems in zip(nodes, answers, strict=True):
        for root, problem in problems:
            if problem:
                raise RootUnreachable(f"node {node['NodeManagerAddress']} (Ray node {node['NodeID'][:12]}) cannot read the "
                                   f"index root {root}: {problem}")
