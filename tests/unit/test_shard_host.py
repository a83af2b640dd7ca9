"""A version's life in a process that holds shards: one load per version however many callers ask (and whether they
wait for it), a cache keeping the most recently used, and one closer of what a cache lets go, after a grace period.
Both caches are covered: the router's ``VersionCache`` (``shards.placement: router``) and a shard deployment's
(Serve's multiplexing, through ``MultiplexedVersion``)."""

from __future__ import annotations

import asyncio
import gc
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from deployments.shard.host import MultiplexedVersion, ShardHost, VersionCache
from tests.waiting import until


class Group:
    """A version's group of shards as a stand-in: its name, and nothing to warm up."""

    def __init__(self, version: str):
        self.version = version

    def warm_up(self, searches: int) -> None:
        pass


def _host_opening_when_let(opened: list, may_open: threading.Event, closed: list | None = None,
                           closed_one: threading.Event | None = None) -> ShardHost:
    """A shard host (its threads, no index) whose versions open when the test lets them, counted, and whose closes
    are recorded. Events, not sleeps: the order is the test's, on any machine."""
    host = ShardHost.__new__(ShardHost)
    host.loader = ThreadPoolExecutor(1)
    host.worker = ThreadPoolExecutor(1)
    host.warmup_searches, host._loads, host._closing, host.opened = 0, {}, set(), {}

    def open_version(version: str, warm: bool = True):
        may_open.wait(10)
        if version == "broken":
            raise FileNotFoundError(version)
        opened.append(version)
        return Group(version)

    def close_version(version: str, group) -> None:  # on the index thread, as the real one
        closed.append((version, group.version))
        closed_one.set()

    host.open_version, host.close_version = open_version, close_version
    return host


def _opening_at_once(opened: list, **closes) -> ShardHost:
    may_open = threading.Event()
    may_open.set()
    return _host_opening_when_let(opened, may_open, **closes)


def test_concurrent_requests_for_a_version_load_it_once():
    async def run():
        opened, may_open = [], threading.Event()
        cache = VersionCache(_host_opening_when_let(opened, may_open), max_versions=2)
        waiting = [asyncio.create_task(cache.get("v1")) for _ in range(5)]
        await until(lambda: "v1" in cache.host._loads, 5, "the one load of v1 started")
        may_open.set()
        got = await asyncio.gather(*waiting)
        assert len({id(g) for g in got}) == 1 and got[0].version == "v1" and opened == ["v1"]
        assert await cache.get("v1") is got[0] and opened == ["v1"]

    asyncio.run(run())


def test_the_least_recently_used_version_is_dropped():
    async def run():
        opened = []
        cache = VersionCache(_opening_at_once(opened, closed=[], closed_one=threading.Event()), max_versions=2)
        for v in ("v1", "v2", "v1", "v3"):  # v1 used again after v2, so v2 is the one dropped for v3
            await cache.get(v)
        await cache.get("v1")
        assert opened == ["v1", "v2", "v3"]
        await cache.get("v2")
        assert opened == ["v1", "v2", "v3", "v2"]

    asyncio.run(run())


def test_a_load_outlives_a_request_that_gave_up_and_a_failure_is_retried():
    async def run():
        opened, may_open = [], threading.Event()
        cache = VersionCache(_host_opening_when_let(opened, may_open), max_versions=2)
        with pytest.raises(asyncio.TimeoutError):  # the load cannot finish before the test lets it
            await asyncio.wait_for(cache.get("v2"), 0.01)
        may_open.set()
        assert (await cache.get("v2")).version == "v2" and opened == ["v2"]
        for _ in range(2):
            with pytest.raises(FileNotFoundError):
                await cache.get("broken")

    asyncio.run(run())


def test_an_evicted_version_is_closed_after_the_grace_period():
    async def run():
        opened, closed, closed_one = [], [], threading.Event()
        cache = VersionCache(_opening_at_once(opened, closed=closed, closed_one=closed_one), max_versions=1,
                             close_grace_s=0.05)
        await cache.get("v1")
        await cache.get("v2")  # evicts v1
        assert closed == [] and len(cache.host._closing) == 1  # pinned requests may still be at work on it
        assert await asyncio.to_thread(closed_one.wait, 5)
        assert closed == [("v1", "v1")]

    asyncio.run(run())


def test_a_late_caller_of_a_load_does_not_keep_a_version_let_go_meanwhile():
    """Callers that waited on one load come back one after another; a version evicted in between (its close
    scheduled) is used by the late caller's request, within the grace period, but not kept to be closed under the
    requests after it."""
    async def run():
        groups = {v: Group(v) for v in ("v1", "v2")}
        closing = []

        async def load(version):
            return groups[version]  # the same group however often asked: what waiters on one load get

        host = SimpleNamespace(load=load, close_later=lambda v, g, grace_s: closing.append(v))
        cache = VersionCache(host, max_versions=1)
        assert await cache.get("v1") is groups["v1"]
        assert await cache.get("v2") is groups["v2"] and closing == ["v1"]  # v1 let go
        assert await cache.get("v1") is groups["v1"]  # the late caller of v1's load
        assert list(cache._groups) == ["v2"] and closing == ["v1"]

    asyncio.run(run())


def test_a_version_serves_multiplexing_evicts_goes_to_the_same_closer_once():
    """Serve's multiplexing evicts by awaiting the kept object's ``__del__`` and then replacing it
    (``ray.serve.multiplex.unload_model_lru``): the version is closed once, after the grace period, and collecting the
    object closes nothing more (the old code closed from the class's ``__del__`` on a timer)."""
    async def run():
        opened, closed, closed_one = [], [], threading.Event()
        host = _opening_at_once(opened, closed=closed, closed_one=closed_one)
        kept = await MultiplexedVersion.load(host, "v1", grace_s=0.05)
        assert kept.group.version == "v1" and opened == ["v1"]
        await kept.__del__()  # what Serve does when it evicts it
        kept.__del__ = lambda _: None
        assert closed == [] and len(host._closing) == 1
        await asyncio.wait_for(asyncio.gather(*host._closing), 5)
        assert closed == [("v1", "v1")] and not host._closing
        del kept
        gc.collect()  # a close scheduled now would be in host._closing at once
        assert closed == [("v1", "v1")] and not host._closing

    asyncio.run(run())


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
        assert isinstance(group, Group) and opened == ["v2"] and not host._loads  # taken: not held twice
        first, second = await asyncio.gather(host.load("v3"), host.load("v3"))  # at once: one load, one group
        assert first is second and opened == ["v2", "v3"]
        for _ in range(2):  # a failed load is tried again by the next caller
            with pytest.raises(FileNotFoundError):
                await host.load("broken")
        assert not host._loads

    asyncio.run(run())
