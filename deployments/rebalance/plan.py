"""Where the shard replicas of a cluster stand against their fair share of each node, and the one move that brings
them closer. Ray-free: ``mover`` reads the layout from Serve and carries the move out.

A node's share is the replicas it would hold if they were spread by the strategy's weight (``replicas``: every node
alike; ``cpus``: by its CPUs). A move takes a replica from the node furthest above its share to one below it, and is
worth making only when it lowers the spread: when the source's excess exceeds the target's by more than one replica
(by exactly one, the move would only swap the two nodes' places and the next check would move it back).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Move:
    group: str  # the shard deployment one of whose replicas moves
    source: str  # the node it leaves
    target: str  # a node that should take it


@dataclass(frozen=True)
class Layout:
    """``weights``: every node that can hold shard replicas (alive, not draining), by its weight; ``replicas``: each
    shard deployment's running replicas, as the nodes they run on; ``max_per_node``: a deployment's bound on replicas
    a node (None: no bound)."""

    weights: dict[str, float]
    replicas: dict[str, list[str]]
    max_per_node: dict[str, int | None] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(self.weights, 0)
        for nodes in self.replicas.values():
            for node in nodes:
                if node in counts:
                    counts[node] += 1
        return counts

    def excess(self) -> dict[str, float]:
        """Each node's replicas above (or below, negative) its share."""
        counts, total_weight = self.counts(), sum(self.weights.values())
        total = sum(counts.values())
        return {node: counts[node] - (total * w / total_weight if total_weight else 0.0)
                for node, w in self.weights.items()}

    def improves(self, source: str, target: str) -> bool:
        excess = self.excess()
        return source in excess and target in excess and excess[source] - excess[target] > 1 + 1e-9

    def fits(self, group: str, node: str) -> bool:
        bound = self.max_per_node.get(group)
        return bound is None or self.replicas.get(group, []).count(node) < bound

    def next_move(self) -> Move | None:
        """The move that lowers the spread most, or None when every move would leave it as it is: from the node
        furthest above its share, of a group it holds that fits on the node furthest below; ties broken by name, so
        two checks of one layout agree."""
        excess = self.excess()
        for source in sorted(excess, key=lambda n: (-excess[n], n)):
            for target in sorted(excess, key=lambda n: (excess[n], n)):
                if not self.improves(source, target):
                    break
                for group in sorted(self.replicas):
                    if source in self.replicas[group] and self.fits(group, target):
                        return Move(group, source, target)
        return None
