"""GET /health's answer, Ray-free: each shard slot's and stage's answer (or failure) summed up into one status."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from deployments.api.health import service_health, shard_health, status_of
from deployments.edge.schemas import ShardHealth


def _line(ok: bool) -> ShardHealth:
    return ShardHealth(collection="docs", shard="s", ok=ok)


@pytest.mark.parametrize(("oks", "status"), [
    ([True, True, True], "ok"),
    ([True, False, True], "degraded"),
    ([False, False], "down"),
    ([], "down"),  # no shard answers
])
def test_the_status(oks, status):
    assert status_of([_line(ok) for ok in oks]) == status


def test_a_slot_that_failed_fails_every_shard_it_serves():
    slots = [SimpleNamespace(shards=["shard-000", "shard-001"]), SimpleNamespace(shards=["shard-002"])]
    lines = shard_health("docs", slots, [TimeoutError(), {"shards": {"shard-002": 17}}])
    assert [(s.shard, s.ok, s.chunks, s.error) for s in lines] == [
        ("shard-000", False, None, "TimeoutError"), ("shard-001", False, None, "TimeoutError"),
        ("shard-002", True, 17, None)]


class Slot:
    def __init__(self, shards: dict[str, int] | None, names: list[str]):
        self.answer, self.shards = shards, names

    async def info(self):
        if self.answer is None:
            raise ConnectionError("gone")
        return {"shards": self.answer}


def test_the_services_health_from_its_slots_and_stages():
    async def stage_ok():
        return {}

    async def stage_gone():
        raise ConnectionError("gone")

    docs = SimpleNamespace(name="docs", version="v2", shards=[Slot({"shard-000": 5, "shard-001": 7}, ["shard-000",
                                                                                                     "shard-001"])])
    news = SimpleNamespace(name="news", version="v1", shards=[Slot(None, ["shard-000"])])
    body = asyncio.run(service_health([docs, news], "docs", {"reranker": stage_ok, "synthesis": None}, 1.0))
    assert body.status == "degraded" and body.default_collection == "docs"
    assert body.collections == {"docs": "v2", "news": "v1"}
    assert [(s.collection, s.shard, s.ok) for s in body.shards] == [
        ("docs", "shard-000", True), ("docs", "shard-001", True), ("news", "shard-000", False)]
    assert body.stages == {"reranker": "ok", "synthesis": "off"}
    body = asyncio.run(service_health([news], "news", {"reranker": stage_gone}, 1.0))
    assert body.status == "down" and body.stages["reranker"].startswith("failed")
