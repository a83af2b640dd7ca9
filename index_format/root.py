"""An index root: its versions, the one it serves, who holds which, and what may be deleted, over one ``Store``.

Two kinds lay a version's files out their own way: a folder (``folder_root.FolderRoot``: a version is a folder,
published by one rename, sharing files with other versions by hard links) and object storage
(``object_root.ObjectRoot``: a version is a file table over content-addressed blobs). Everything else is written
once, here, over the root's store, with the same guarantees on both:

- ``ACTIVE`` names the live version and moves only by a compare-and-swap (``Store.put_if``): two activations at
  once cannot both win, and a build activates only if ``ACTIVE`` still names what it named when the build began.
- An activation verifies the version first (``verify``: the kind's own check), unless told not to
  (``verify=False``: a job that has just verified it, or ``--no-verify`` on the command line).
- One activation history: an object per activation, ``activations/<time>-<ns>-<name>.json`` (objects cannot be
  appended to). A folder root written before reads its older ``activations.jsonl`` first.
- A version a process serves is held by a lease (``hold``; ``index_format.leases``): it cannot be removed while
  one is live, and a holder that dies lets go within the lease's time to live.
- Removal never deletes a file a publish in flight counts on. A job that may skip uploading what is already in the
  store holds a publish lease from before it first lists the store until its version is published
  (``publishing``); garbage collection takes a collect lease, then looks for publish leases, and deletes nothing
  while one is live (the files are collected by the next removal or ``collect_garbage``); a publish, having taken
  its lease, waits for any collection in progress to end before it lists what is there. Each writes its own lease
  before it reads the other's, so at least one of the two sees the other. An intent, not a grace period: a grace
  period on a file's age does not protect an old file that a new version starts to reference again, the very case
  of a shard a build reuses.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .leases import (
    COLLECT_TTL_S,
    PUBLISH_TTL_S,
    VERSION_TTL_S,
    Lease,
    clear_lapsed,
    live_leases,
    wait_until_none,
)
from .manifest import IndexMismatch, VersionManifest
from .store import Conflict, Store

ACTIVE = "ACTIVE"
ACTIVATIONS = "activations"
LEGACY_ACTIVATIONS = "activations.jsonl"  # a folder root's history before it was one object per activation


class VersionHeld(ValueError):
    """A version that cannot be removed: it is active, or a live process holds it."""


class IndexRoot:
    """The versions under one root (``url``) in one store. Subclasses lay out a version's files."""

    url: str
    store: Store
    shared_by_nodes: bool  # every node reaches the same root (object storage); a folder is one node's disk

    # What each kind of root does its own way

    def versions(self) -> list[str]:
        """The published versions' names, sorted."""
        raise NotImplementedError

    def manifest(self, name: str) -> VersionManifest:
        raise NotImplementedError

    def verify(self, name: str) -> VersionManifest:
        """The version's manifest, once its files are checked as far as this kind of root can without serving it."""
        raise NotImplementedError

    def version_dir(self, name: str, shards: list[str] | None = ()) -> Path:
        """A folder on this node holding the version's own files and those of ``shards`` (all: None)."""
        raise NotImplementedError

    def shard_bytes(self, name: str) -> dict[str, int]:
        """Shard -> the bytes of its files (its manifest aside), read without fetching anything."""
        raise NotImplementedError

    def locations(self, name: str, files: list[str]) -> list[str | None]:
        """Where any node that reaches the root reads each of a version's ``files`` (relative paths) without a fetch:
        a path in a folder, a blob's URL in object storage; None for a file the version does not have."""
        raise NotImplementedError

    def publish(self, staging: Path, name: str, uploaded: dict[str, dict] | None = None) -> tuple[Path, dict]:
        """A finished staging folder published as ``name``; returns the version's folder on this node and what
        moved."""
        raise NotImplementedError

    def _unpublish(self, name: str) -> None:
        """The version gone from ``versions()``; its files left to ``_collect``."""
        raise NotImplementedError

    def _collect(self) -> dict:
        """Delete the files no published version references (a publish lease is known not to be live)."""
        raise NotImplementedError

    # The same on both

    def active_tagged(self) -> tuple[str | None, str | None]:
        """The active version's name and the tag a compare-and-swap of ``ACTIVE`` must name."""
        data, tag = self.store.get_tagged(ACTIVE)
        name = data.decode().strip() if data is not None else ""
        return (name or None), tag

    def active(self) -> str | None:
        return self.active_tagged()[0]

    def chosen(self, version: str | None = None) -> str:
        """``version``, else the active one, checked to be published; IndexMismatch naming the versions there."""
        name = version or self.active()
        known = self.versions()
        if name is None:
            hint = f"; versions there: {', '.join(known)} (activate one)" if known else ""
            raise IndexMismatch(f"{self.url} has no active index version{hint}")
        if name not in known:
            raise IndexMismatch(f"index version {name!r} not found under {self.url}/versions")
        return name

    def activate(self, name: str, by: str = "cli", verify: bool = True,
                 expect: tuple[str | None, str | None] | None = None) -> str | None:
        """Point ``ACTIVE`` at ``name`` with a compare-and-swap, on the tag read here or on ``expect`` (the name and
        tag read earlier: a build's, when it started). The version is verified first unless ``verify`` is False.
        Returns the version it replaced. ``name`` may come from an HTTP request: it is looked up among the published
        versions, never joined into a path unchecked."""
        if name not in self.versions():
            raise IndexMismatch(f"cannot activate {name!r}: no such version under {self.url}/versions")
        previous, tag = expect if expect is not None else self.active_tagged()
        if previous == name:
            return previous  # already live: nothing to write or log
        if verify:
            try:
                self.verify(name)
            except IndexMismatch as e:
                raise IndexMismatch(f"not activating {name!r}: {e}") from None
        try:
            self.store.put_if(ACTIVE, (name + "\n").encode(), tag)
        except Conflict:
            now = self.active()
            raise Conflict(f"not activating {name!r}: {self.url}/ACTIVE moved from {previous or 'none'} to "
                           f"{now or 'none'} since it was read; activate again if {name!r} should still win") from None
        self._record(name, previous, by)
        return previous

    def _record(self, name: str, previous: str | None, by: str) -> None:
        now = time.time_ns()  # one reading for the second and its fraction: two readings can straddle a second
        seconds = time.gmtime(now // 10**9)
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", seconds), "version": name, "previous": previous,
                 "by": by}
        key = f"{ACTIVATIONS}/{time.strftime('%Y%m%dT%H%M%SZ', seconds)}-{now % 10**9:09d}-{name}.json"
        self.store.put(key, json.dumps(entry).encode())

    def history(self) -> list[dict]:
        """Every activation, oldest first."""
        legacy = self.store.text(LEGACY_ACTIVATIONS) or ""
        entries = [json.loads(line) for line in legacy.splitlines() if line.strip()]
        with ThreadPoolExecutor(8) as pool:  # one request each, in object storage: several in flight
            return entries + [json.loads(b) for b in pool.map(self.store.get, sorted(self.store.list(f"{ACTIVATIONS}/")))]

    def previous(self) -> str | None:
        """The version that was active before the current one (what a rollback returns to)."""
        live = self.active()
        for entry in reversed(self.history()):
            if entry.get("version") == live:
                return entry.get("previous")
        return None

    def rollback(self, by: str = "cli") -> tuple[str | None, str]:
        """Activate the version that was active before this one; returns (from, to)."""
        target = self.previous()
        if target is None:
            raise IndexMismatch(f"{self.url}: no earlier activation to roll back to")
        if target not in self.versions():
            raise IndexMismatch(f"cannot roll back to {target!r}: it was removed from {self.url}")
        return self.activate(target, by=by), target

    # Holding, removing, collecting

    def hold(self, name: str, ttl_s: float = VERSION_TTL_S) -> Lease:
        """A lease on version ``name`` for a process that serves it (``release`` it when the version is closed)."""
        return Lease(self.store, "version", name, ttl_s).take()

    def remove(self, name: str) -> dict:
        """Delete a version: never the active one, nor one a live process holds. Its files that no other version
        references are collected unless a publish is in flight (then by the next removal or ``collect_garbage``)."""
        if self.active() == name:
            raise VersionHeld(f"{name!r} is the active version; activate another one before removing it")
        if name not in self.versions():
            raise IndexMismatch(f"no version {name!r} under {self.url}/versions")
        holders = live_leases(self.store, "version", name)
        if holders:
            who = ", ".join(f"{h.host} pid {h.pid}" for h in holders[:3])
            raise VersionHeld(f"{name!r} is served by {len(holders)} running process(es) ({who}); stop or redeploy "
                              f"them, or wait: a holder that is gone lets go within "
                              f"{max(h.seconds_left for h in holders):.0f} s")
        self._unpublish(name)
        return self.collect_garbage()

    def collect_garbage(self) -> dict:
        """Delete the files no published version references, unless a publish is in flight; clear lapsed leases."""
        with Lease(self.store, "collect", ttl_s=COLLECT_TTL_S) as mine:
            publishing = live_leases(self.store, "publish")
            if publishing:
                return {"collected": False, "files_deleted": 0,
                        "why": f"{len(publishing)} publish(es) in flight ({publishing[0].host} pid "
                               f"{publishing[0].pid}); their files are collected by a later removal"}
            done = self._collect()
            for kind in ("version", "publish", "collect"):
                clear_lapsed(self.store, kind, keep=mine.key)
        return {"collected": True} | done

    @contextlib.contextmanager
    def publishing(self) -> Iterator[Lease]:
        """Held by a job from before it first lists the store until its version is published: no collection deletes
        a file it found there and did not upload again."""
        with Lease(self.store, "publish", ttl_s=PUBLISH_TTL_S) as lease:
            wait_until_none(self.store, "collect")
            yield lease
