"""A move of one shard replica onto a node that holds less than its share, carried out through Serve's controller
as an operator would by hand, one replica at a time, failing closed:

1. the group is held at one replica more (a per-deployment override of the deployed config, as ``serve deploy``
   applies it: nothing restarts); Serve starts the new replica where one of the group fits, which with
   ``max_replicas_per_node`` is a node holding none of it: the one that joined;
2. once it runs (Serve counts a replica running when its constructor, which opens the group's shards, and its first
   health check have passed), the old replica is marked to retire (``retire``): it fails its health checks and
   Serve stops it gracefully, sending it nothing new and letting what it has in flight finish;
3. the group is held at its count again, then given back its own config: the replacement Serve begins for the
   retired replica cannot start (its node is still the old one's until that one ends), so it is the one let go.

Any step that does not happen within ``move_timeout_s``, or a new replica on a node the move would not help, ends
the move with the group given back its config: Serve then keeps the replicas it had, one more or none fewer, and
never stops the last one running (a retire is only ever asked of a replica with a running one beside it).
"""

from __future__ import annotations

import copy
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from deployments.rebalance.plan import Layout, Move
from deployments.rebalance.retire import forget, retire

logger = logging.getLogger("ray.serve")

Strategy = Literal["replicas", "cpus"]


@dataclass(frozen=True)
class Replica:
    id: str
    node: str
    state: str


@dataclass(frozen=True)
class Group:
    """One shard deployment as Serve's controller reports it."""

    name: str
    status: str
    target: int
    replicas: tuple[Replica, ...]
    config: dict[str, Any]  # its deployment_config

    @property
    def running(self) -> list[Replica]:
        return [r for r in self.replicas if r.state == "RUNNING"]

    @property
    def steady(self) -> bool:
        return self.status == "HEALTHY" and len(self.running) == len(self.replicas) == self.target

    def needs(self) -> dict[str, float]:
        """The custom resources and CPUs a replica of it asks of a node."""
        options = self.config.get("ray_actor_options") or {}
        return {"CPU": float(options.get("num_cpus") or 0), **(options.get("resources") or {})}


class ServeApp:
    """What rebalancing reads and changes of one running Serve application, through Serve's controller: its shard
    deployments (``groups``, by name), the nodes that could hold them, and a group's replica count."""

    def __init__(self, app: str, groups: list[str], client=None):
        self.app, self.names = app, list(groups)
        if client is None:
            from ray.serve.context import _connect

            client = _connect()
        self.client = client

    def _details(self) -> dict[str, Any]:
        return self.client.get_serve_details()

    def read(self) -> tuple[str, dict[str, Group], dict[str, Any] | None]:
        """The application's status, its groups, and its deployed config (None when it was deployed in code)."""
        app = (self._details().get("applications") or {}).get(self.app) or {}
        groups = {}
        for name in self.names:
            d = (app.get("deployments") or {}).get(name)
            if d is None:
                continue
            groups[name] = Group(name, d.get("status", ""), int(d.get("target_num_replicas") or 0),
                                 tuple(Replica(r["replica_id"], r.get("node_id") or "", r.get("state", ""))
                                       for r in d.get("replicas") or []),
                                 d.get("deployment_config") or {})
        return app.get("status", ""), groups, app.get("deployed_app_config")

    def nodes(self) -> dict[str, dict[str, float]]:
        """Every node that takes new replicas (alive, not draining), with its total resources."""
        import ray
        from ray._private.state import state

        draining = set(state.get_draining_nodes())
        return {n["NodeID"]: dict(n.get("Resources") or {}) for n in ray.nodes()
                if n.get("Alive") and n["NodeID"] not in draining}

    def layout(self, groups: dict[str, Group], strategy: Strategy) -> Layout:
        nodes = self.nodes()
        capable = {node: resources for node, resources in nodes.items()
                   if any(all(resources.get(k, 0) >= v for k, v in g.needs().items()) for g in groups.values())}
        return Layout(weights={node: (float(r.get("CPU", 0)) if strategy == "cpus" else 1.0)
                               for node, r in capable.items()},
                      replicas={g.name: [r.node for r in g.running] for g in groups.values()},
                      max_per_node={g.name: g.config.get("max_replicas_per_node") for g in groups.values()})

    def deploy(self, config: dict[str, Any]) -> None:
        """Deploy this application's ``config``, every other application as it is deployed."""
        from ray.serve.schema import ServeDeploySchema

        from deployments.settings import declared_apps

        apps = declared_apps(self.client)
        apps[self.app] = config
        self.client.deploy_apps(ServeDeploySchema(applications=list(apps.values())))


def held(config: dict[str, Any], group: Group, count: int) -> dict[str, Any]:
    """``config`` with ``group`` held at exactly ``count`` replicas: a fixed ``num_replicas``, or for a group Serve
    autoscales, its bounds closed on ``count`` (bounds apply at once; a count the autoscaler chose would wait out its
    delays). Every other override of the config kept."""
    config = copy.deepcopy(config)
    overrides = list(config.get("deployments") or [])
    own = next((d for d in overrides if d.get("name") == group.name), {"name": group.name})
    autoscaling = group.config.get("autoscaling_config")
    if autoscaling:
        own = own | {"autoscaling_config": {**autoscaling, "min_replicas": count, "max_replicas": count,
                                            "initial_replicas": count}}
    else:
        own = own | {"num_replicas": count}
    config["deployments"] = [d for d in overrides if d.get("name") != group.name] + [own]
    return config


class Rebalancing:
    """Checks the layout and makes at most one move a check (``check``); keeps what it did for ``report``."""

    def __init__(self, app: ServeApp, strategy: Strategy = "replicas", move_timeout_s: float = 300,
                 poll_s: float = 0.5):
        self.app, self.strategy, self.move_timeout_s, self.poll_s = app, strategy, move_timeout_s, poll_s
        self.moves: deque[dict[str, Any]] = deque(maxlen=20)
        self.last: dict[str, Any] = {"state": "not checked yet"}

    def report(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "last_check": self.last, "moves": list(self.moves)}

    def check(self) -> dict[str, Any]:
        status, groups, config = self.app.read()
        if config is None:
            self.last = {"state": "off", "why": f"application {self.app.app!r} was not deployed from a config, so "
                         "no replica count of it can be changed in place"}
        elif status != "RUNNING" or not groups or not all(g.steady for g in groups.values()):
            self.last = {"state": "waiting", "why": "the application or a shard group is not steady (deploying, "
                         "starting, stopping or migrating replicas)"}
        else:
            layout = self.app.layout(groups, self.strategy)
            move = layout.next_move()
            if move is None:
                self.last = {"state": "balanced", "replicas_per_node": layout.counts()}
            else:
                done = self.move(move, groups[move.group], config, layout)
                self.moves.append(done)
                self.last = {"state": done["outcome"], "move": done}
        self.last["at"] = time.time()
        return self.last

    def _wait(self, ready: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + self.move_timeout_s
        while True:
            got = ready()
            if got or time.monotonic() >= deadline:
                return got
            time.sleep(self.poll_s)

    def _running(self, group: str) -> list[Replica]:
        g = self.app.read()[1].get(group)
        return g.running if g is not None else []

    def move(self, move: Move, group: Group, config: dict[str, Any], layout: Layout) -> dict[str, Any]:
        started = time.monotonic()
        before = {r.id: r for r in group.running}
        old = next(r for r in group.running if r.node == move.source)
        done: dict[str, Any] = {"group": move.group, "from": move.source, "planned_to": move.target,
                                "replica": old.id, "outcome": "failed"}
        retired = False
        logger.info("rebalance: moving a replica of %s off node %s (%s)", move.group, move.source, old.id)
        try:
            self.app.deploy(held(config, group, len(before) + 1))
            new = self._wait(lambda: [r for r in self._running(move.group) if r.id not in before])
            if not new:
                done["why"] = f"no new replica ran within {self.move_timeout_s:.0f} s"
                return done
            done["to"] = new[0].node
            if not layout.improves(move.source, new[0].node):
                done["why"] = f"the new replica started on node {new[0].node}, which would not even the layout"
                return done
            retire(old.id)
            retired = True
            if not self._wait(lambda: old.id not in {r.id for r in self._running(move.group)}):
                done["why"] = f"the old replica still ran {self.move_timeout_s:.0f} s after it was told to retire"
                return done
            self.app.deploy(held(config, group, len(before)))
            done["outcome"] = "moved"
        except Exception as e:  # any error: give the group its config back and stop nothing more
            done["why"] = f"{type(e).__name__}: {e}"
            logger.exception("rebalance: the move of a replica of %s failed", move.group)
        finally:
            self.app.deploy(config)
            if retired:
                forget(old.id)
        if done["outcome"] == "moved":
            settled = self._wait(lambda: (lambda rs: len(rs) == len(before) and rs)(self._running(move.group)))
            nodes = sorted(r.node for r in settled or [])
            if not settled or old.id in {r.id for r in settled} or done["to"] not in nodes:
                done["outcome"], done["why"] = "moved back", f"the group settled on nodes {nodes}"
        done["seconds"] = round(time.monotonic() - started, 1)
        logger.info("rebalance: %s", done)
        return done
