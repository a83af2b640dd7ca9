"""Serve deployment: one replica that checks the shard groups' layout every ``check_interval_s`` and makes at most
one move a check (``deployments.rebalance``). Serve keeps it at one replica and starts it again elsewhere if its node
goes, so two moves never run at once."""

from __future__ import annotations

import asyncio
import logging

from ray import serve

from deployments.config import RebalanceConfig
from deployments.rebalance.mover import Rebalancing, ServeApp

logger = logging.getLogger("ray.serve")


@serve.deployment(ray_actor_options={"num_cpus": 0}, num_replicas=1, max_ongoing_requests=8)
class Rebalancer:
    async def __init__(self, groups: list[str], config: dict):
        self.config = RebalanceConfig.model_validate(config)
        app = ServeApp(serve.get_replica_context().app_name, groups)
        self.rebalancing = Rebalancing(app, self.config.strategy, self.config.move_timeout_s)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.check_interval_s)
            try:
                await asyncio.to_thread(self.rebalancing.check)
            except Exception:  # a check that failed (the controller busy, a node gone mid-read) is tried again
                logger.exception("rebalance: the check failed")

    async def report(self) -> dict:
        return self.rebalancing.report() | {"check_interval_s": self.config.check_interval_s}
