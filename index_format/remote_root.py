"""An index root in object storage, and its copy on a node's local disk.

Layout under ``s3://bucket/prefix`` (any store ``index_format.store`` opens)::

    ACTIVE                          name of the live version; replaced only by a compare-and-swap on its tag
    activations/<time>-<name>.json  one object per activation (objects cannot be appended to)
    blobs/<sha256>                  every file of every version, stored once under its checksum
    versions/<name>/files.json      the version's files: relative path -> sha256 and size
    versions/<name>/manifest.json   the version manifest, written last: its presence publishes the version

A file's key is its checksum, so a shard a new version reuses or a fold leaves untouched is a reference to
blobs already there, never a second upload (what hard links are to a local root), and a download is verified
by the name it is stored under. Versions are immutable; ``remove`` deletes a version and the blobs no other
version references.

A node serves from its cache (``cache_dir``): ``blobs/<sha256>``, shared by every root and replica on the node,
and ``roots/<slug>/versions/<name>/`` built from them with hard links, a folder laid out as a local root's, so
everything that opens a local version opens it. A second start, or a second replica on the node, downloads
nothing; a new version downloads only the blobs it does not share with the old.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .manifest import MANIFEST, IndexMismatch, VersionManifest, sha256_file
from .store import Conflict, ObjectStore, open_store

ACTIVE = "ACTIVE"
FILES = "files.json"
BLOBS = "blobs"
CACHE_ENV = "RAYSEARCH_CACHE"
CACHE_DIR_ENV = "RAYSEARCH_INDEX_CACHE"  # shards.cache_dir, as the app tells its replicas
STATE_ENV = "RAYSEARCH_STATE"
TRANSFERS = 8  # files moved at once: object storage is fast per connection only with several in flight


def default_cache_dir() -> Path:
    """``$RAYSEARCH_INDEX_CACHE`` (the app's ``shards.cache_dir``), else ``$RAYSEARCH_CACHE/index`` (default
    ``~/.cache/raysearch/index``): a node-local disk."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "raysearch") / "index"


def default_state_dir() -> Path:
    """``$RAYSEARCH_STATE`` (default ``~/.local/state/raysearch``): a durable node-local volume."""
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".local" / "state" / "raysearch")


def root_slug(url: str) -> str:
    """A folder name for a root's URL: readable, and unique by a digest of the whole URL."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", url.rstrip("/").split("://", 1)[1])[:80]
    return f"{slug}-{hashlib.sha256(url.rstrip('/').encode()).hexdigest()[:8]}"


class RemoteRoot:
    """Versions under a root in object storage: list, publish, activate, fetch to a node, remove."""

    def __init__(self, url: str, cache_dir: Path | None = None):
        self.url = url.rstrip("/")
        self.store = open_store(self.url)
        assert isinstance(self.store, ObjectStore), f"{url} is not an object-storage URL"
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()

    # Reading the root

    def active(self) -> str | None:
        return self.active_tagged()[0]

    def active_tagged(self) -> tuple[str | None, str | None]:
        """The active version's name and the tag a compare-and-swap of ``ACTIVE`` must name."""
        data, tag = self.store.get_tagged(ACTIVE)
        name = data.decode().strip() if data is not None else ""
        return (name or None), tag

    def versions(self) -> list[str]:
        keys = self.store.list("versions/")
        return sorted(k.split("/")[1] for k in keys if k.count("/") == 2 and k.endswith("/" + MANIFEST))

    def manifest(self, name: str) -> VersionManifest:
        text = self.store.text(f"versions/{_checked(name)}/{MANIFEST}")
        if text is None:
            raise IndexMismatch(f"index version {name!r} not found under {self.url}/versions")
        try:
            return VersionManifest.model_validate_json(text)
        except ValueError as e:
            raise IndexMismatch(f"{self.url}/versions/{name}/{MANIFEST}: not a valid version manifest: {e}") from None

    def files(self, name: str) -> dict[str, dict]:
        text = self.store.text(f"versions/{_checked(name)}/{FILES}")
        if text is None:
            raise IndexMismatch(f"index version {name!r} not found under {self.url}/versions")
        return json.loads(text)

    def verify(self, name: str) -> VersionManifest:
        """The version's manifest, once its file table holds every file its shard manifests list, under the same
        checksums, and the shards' counts add up (the bytes are checked as they are downloaded)."""
        from .manifest import ShardManifest, counts_agree

        manifest, files = self.manifest(name), self.files(name)
        chunks = 0
        for shard in manifest.shards:
            entry = files.get(f"shards/{shard}/{MANIFEST}")
            if entry is None:
                raise IndexMismatch(f"{self.url}/versions/{name}: shard {shard} has no manifest")
            m = ShardManifest.model_validate_json(self.store.get(f"{BLOBS}/{entry['sha256']}"))
            wrong = sorted(rel for rel, sha in m.checksums.items()
                           if files.get(f"shards/{shard}/{rel}", {}).get("sha256") != sha)
            if wrong:
                raise IndexMismatch(f"{self.url}/versions/{name}/{shard}: files missing or not as built: {wrong[:5]}")
            if any(getattr(m, k) != v for k, v in manifest.shard_expect().items()) or not counts_agree(m.counts):
                raise IndexMismatch(f"{self.url}/versions/{name}/{shard}: its manifest disagrees with the version's")
            chunks += m.counts["chunks"]
        if chunks != manifest.counts["chunks"]:
            raise IndexMismatch(f"{name}: its shards hold {chunks} chunks, its manifest says {manifest.counts['chunks']}")
        return manifest

    def history(self) -> list[dict]:
        keys = sorted(self.store.list("activations/"))
        with ThreadPoolExecutor(TRANSFERS) as pool:
            return [json.loads(b) for b in pool.map(self.store.get, keys)]

    # Writing the root

    def upload_files(self, folder: Path, skip: Iterable[str] = ()) -> tuple[dict[str, dict], int]:
        """Every file under ``folder`` into ``blobs/`` (those not there yet); returns the file table and the
        bytes uploaded."""
        folder = Path(folder)
        skipped = set(skip)
        paths = sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() not in skipped)
        there = {k.split("/", 1)[1] for k in self.store.list(BLOBS + "/")}

        def one(path: Path) -> tuple[str, dict, int]:
            sha = sha256_file(path)
            size = path.stat().st_size
            sent = 0
            if sha not in there:
                self.store.upload(path, f"{BLOBS}/{sha}")
                sent = size
            return path.relative_to(folder).as_posix(), {"sha256": sha, "size": size}, sent

        with ThreadPoolExecutor(TRANSFERS) as pool:
            done = list(pool.map(one, paths))
        return {rel: entry for rel, entry, _ in done}, sum(sent for *_, sent in done)

    def publish(self, version_dir: Path, name: str, uploaded: dict[str, dict] | None = None) -> dict:
        """Upload a finished local version folder as ``name``: its blobs, its file table, its manifest last.
        ``uploaded``: files already in ``blobs/`` (relative path -> sha256 and size, as ``upload_files`` gives them:
        a build's shard tasks upload their shards), neither read nor sent again. Refuses a name already published.
        Returns what this call sent (files, bytes, bytes uploaded, seconds)."""
        _checked(name)
        started = time.perf_counter()
        if self.store.exists(f"versions/{name}/{MANIFEST}"):
            raise FileExistsError(f"index version {name!r} already exists under {self.url}/versions; pick another "
                                  "--version")
        files, sent = self.upload_files(version_dir, skip=uploaded or {})
        files.update(uploaded or {})
        self.store.put(f"versions/{name}/{FILES}", json.dumps(files, indent=1, sort_keys=True).encode())
        try:
            self.store.put_if(f"versions/{name}/{MANIFEST}", (Path(version_dir) / MANIFEST).read_bytes(), None)
        except Conflict:
            raise FileExistsError(f"index version {name!r} was published under {self.url} meanwhile") from None
        return {"files": len(files), "bytes": sum(f["size"] for f in files.values()), "bytes_uploaded": sent,
                "seconds": time.perf_counter() - started}

    def activate(self, name: str, by: str = "cli", expect: tuple[str | None, str | None] | None = None) -> str | None:
        """Point ``ACTIVE`` at ``name`` with a compare-and-swap: on the tag read here, or on ``expect`` (the name
        and tag read earlier, by a build when it started). Returns the version it replaced."""
        if name not in self.versions():
            raise IndexMismatch(f"cannot activate {name!r}: no such version under {self.url}/versions")
        previous, tag = expect if expect is not None else self.active_tagged()
        if previous == name:
            return previous
        try:
            self.store.put_if(ACTIVE, (name + "\n").encode(), tag)
        except Conflict:
            now = self.active()
            raise Conflict(f"not activating {name!r}: {self.url}/ACTIVE moved from {previous or 'none'} to "
                           f"{now or 'none'} since it was read; activate again if {name!r} should still win") from None
        now = time.time_ns()  # one reading for the second and its fraction: two readings can straddle a second
        seconds = time.gmtime(now // 10**9)
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", seconds), "version": name, "previous": previous,
                 "by": by}
        key = f"activations/{time.strftime('%Y%m%dT%H%M%SZ', seconds)}-{now % 10**9:09d}-{name}.json"
        self.store.put(key, json.dumps(entry).encode())
        return previous

    def remove(self, name: str) -> dict:
        """Delete a version (never the active one) and the blobs no other version references."""
        if self.active() == name:
            raise ValueError(f"{name!r} is the active version; activate another one before removing it")
        if name not in self.versions():
            raise IndexMismatch(f"no version {name!r} under {self.url}/versions")
        mine = {f["sha256"] for f in self.files(name).values()}
        self.store.delete([f"versions/{name}/{MANIFEST}"])  # unpublished first: no reader opens it half-deleted
        kept = set()
        for other in self.versions():
            kept |= {f["sha256"] for f in self.files(other).values()}
        doomed = sorted(mine - kept)
        self.store.delete([f"{BLOBS}/{sha}" for sha in doomed] + [f"versions/{name}/{FILES}"])
        return {"blobs_deleted": len(doomed)}

    # A node's copy

    def local_root(self) -> Path:
        """This root's folder in the node's cache: laid out as a local root (``versions/<name>/...``)."""
        return self.cache_dir / "roots" / root_slug(self.url)

    def fetch(self, name: str, shards: Iterable[str] | None = None) -> tuple[Path, dict]:
        """The version's folder in the node's cache, with its top-level files and the files of ``shards`` (all
        when None), each downloaded once per node and checked against its checksum. Returns the folder and
        what moved (files, bytes downloaded, seconds)."""
        started = time.perf_counter()
        files = self.files(name)
        wanted = None if shards is None else tuple(f"shards/{s}/" for s in shards)
        chosen = {rel: f for rel, f in files.items()
                  if wanted is None or not rel.startswith("shards/") or rel.startswith(wanted)}
        blobs = self.cache_dir / BLOBS
        blobs.mkdir(parents=True, exist_ok=True)
        target = self.local_root() / "versions" / name

        def one(item: tuple[str, dict]) -> int:
            rel, f = item
            blob = blobs / f["sha256"]
            got = 0
            if not blob.is_file():
                got = self._download_blob(f["sha256"], blob)
            path = target / rel
            if rel != MANIFEST and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileExistsError):  # another replica of this node linked it first
                    os.link(blob, path)
            return got

        with ThreadPoolExecutor(TRANSFERS) as pool:
            got = sum(pool.map(one, chosen.items()))
        manifest = target / MANIFEST  # linked last: a version folder with its manifest has its files
        if not manifest.exists():
            with contextlib.suppress(FileExistsError):
                os.link(blobs / files[MANIFEST]["sha256"], manifest)
        return target, {"files": len(chosen), "bytes": sum(f["size"] for f in chosen.values()),
                        "bytes_downloaded": got, "seconds": time.perf_counter() - started}

    def keep(self, version_dir: Path, name: str) -> Path:
        """A version this node has just published from ``version_dir`` (a folder on the cache's disk: a build's
        staging folder in ``local_root()``): the folder becomes the cache's copy of it (moved to
        ``local_root()/versions/<name>``, its files linked into the cache's blobs), so that fetching it on this node,
        to serve it or to reuse it in the next build, downloads nothing (but the shards other nodes built)."""
        files = self.files(name)
        blobs = self.cache_dir / BLOBS
        blobs.mkdir(parents=True, exist_ok=True)
        for rel, f in files.items():
            blob = blobs / f["sha256"]
            # A shard built on another node is not in this folder: fetching the version downloads it when needed.
            if not blob.exists() and (Path(version_dir) / rel).is_file():
                with contextlib.suppress(FileExistsError):
                    os.link(Path(version_dir) / rel, blob)
        target = self.local_root() / "versions" / name
        if target.exists():  # a copy of an earlier version of that name, removed since: it is stale
            stale = target.with_name(f".removing-{name}-{time.monotonic_ns()}")
            os.replace(target, stale)
            shutil.rmtree(stale, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(version_dir, target)
        return target

    def _download_blob(self, sha: str, blob: Path) -> int:
        tmp = blob.with_name(f".{sha}.{os.getpid()}.{time.monotonic_ns()}.part")
        try:
            self.store.download(f"{BLOBS}/{sha}", tmp)
            if sha256_file(tmp) != sha:
                raise IndexMismatch(f"{self.url}/{BLOBS}/{sha}: its bytes do not match its checksum (a corrupt "
                                    "upload); rebuild or re-publish the version")
            os.chmod(tmp, 0o444)  # shared by hard links between versions and replicas: never written in place
            os.replace(tmp, blob)
            return blob.stat().st_size
        finally:
            tmp.unlink(missing_ok=True)


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _checked(name: str) -> str:
    """A version name, never a path: it may come from an HTTP request."""
    if not _NAME.match(name or ""):
        raise IndexMismatch(f"{name!r} is not a version name (letters, digits, '.', '_', '-')")
    return name
