"""An index root in object storage, and its copy on a node's local disk.

Layout under ``s3://bucket/prefix`` (any store ``index_format.store`` opens)::

    ACTIVE, activations/, leases/   as every root has them (``index_format.root``)
    blobs/<sha256>                  every file of every version, stored once under its checksum
    versions/<name>/files.json      the version's files: relative path -> sha256 and size
    versions/<name>/manifest.json   the version manifest, written last: its presence publishes the version

A file's key is its checksum, so a shard a new version reuses or a fold leaves untouched is a reference to
blobs already there, never a second upload (what hard links are to a local root), and a download is verified
by the name it is stored under. Versions are immutable; removing one deletes its file table, and the collection that
follows deletes the blobs no version references (``index_format.root``: never while a publish is in flight).

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
from .process import cache_root
from .root import IndexRoot
from .store import Conflict, ObjectStore

FILES = "files.json"
BLOBS = "blobs"
CACHE_DIR_ENV = "RAYSEARCH_INDEX_CACHE"  # shards.cache_dir, as the app tells its replicas
STATE_ENV = "RAYSEARCH_STATE"
TRANSFERS = 8  # files moved at once: object storage is fast per connection only with several in flight


def default_cache_dir() -> Path:
    """``$RAYSEARCH_INDEX_CACHE`` (the app's ``shards.cache_dir``), else ``$RAYSEARCH_CACHE/index`` (default
    ``~/.cache/raysearch/index``): a node-local disk."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    return cache_root() / "index"


def default_state_dir() -> Path:
    """``$RAYSEARCH_STATE`` (default ``~/.local/state/raysearch``): a durable node-local volume."""
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".local" / "state" / "raysearch")


def root_slug(url: str) -> str:
    """A folder name for a root's URL: readable, and unique by a digest of the whole URL."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", url.rstrip("/").split("://", 1)[1])[:80]
    return f"{slug}-{hashlib.sha256(url.rstrip('/').encode()).hexdigest()[:8]}"


class ObjectRoot(IndexRoot):
    """Versions under a root in object storage: the file tables over blobs, and a node's copy of a version."""

    shared_by_nodes = True

    def __init__(self, url: str, cache_dir: Path | None = None):
        self.url = url.rstrip("/")
        self.store = ObjectStore(self.url)
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()

    # Reading the root

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

    def version_dir(self, name: str, shards: list[str] | None = ()) -> Path:
        return self.fetch(name, shards)[0]

    def shard_bytes(self, name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for rel, f in self.files(name).items():
            if rel.startswith("shards/"):
                shard, *rest = rel.split("/")[1:]
                out[shard] = out.get(shard, 0) + (f["size"] if rest != [MANIFEST] else 0)
        return out

    def locations(self, name: str, files: list[str]) -> list[str | None]:
        table = self.files(name)
        return [f"{self.url}/{BLOBS}/{table[rel]['sha256']}" if rel in table else None for rel in files]

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

    def publish(self, staging: Path, name: str, uploaded: dict[str, dict] | None = None) -> tuple[Path, dict]:
        """A finished staging folder on this node's cache disk published as ``name`` (``upload_version``) and kept as
        the cache's copy of it (``keep``)."""
        sent = self.upload_version(staging, name, uploaded)
        return self.keep(staging, name), sent

    def upload_version(self, version_dir: Path, name: str, uploaded: dict[str, dict] | None = None) -> dict:
        """Upload a finished local version folder as ``name`` (the folder stays): its blobs, its file table, its
        manifest last.
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

    def _unpublish(self, name: str) -> None:
        self.store.delete([f"versions/{_checked(name)}/{MANIFEST}"])  # first: no reader opens it half-deleted
        self.store.delete([f"versions/{name}/{FILES}"])

    def _collect(self) -> dict:
        referenced = set()
        for name in self.versions():
            referenced |= {f["sha256"] for f in self.files(name).values()}
        doomed = sorted(k for k in self.store.list(BLOBS + "/") if k.split("/", 1)[1] not in referenced)
        self.store.delete(doomed)
        return {"files_deleted": len(doomed)}

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
