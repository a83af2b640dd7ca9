"""Index versions under a root, a folder or object storage: the functions the rest of the project calls.

Each opens the root (``open_root``: a ``FolderRoot`` for a path, an ``ObjectRoot`` for a URL) and asks it; the rules
(``ACTIVE`` by compare-and-swap, verified activations, one history, leases on served versions, removal and garbage
collection) are written once, in ``index_format.root``, and each kind of root lays out its files in its own module.
A version to read from object storage is first fetched into the node's cache.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from .folder_root import FolderRoot, read_version_manifest, verify_version
from .leases import Lease
from .manifest import MANIFEST, IndexMismatch, VersionManifest
from .object_root import ObjectRoot, default_state_dir, root_slug
from .root import ACTIVE, IndexRoot
from .store import is_remote

__all__ = ["ACTIVE", "read_version_manifest", "verify_version"]


def open_root(root: str | Path, cache_dir: Path | None = None) -> IndexRoot:
    """The root named by a path (a folder) or a URL (object storage; ``cache_dir``: this node's copy of it)."""
    if isinstance(root, IndexRoot):
        return root
    return ObjectRoot(str(root), cache_dir) if is_remote(root) else FolderRoot(root)


def _is_version_folder(root: IndexRoot) -> bool:
    """A "root" that is a version's own folder (``ROOT/versions/<name>``), as a command may be given one."""
    return isinstance(root, FolderRoot) and (root.folder / MANIFEST).is_file() and (root.folder / "shards").is_dir()


def versions_dir(root: Path) -> Path:
    return Path(root) / "versions"


def staging_dir(root: Path, build_key: str) -> Path:
    return Path(root) / "staging" / build_key


def state_dir(root: str | Path) -> Path:
    """Where the node keeps a root's mutable state (the API's change log, judgments, build records, the build lock):
    the root itself when it is a folder. For a root in object storage, ``$RAYSEARCH_STATE/roots/<slug>`` (default
    ``~/.local/state/raysearch``), which must be a durable volume: the change log is acknowledged there."""
    if isinstance(open_root(root), ObjectRoot):
        return default_state_dir() / "roots" / root_slug(str(root))
    return Path(root)


def absolute_root(root: str | Path) -> str:
    """A root as other processes must be told it: a URL as it is, a path made absolute."""
    r = open_root(root)
    return r.url if isinstance(r, ObjectRoot) else str(Path(root).resolve())


def list_versions(root: str | Path) -> list[str]:
    return open_root(root).versions()


def active_version(root: str | Path) -> str | None:
    return open_root(root).active()


def chosen_version(root: str | Path, version: str | None = None) -> str:
    """``version``, else the root's active one, checked to be published there (one listing); IndexMismatch naming
    the versions there when there is none to serve."""
    return open_root(root).chosen(version)


def resolve_version_dir(path: str | Path, version: str | None = None, shards: list[str] | None = None,
                        cache_dir: Path | None = None) -> Path:
    """A version folder from an index root (its ACTIVE one, or ``version``) or a version folder itself. For a root
    in object storage, the version's folder in the node's cache (``cache_dir``), fetched first with the files of
    ``shards`` (all when None)."""
    root = open_root(path, cache_dir)
    if _is_version_folder(root):
        return root.folder
    return root.version_dir(root.chosen(version), shards)


def version_dir(root: str | Path, name: str, shards: list[str] | None = (), cache_dir: Path | None = None) -> Path:
    """The folder of published version ``name`` of ``root``. In object storage: its copy in the node's cache, with
    the version's own files (manifest, BM25 statistics) and those of ``shards`` (none by default; all: None)."""
    return open_root(root, cache_dir).version_dir(name, shards)


def shard_bytes(root: str | Path, version: str | None = None) -> dict[str, int]:
    """Shard folder name -> the bytes of its files (its manifest aside) in a version of ``root``: ``version``, else
    the active one (``root`` may also be a version folder). Nothing is downloaded. What serving sizes a shard
    replica's memory by."""
    r = open_root(root)
    if _is_version_folder(r):
        return FolderRoot(r.folder.parent.parent).shard_bytes(r.folder.name)
    return r.shard_bytes(r.chosen(version))


def verify_published(root: str | Path, name: str) -> VersionManifest:
    """A published version verified as its root can without serving it: a folder's files against their checksums;
    in object storage, every shard file its shard manifests list in the version's file table under that checksum
    (downloads verify the bytes)."""
    return open_root(root).verify(name)


def publish(staging: Path, root: str | Path, name: str) -> Path:
    """A finished staging folder published as version ``name`` of ``root``; its folder on this node."""
    return open_root(root).publish(staging, name)[0]


def activate(root: str | Path, name: str, by: str = "cli", verify: bool = True) -> str | None:
    """Point ACTIVE at ``name`` (compare-and-swap), once the version is verified (unless ``verify`` is False).
    Returns the version it replaced. Running services watch ACTIVE and switch once their shards have loaded it."""
    return open_root(root).activate(name, by=by, verify=verify)


def activation_history(root: str | Path) -> list[dict]:
    return open_root(root).history()


def previous_version(root: str | Path) -> str | None:
    """The version that was active before the current one (what a rollback returns to)."""
    return open_root(root).previous()


def rollback(root: str | Path, by: str = "cli") -> tuple[str | None, str]:
    """Activate the version that was active before this one; returns (from, to)."""
    return open_root(root).rollback(by=by)


@contextlib.contextmanager
def build_lock(root: Path) -> Iterator[None]:
    """Held by the one build writing into ``root``: a second build into the same root is refused with the
    holder's pid and start time (an flock, so a killed build leaves no stale lock). For a root in object storage
    the lock is this node's (in the root's ``state_dir``): builds on two nodes may both publish, and the
    compare-and-swap of ACTIVE lets one of them activate."""
    root = state_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".build.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise IndexMismatch(f"another build is writing into {root} ({holder}); wait for it to finish, or build "
                                "into another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}".encode(), 0)
        yield
    finally:
        os.close(fd)


_HELD: dict[tuple[str, str], tuple[Lease, int]] = {}  # (root, version) -> this process's lease, and its users


def hold_version(root: str | Path, name: str) -> None:
    """This process serves version ``name`` of ``root``: a lease, renewed while it is held, refuses its removal.
    Counted: each ``hold_version`` is matched by one ``let_go_version``."""
    key = (str(root), name)
    lease, users = _HELD.get(key) or (open_root(root).hold(name), 0)
    _HELD[key] = (lease, users + 1)


@atexit.register
def _let_go_of_all() -> None:
    """A process that exits cleanly lets go of what it held at once (one killed lets go when its leases lapse)."""
    for lease, _ in list(_HELD.values()):
        lease.release()
    _HELD.clear()


def let_go_version(root: str | Path, name: str) -> None:
    key = (str(root), name)
    if key not in _HELD:
        return
    lease, users = _HELD.pop(key)
    if users > 1:
        _HELD[key] = (lease, users - 1)
    else:
        lease.release()


def remove_version(root: str | Path, name: str) -> dict:
    """Delete a version: not the active one, nor one a live process holds (``hold_version``). The files no other
    version references are collected, unless a publish is in flight (``IndexRoot.remove``)."""
    return open_root(root).remove(name)
