"""The router's cache of opened index versions (``shards.placement: router``): one load per version at a
time, the least recently used dropped past ``max_versions``, and a load that outlives a request that
gave up on it; and the same of a shard deployment's host, whose loads Serve's multiplexing asks for."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from deployments.shard.host import ShardHost, VersionCache
from tests.waiting import until


class CountingHost:
    """Opens a "version" (a string) when the test lets it (``loads_may_finish``), counting the opens; closes one
    when the test says its grace period is over. Events, not sleeps: the order is the test's, on any machine."""

    def __init__(self, gated: bool = False):
        self.asked, self.opened, self.closed, self.graces = [], [], [], []
        self.loads_may_finish = asyncio.Event()
        if not gated:
            self.loads_may_finish.set()
        self.grace_over = asyncio.Event()
        self.closed_one = asyncio.Event()

    async def load(self, version: str) -> str:
        self.asked.append(version)
        await self.loads_may_finish.wait()
        if version == "broken":
            raise FileNotFoundError(version)
        self.opened.append(version)
        return f"group of {version}"

    async def close_later(self, version: str, group, grace_s: float) -> None:
        self.graces.append(grace_s)
        await self.grace_over.wait()
        self.closed.append((version, group))
        self.closed_one.set()


def test_concurrent_requests_for_a_version_load_it_once():
    async def run():
        cache = VersionCache(CountingHost(gated=True), max_versions=2)
        waiting = [asyncio.create_task(cache.get("v1")) for _ in range(5)]
        # The one load is a task the first request started, run after all five asked: once it runs, all five wait.
        await until(lambda: cache.host.asked == ["v1"], 5, "the load of v1 started")
        cache.host.loads_may_finish.set()
        got = await asyncio.gather(*waiting)
        assert got == ["group of v1"] * 5 and cache.host.opened == ["v1"]
        assert await cache.get("v1") == "group of v1" and cache.host.opened == ["v1"]

    asyncio.run(run())


def test_the_least_recently_used_version_is_dropped():
    async def run():
        cache = VersionCache(CountingHost(), max_versions=2)
        for v in ("v1", "v2", "v1", "v3"):  # v1 used again after v2, so v2 is the one dropped for v3
            await cache.get(v)
        await cache.get("v1")
        assert cache.host.opened == ["v1", "v2", "v3"]
        await cache.get("v2")
        assert cache.host.opened == ["v1", "v2", "v3", "v2"]

    asyncio.run(run())


def test_a_load_outlives_a_request_that_gave_up_and_a_failure_is_retried():
    async def run():
        cache = VersionCache(CountingHost(gated=True), max_versions=2)
        with pytest.raises(asyncio.TimeoutError):  # the load cannot finish before the test lets it
            await asyncio.wait_for(cache.get("v2"), 0.01)
        cache.host.loads_may_finish.set()
        assert await cache.get("v2") == "group of v2" and cache.host.opened == ["v2"]
        for _ in range(2):
            with pytest.raises(FileNotFoundError):
                await cache.get("broken")

    asyncio.run(run())


def test_an_evicted_version_is_closed_after_the_grace_period():
    async def run():
        cache = VersionCache(CountingHost(), max_versions=1, close_grace_s=0.05)
        await cache.get("v1")
        await cache.get("v2")  # evicts v1
        await until(lambda: cache.host.graces, 5, "v1's close scheduled")
        assert cache.host.graces == [0.05] and cache.host.closed == []  # pinned requests may still be at work
        cache.host.grace_over.set()
        await asyncio.wait_for(cache.host.closed_one.wait(), 5)
        assert cache.host.closed == [("v1", "group of v1")]

    asyncio.run(run())


class SlowGroup:
    def warm_up(self, searches: int) -> None:
        pass


def _host_opening_when_let(opened: list, may_open: threading.Event) -> ShardHost:
    """A shard host (its threads, no index) whose versions open when the test lets them, counted."""
    host = ShardHost.__new__(ShardHost)
    host.loader = ThreadPoolExecutor(1)
    host.worker = ThreadPoolExecutor(1)
    host.warmup_searches, host._loads = 0, {}

    def open_version(version: str, warm: bool = True):
        may_open.wait(10)
        if version == "broken":
            raise FileNotFoundError(version)
        opened.append(version)
        return SlowGroup()

    host.open_version = open_version
    return host


def test_a_hosts_load_outlives_callers_that_gave_up_and_the_next_caller_gets_it():
    """What a shard deployment's health check did to a version that takes longer to open than its deadline: each
    check cancelled the load and the next opened the version again, forever. Now the version opens once."""
    async def run():
        opened, may_open = [], threading.Event()
        host = _host_opening_when_let(opened, may_open)
        for _ in range(3):  # three health checks in a row, each giving up after its deadline
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(host.load("v2"), 0.01)
        may_open.set()
        group = await host.load("v2")
        assert isinstance(group, SlowGroup) and opened == ["v2"] and not host._loads  # taken: not held twice
        first, second = await asyncio.gather(host.load("v3"), host.load("v3"))  # at once: one load, one group
        assert first is second and opened == ["v2", "v3"]
        for _ in range(2):  # a failed load is tried again by the next caller
            with pytest.raises(FileNotFoundError):
                await host.load("broken")
        assert not host._loads

    asyncio.run(run())
