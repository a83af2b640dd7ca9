"""``GET /health`` without Ray: every shard slot and optional stage asked under a deadline, and their answers
summed up into one status.

The status is ``ok`` when every shard answered, ``degraded`` when some did (searches still answer, with
``coverage.degraded``), ``down`` when none did; a service that is down answers 503, so a load balancer takes the
replica out. The optional stages (reranker, synthesis) never change the status: a search without them still
answers, with a warning.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from deployments.edge.schemas import HealthResponse, ShardHealth
from deployments.search.clients import Collection
from deployments.search.stages import failure


def shard_health(collection: str, slots: Sequence[Any], answers: Sequence[dict | BaseException]) -> list[ShardHealth]:
    """One line a shard: each slot's ``info`` answer (its shards' chunk counts), or its failure for every shard it
    serves."""
    shards = []
    for slot, answer in zip(slots, answers, strict=True):
        if isinstance(answer, BaseException):
            shards += [ShardHealth(collection=collection, shard=name, ok=False, error=type(answer).__name__)
                       for name in slot.shards]
        else:
            shards += [ShardHealth(collection=collection, shard=name, ok=True, chunks=n)
                       for name, n in answer["shards"].items()]
    return shards


def status_of(shards: Iterable[ShardHealth]) -> str:
    """ok (every shard up), degraded (some), down (none: also when there is no shard at all)."""
    up = [s.ok for s in shards]
    return "down" if not any(up) else "ok" if all(up) else "degraded"


async def service_health(collections: Iterable[Collection], default_collection: str,
                stages: Mapping[str, Callable[[], Awaitable[Any]] | None], timeout_s: float) -> HealthResponse:
    """Every shard slot's ``info`` and every deployed stage's ``info`` (``stages``: None for one not deployed,
    reported ``off``), each under ``timeout_s``."""
    shards: list[ShardHealth] = []
    served = {}
    for c in collections:
        answers = await asyncio.gather(*(asyncio.wait_for(s.info(), timeout_s) for s in c.shards),
                                       return_exceptions=True)
        shards += shard_health(c.name, c.shards, answers)
        served[c.name] = c.version
    stage_status = {}
    for stage, info in stages.items():
        if info is None:
            stage_status[stage] = "off"
            continue
        try:
            await asyncio.wait_for(info(), timeout_s)
            stage_status[stage] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported, never raised: health answers whatever is away
            stage_status[stage] = failure(exc)
    return HealthResponse(status=status_of(shards), default_collection=default_collection, collections=served,
                          shards=shards, stages=stage_status)
