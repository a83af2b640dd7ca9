"""The index versions one shard slot serves, opened on demand and kept a few at a time. Ray-free.

A shard slot serves a fixed group of shard names (``shard-000``, ...) of whichever published version a
request is pinned to. The shard deployment wraps a host (Serve's model multiplexing keeps its versions
and routes each call to a replica holding the version); so does the router when it holds the shards
itself (``shards.placement: router``), keeping its versions in ``VersionCache``.

A version's life is here, whichever cache keeps it: ``ShardHost.load`` opens it (once, however many callers ask
and whether or not they wait), a cache keeps the few most recently used, and ``ShardHost.close_later`` closes one
the cache let go, after a grace period for the requests already pinned to it. The two caches (``VersionCache``, and
Serve's multiplexing through ``MultiplexedVersion``) only choose what to keep.

A host's Lucene calls run on one thread: pyjnius keeps per-method state that is not thread-safe. A large
group's dense leg runs meanwhile on a thread of its own (FAISS releases the GIL, and so do pyjnius's calls into
Java): at a million chunks in 4 shards the two legs cost about 5 and 9 ms, and one after another on one thread
they bounded a replica to about 60 searches a second with a core left idle. A small group's legs stay on the one
thread, where they cost less than the hop between threads. A ranking model's features that make no Lucene call are
computed where they are asked, for the same reason (``ShardHost.features``). A new version
is opened on a second thread (its files verified and read, its FAISS index and Lucene reader opened: about a
minute for a million chunks), then warmed on the search thread: searches of the versions already open go on
meanwhile, and the health check, which runs on the search thread, is not stuck behind the load. Opening calls
only Java methods of objects of its own (the reader, its stored fields) and constructors the search path does
not call.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from deployments.bounded import BoundedCache
from deployments.shard.features import FeatureQuery
from deployments.shard.group import ShardGroup
from deployments.shard.query import ShardAnswer, ShardQuery
from deployments.shard.service import ShardService, corpus_df_map
from deployments.threads import named_pool
from index_format.bm25_stats import read_stats
from index_format.manifest import IndexMismatch
from index_format.versions import hold_version, let_go_version, list_versions, version_dir

# A group holding at least this many chunks searches its two legs side by side (see the module).
LEGS_APART_MIN_CHUNKS = 100_000
# An evicted version is closed this long after its eviction: longer than a request pinned to it takes (a request's
# deadline, router.request_timeout_s, is 10 s by default).
CLOSE_GRACE_S = 30.0


class ShardHost:
    def __init__(self, index_root: str | None, version_dir: str | None, shards: Sequence[str] | str, expect: dict,
                 verify_checksums: bool = True, lucene_heap: str = "512m", search_device: str = "cpu",
                 warmup_searches: int = 0, version: str | None = None):
        """``version_dir``: the version to open first; None for a root in object storage, whose ``version`` this
        host fetches to its node (its shards' files only) before opening it."""
        os.environ["LUCENE_JVM_HEAP"] = lucene_heap  # read when this process starts its JVM
        self.root = index_root or None  # a folder or a URL; None: pinned to one version folder
        self.shards = [shards] if isinstance(shards, str) else list(shards)
        self.expect, self.verify_checksums = dict(expect), verify_checksums
        self.search_device, self.warmup_searches = search_device, warmup_searches
        self.worker = named_pool(1, "shard-search")
        self.dense_worker = named_pool(1, "shard-dense")
        self.loader = named_pool(1, "shard-load")
        self.opened: dict[str, ShardGroup] = {}  # every version this host has open, until it is closed
        self._loads: dict[str, asyncio.Future] = {}  # versions being loaded, or loaded and not yet taken (``load``)
        self._closing: set[asyncio.Task] = set()  # closes waiting out their grace period (kept referenced)
        self.sick: str | None = None  # why this slot should leave rotation (a JVM error), once seen
        self._holds_root: str | Path | None = None  # the root whose versions this host holds leases on
        initial = Path(version_dir) if version_dir else self._fetch(version)
        self.initial_version = initial.name
        # Opened now, so a broken index fails the deployment instead of its first request.
        self._preloaded: dict[str, ShardGroup] = {initial.name: self._open(initial)}

    async def run(self, fn: Callable, *args, worker: ThreadPoolExecutor | None = None) -> Any:
        """``fn(*args)`` on the host's index thread (or ``worker``; FAISS and Lucene release the GIL meanwhile). A
        JVM that ran out of heap marks the host sick: its health check then fails and Serve replaces it."""
        try:
            return await asyncio.get_running_loop().run_in_executor(worker or self.worker, fn, *args)
        except Exception as exc:
            if isinstance(exc, MemoryError) or "OutOfMemoryError" in f"{type(exc).__name__} {exc}":
                self.sick = f"the JVM or the process ran out of memory: {str(exc)[:200]}"
            raise

    async def search(self, group: ShardGroup, query: ShardQuery) -> ShardAnswer:
        """``group.search``, with the two legs side by side when the group is large (see the module)."""
        if not (query.dense and query.keyword) or group.chunks < LEGS_APART_MIN_CHUNKS:
            return await self.run(group.search, query)
        t0 = time.perf_counter()
        allowed = await self.run(group.allowed, query, worker=self.dense_worker) \
            if query.restricted else [None] * group.size
        if isinstance(allowed, str):
            return ShardAnswer(group.name, shards=group.size, filter_error=allowed)
        dense, keyword = await asyncio.gather(self.run(group.dense_legs, query, allowed, worker=self.dense_worker),
                                              self.run(group.keyword_legs, query, allowed))
        return await self.run(group.answer, query, dense, keyword, allowed, t0, worker=self.dense_worker)

    async def features(self, group: ShardGroup, query: FeatureQuery) -> dict[str, np.ndarray]:
        """``group.features``: on the index thread where it calls Lucene (a model that reads the postings) or reads a
        shard's chunk table (the first call); else here, where its few array reads cost less than the hop to that
        thread and back (about 0.09 ms of CPU, bench/README.md "The hop to the index thread")."""
        if group.features_in_memory(query):
            return group.features(query)
        return await self.run(group.features, query)

    async def check_health(self) -> None:
        """Raises (Serve then replaces the replica) when this slot cannot answer: a JVM out of heap seen,
        or a version it serves whose files vanished or whose Lucene reader no longer answers."""
        if self.sick:
            raise RuntimeError(self.sick)
        for version, group in list(self.opened.items()):
            try:
                await asyncio.wait_for(self.run(group.check), 10)
            except Exception as exc:
                raise RuntimeError(f"index version {version}: {exc}") from exc

    def close_version(self, version: str, group: ShardGroup) -> None:
        """Close an evicted version (blocking: run it on the index thread, after the searches queued on it)."""
        if self.opened.get(version) is group:
            del self.opened[version]
        group.close()
        if self._holds_root is not None:
            let_go_version(self._holds_root, version)

    def close_later(self, version: str, group: ShardGroup, grace_s: float = CLOSE_GRACE_S) -> asyncio.Task:
        """The one closer of an evicted version (either cache's): closed ``grace_s`` from now, once requests that were
        already pinned to it have had time to finish, on the index thread after the searches queued there."""
        async def close() -> None:
            await asyncio.sleep(grace_s)
            await self.run(self.close_version, version, group)

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return task

    def _open(self, version_dir: Path, warm: bool = True) -> ShardGroup:
        stats, terms = read_stats(version_dir / "bm25")
        df = corpus_df_map(terms)
        # A version with fewer shards than the app was deployed with is served by the first slots, each
        # with the shards of its group that the version has (activation.check_switchable).
        held = [shard for shard in self.shards if (version_dir / "shards" / shard).is_dir()]
        if not held:
            raise IndexMismatch(f"index version {version_dir.name!r} has none of {', '.join(self.shards)}")
        group = ShardGroup([ShardService(version_dir / "shards" / shard, stats, df, self.expect,
                                         self.verify_checksums, self.search_device) for shard in held])
        if warm:
            group.warm_up(self.warmup_searches)
        holds = self.root or (version_dir.parent.parent if version_dir.parent.name == "versions" else None)
        if holds is not None:  # served from this process: not removable until closed (or this process is gone)
            hold_version(holds, version_dir.name)
            self._holds_root = holds
        self.opened[version_dir.name] = group
        return group

    def open_version(self, version: str, warm: bool = True) -> ShardGroup:
        """The group of ``version`` (blocking; ``warm``: its warm-up searches too, which must run on the
        search thread)."""
        opened = self._preloaded.pop(version, None)
        if opened is not None:
            return opened
        # The name came over the wire: only a published version's folder is ever opened.
        if self.root is None or version not in list_versions(self.root):
            raise IndexMismatch(f"index version {version!r} is not published here")
        return self._open(self._fetch(version), warm)

    def _fetch(self, version: str) -> Path:
        """The version's folder on this node: in a root in object storage, its copy in the node's cache, downloaded
        (what is not there yet) for this host's shards only, before the version is opened."""
        if self.root is None or not version:
            raise IndexMismatch("a shard host needs a version folder, or an index root and a version")
        return version_dir(self.root, version, shards=self.shards)

    async def load(self, version: str) -> ShardGroup:
        """Open on the loading thread, warm up on the search thread (see the module). One load of a version at a
        time, and shielded: a caller that gives up (a deadline: a health check's, an activation's) does not cancel
        it, and the next caller gets it. Serve's multiplexing calls this again for every request until one load
        returns; when each was cancelled, each opened the version anew (and dropped it, open, once it was read):
        shard deployments of a million chunks never became healthy, the 2 s health check cancelling every load."""
        task = self._loads.get(version)
        if task is None:
            task = self._loads[version] = asyncio.ensure_future(self._load(version))
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and self._loads.get(version) is task:
                del self._loads[version]  # taken (the caller's cache holds it from now), or failed (tried again)

    async def _load(self, version: str) -> ShardGroup:
        group = await asyncio.get_running_loop().run_in_executor(self.loader, self.open_version, version, False)
        await self.run(group.warm_up, self.warmup_searches)
        return group


class VersionCache:
    """At most ``max_versions`` opened versions of one host, least recently used let go first (to the host's closer):
    the router's cache of the slots it holds (``shards.placement: router``). Loads are the host's (one per version)."""

    def __init__(self, host: ShardHost, max_versions: int = 2, close_grace_s: float = CLOSE_GRACE_S):
        self.host, self.max_versions, self.close_grace_s = host, max_versions, close_grace_s
        self._groups: BoundedCache[str, ShardGroup] = BoundedCache(max_versions, on_evict=self._let_go_of)
        self._let_go: weakref.WeakSet[ShardGroup] = weakref.WeakSet()  # evicted: closing, never kept again

    def _let_go_of(self, version: str, group: ShardGroup) -> None:
        self._let_go.add(group)
        self.host.close_later(version, group, self.close_grace_s)

    async def get(self, version: str) -> ShardGroup:
        group = self._groups.get(version)
        if group is not None:
            return group
        group = await self.host.load(version)
        # Every caller that waited on the one load gets the same group: the first one back keeps it, unless it was let
        # go meanwhile (a late caller still uses it, within the grace period; the next one loads the version again).
        if version not in self._groups and group not in self._let_go:
            self._groups.put(version, group)
        return group


class MultiplexedVersion:
    """A version as a shard deployment's Serve multiplexing keeps it (``serve.multiplexed``, its cache there): the
    group, let go to the host's closer when Serve evicts it.

    Serve evicts by awaiting the kept object's ``__del__`` (``ray.serve.multiplex``): here an attribute of the
    instance, so Python's garbage collector (which looks ``__del__`` up on the class) never calls it a second time."""

    def __init__(self, host: ShardHost, version: str, group: ShardGroup, grace_s: float = CLOSE_GRACE_S):
        self.version, self.group = version, group

        async def evicted() -> None:
            host.close_later(version, group, grace_s)

        self.__del__ = evicted

    @classmethod
    async def load(cls, host: ShardHost, version: str, grace_s: float = CLOSE_GRACE_S) -> MultiplexedVersion:
        return cls(host, version, await host.load(version), grace_s)


class SlotClient:
    """What every shard slot client is called: by its shards ("shard-000" or "shard-000,shard-001"), as
    coverage and traces report them, and pinned to one version."""

    def __init__(self, name: str, version: str, shards: Sequence[str] | None = None):
        self.name, self.version = ",".join(shards) if shards else name, version
        self.shards = list(shards) if shards else [name]
        self.size = len(self.shards)


class LocalShard(SlotClient):
    """A pipeline's shard client for a slot this process holds (``shards.placement: router``), pinned to one
    version: the same calls as a shard deployment's handle, without the hop."""

    remote = False

    def __init__(self, name: str, cache: VersionCache, version: str, shards: Sequence[str] | None = None):
        super().__init__(name, version, shards)
        self.cache = cache

    async def search(self, query: ShardQuery) -> ShardAnswer:
        return await self.cache.host.search(await self.cache.get(self.version), query)

    async def fetch(self, chunk_ids):
        return (await self.cache.get(self.version)).fetch(chunk_ids)

    async def vectors(self, chunk_ids):
        return (await self.cache.get(self.version)).vectors(chunk_ids)

    async def features(self, query):
        return await self.cache.host.features(await self.cache.get(self.version), query)

    async def vocabulary(self, acl=None):
        group = await self.cache.get(self.version)
        return await self.cache.host.run(group.vocabulary, acl)

    async def documents(self, query):
        group = await self.cache.get(self.version)
        return await self.cache.host.run(group.list_documents, query)

    async def info(self):
        return (await self.cache.get(self.version)).info(self.version)
