"""Switching a running router to another index version: warm first, then one swap, never a mix.

The index root's ``ACTIVE`` pointer is the one source of truth, written by ``index_build`` when a build
finishes, by ``python -m index_build.versions activate|rollback``, or by the admin API. Every router
replica watches it. To switch a collection, a replica first asks each shard slot for the new version
(each slot's replicas load it beside the old one), and only when every shard has answered does it
replace the collection with one object pinned to the new version. A request takes its collection
once, at its start, and passes that version with every shard call, so a request that began on the old
version finishes on it and none sees both.

What a running app cannot switch to without a redeploy is refused with the reason: a version built
with another encoder (the query encoder is deployed per model), or with more shards than the app has
shard slots.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployments.edge.schemas import AnnParams
from deployments.errors import ActivationError, NotFound, Unavailable
from deployments.search.clients import Collection, EncoderClient, ShardClient, collection, fields_of
from deployments.search.stages import failure
from index_format.manifest import IndexMismatch, VersionManifest
from index_format.prompts import EncoderSpec
from index_format.versions import (
    activate,
    active_version,
    list_versions,
    previous_version,
    read_version_manifest,
    verify_published,
    version_dir,
)

logger = logging.getLogger("ray.serve")


@dataclass
class DeployedCollection:
    """What a collection was deployed with; fixed until the next deploy."""

    name: str
    root: str | None  # a folder or a URL; None: the config named a version folder or pinned a version: it never moves
    encoder_spec: EncoderSpec  # the model and prompts its queries (and written documents) are embedded with
    dimension: int
    slots: list[tuple[str, Any, list[str]]]  # (slot name, handle of its deployment, the shards it serves)
    encoder: EncoderClient
    rerank: bool = True
    ann: AnnParams | None = None  # the collection's approximate search options
    field_weights: dict[str, float] | None = None  # the collection's BM25 field weights, as configured
    # The named encoders it was deployed with: name -> (spec, query encoder). A version may hold fewer, not others.
    named: dict[str, tuple[EncoderSpec, EncoderClient]] = field(default_factory=dict)

    def encoders_of(self, manifest: VersionManifest) -> dict[str, EncoderClient]:
        """The query encoders of ``manifest``'s named encoders (``check_switchable`` has checked they are deployed)."""
        return {n: self.named[n][1] for n in manifest.encoders}

    @property
    def follows_active(self) -> bool:
        return self.root is not None


def check_switchable(deployed: DeployedCollection, manifest: VersionManifest) -> list[tuple[str, Any, list[str]]]:
    """(slot, handle, the shards it serves of this version) for the slots that serve ``manifest``'s version,
    or why this running app cannot serve it without a redeploy. A version may have fewer shards than the
    app was deployed with, as long as they are the first ones (a slot then serves those it has)."""
    built = EncoderSpec.of(manifest)
    if built != deployed.encoder_spec or manifest.dimension != deployed.dimension:
        raise ActivationError(
            f"version {manifest.version!r} was embedded with {built} ({manifest.dimension} dims); this app "
            f"encodes queries with {deployed.encoder_spec} ({deployed.dimension} dims): redeploy to serve it")
    for n, e in manifest.encoders.items():
        if n not in deployed.named or deployed.named[n][0] != e.spec:
            have = ", ".join(f"{k}: {v[0]}" for k, v in deployed.named.items()) or "none"
            raise ActivationError(f"version {manifest.version!r} holds the encoder {n!r} ({e.spec}); this app was "
                                  f"deployed with the named encoders {have}: redeploy to serve it")
    wanted = list(manifest.shards)
    deployed_shards = [shard for _, _, shards in deployed.slots for shard in shards]
    if deployed_shards[: len(wanted)] != wanted:
        layout = "; ".join(f"{name} serves {', '.join(shards)}" for name, _, shards in deployed.slots)
        raise ActivationError(
            f"version {manifest.version!r} has {len(wanted)} shards; this app was deployed with "
            f"{len(deployed_shards)} shards in {len(deployed.slots)} shard slots ({layout}): redeploy with that "
            "version to serve it")
    used = []
    for name, handle, shards in deployed.slots:
        held = [s for s in shards if s in wanted]
        if held:
            used.append((name, handle, held))
    return used


@dataclass
class SwitchState:
    attempted: dict[str, tuple[str, float]] = field(default_factory=dict)  # collection -> (version, when tried)
    errors: dict[str, str] = field(default_factory=dict)  # collection -> why that version is not served


class VersionSwitch:
    """Moves one router replica's collections to the active index version, warming shards first."""

    def __init__(self, collections: dict[str, Collection], deployed: dict[str, DeployedCollection],
                 make_shard: Callable[[str, Any, str, list[str]], ShardClient], warm_timeout_s: float = 120.0,
                 retry_s: float = 30.0, fresh_for: Callable[[str, Path], Awaitable[Any]] | None = None):
        self.collections = collections  # the pipeline's own dict: a switch replaces one entry
        self.deployed = deployed
        self.make_shard = make_shard
        # The fresh segment to search beside a version (the writes it does not hold), made when switching to it;
        # None: the collection's segment stays as it is.
        self.fresh_for = fresh_for
        self.warm_timeout_s = warm_timeout_s
        self.retry_s = retry_s  # a version that failed to switch is tried again after this long
        self.state = SwitchState()
        self._locks = {name: asyncio.Lock() for name in deployed}

    def add(self, deployed: DeployedCollection) -> None:
        """Follow one more collection's root (one created through the API, opened after the replica started)."""
        self.deployed[deployed.name] = deployed
        self._locks[deployed.name] = asyncio.Lock()

    def _deployed(self, name: str) -> DeployedCollection:
        deployed = collection(self.deployed, name)
        if not deployed.follows_active:
            raise ActivationError(f"collection {name!r} is pinned to version {self.collections[name].version!r} in "
                                  "the configuration (a version folder, or 'version' set): edit it and redeploy")
        return deployed

    def _manifest(self, deployed: DeployedCollection, version: str) -> tuple[VersionManifest, list]:
        # The name may come from an HTTP request: it is matched against the published versions first.
        if version not in list_versions(deployed.root):
            raise NotFound(f"no index version {version!r} under {deployed.name!r}; published: "
                                  f"{', '.join(list_versions(deployed.root)) or 'none'}")
        try:
            manifest = read_version_manifest(version_dir(deployed.root, version))
        except IndexMismatch as e:
            raise ActivationError(str(e)) from None
        return manifest, check_switchable(deployed, manifest)

    async def switch(self, name: str, version: str) -> dict:
        """Serve ``version`` of collection ``name`` from this replica, once all its shards hold it."""
        deployed = self._deployed(name)
        async with self._locks[name]:
            current = self.collections[name]
            if current.version == version:
                return {"collection": name, "version": version, "previous": version, "warm_ms": 0.0}
            self.state.attempted[name] = (version, time.monotonic())
            manifest, slots = self._manifest(deployed, version)
            shards = [self.make_shard(slot, handle, version, names) for slot, handle, names in slots]
            t0 = time.perf_counter()
            try:
                fields = await asyncio.wait_for(fields_of(shards), self.warm_timeout_s)
            except Exception as exc:
                reason = f"loading {version!r} on the shards {failure(exc)}: {exc}"[:500]
                self.state.errors[name] = reason
                raise Unavailable(reason) from exc
            fresh = current.fresh
            if fresh is not None and self.fresh_for is not None:
                fresh = await self.fresh_for(name, await asyncio.to_thread(version_dir, deployed.root, version))
            # No await from here: the version and its segment are swapped in one step, so a request sees both
            # old or both new (a folded write is in the new version or in the old segment, never in neither).
            self.collections[name] = Collection.at_version(name, version, shards, deployed.encoder, fields=fields,
                                                           counts=manifest.counts, rerank=deployed.rerank,
                                                           ann=deployed.ann, fresh=fresh, bm25=manifest.bm25,
                                                           field_weights=deployed.field_weights,
                                                           encoders=deployed.encoders_of(manifest))
            self.state.errors.pop(name, None)
            warm_ms = round((time.perf_counter() - t0) * 1000, 1)
            logger.info(f"collection {name!r}: now serving index version {version!r} (was {current.version!r}; "
                        f"shards warmed in {warm_ms} ms)")
            return {"collection": name, "version": version, "previous": current.version, "warm_ms": warm_ms}

    async def activate(self, name: str, version: str, by: str = "api") -> dict:
        """Verify, warm, switch this replica, then move ACTIVE so the other replicas follow."""
        deployed = self._deployed(name)
        self._manifest(deployed, version)
        try:  # every file against its checksum, off the event loop: a corrupted version is never switched to
            await asyncio.to_thread(verify_published, deployed.root, version)
        except IndexMismatch as e:
            raise ActivationError(f"not activating {version!r}: {e}") from None
        result = await self.switch(name, version)
        if active_version(deployed.root) != version:
            activate(deployed.root, version, by=by, verify=False)  # verified above
        return result

    async def rollback(self, name: str, by: str = "api") -> dict:
        deployed = self._deployed(name)
        target = previous_version(deployed.root)
        if target is None:
            raise ActivationError(f"collection {name!r}: no earlier activation to roll back to")
        return await self.activate(name, target, by=by)

    async def follow(self) -> None:
        """One look at every ACTIVE pointer; switch where it moved (a version that failed waits ``retry_s``)."""
        for name, deployed in self.deployed.items():
            if not deployed.follows_active:
                continue
            wanted = active_version(deployed.root)
            if wanted is None or wanted == self.collections[name].version:
                continue
            tried, when = self.state.attempted.get(name, (None, 0.0))
            if tried == wanted and time.monotonic() - when < self.retry_s:
                continue
            try:
                await self.switch(name, wanted)
            except ActivationError as e:
                self.state.errors[name] = str(e)
                logger.error(f"collection {name!r}: not switching to index version {wanted!r}: {e}")

    def describe(self, names: Sequence[str] | None = None) -> dict[str, dict]:
        out = {}
        for name in names or sorted(self.deployed):
            deployed = self.deployed[name]
            entry: dict[str, Any] = {"serving": self.collections[name].version, "follows_active": deployed.follows_active}
            if deployed.follows_active:
                entry.update(active=active_version(deployed.root), previous=previous_version(deployed.root),
                             published=list_versions(deployed.root))
            if name in self.state.errors:
                entry["error"] = self.state.errors[name]
            out[name] = entry
        return out
