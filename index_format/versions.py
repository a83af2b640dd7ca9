"""Index versions under one root, published and activated atomically.

Layout::

    ROOT/ACTIVE                  name of the live version (replaced with os.replace, never edited)
    ROOT/activations.jsonl       one line per activation: when, which version, which it replaced, by whom
    ROOT/versions/<name>/        complete, immutable versions
    ROOT/staging/<build_key>/    builds in progress; a rerun with the same key resumes here
    ROOT/.build.lock             held by the one build writing into ROOT (a second one is refused)
    ROOT/pins/<name>             held (shared) by every process serving version <name>: it cannot be removed

A version folder appears under ``versions/`` only by one ``rename`` of a finished staging folder, so
a reader never sees a half-built version. Older versions stay until ``remove_version``.

A root may also be a URL in object storage (``s3://bucket/prefix``): each function here then does the same
through ``index_format.remote_root`` (its layout is described there), and a version to read is first fetched
into the node's cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from .manifest import MANIFEST, IndexMismatch, VersionManifest, counts_agree, named_encoders_agree
from .store import fsync_dir, is_remote

ACTIVE = "ACTIVE"
ACTIVATIONS = "activations.jsonl"


def versions_dir(root: Path) -> Path:
    return Path(root) / "versions"


def staging_dir(root: Path, build_key: str) -> Path:
    return Path(root) / "staging" / build_key


def remote(root: str | Path, cache_dir: Path | None = None):
    """The ``RemoteRoot`` of a root in object storage."""
    from .remote_root import RemoteRoot

    return RemoteRoot(str(root), cache_dir)


def state_dir(root: str | Path) -> Path:
    """Where the node keeps a root's mutable state (the API's change log, judgments, build records, the build lock):
    the root itself when it is a folder. For a root in object storage, ``$RAYSEARCH_STATE/roots/<slug>`` (default
    ``~/.local/state/raysearch``), which must be a durable volume: the change log is acknowledged there."""
    if is_remote(root):
        from .remote_root import default_state_dir, root_slug

        return default_state_dir() / "roots" / root_slug(str(root))
    return Path(root)


def absolute_root(root: str | Path) -> str:
    """A root as other processes must be told it: a URL as it is, a path made absolute."""
    return str(root) if is_remote(root) else str(Path(root).resolve())


def list_versions(root: Path) -> list[str]:
    if is_remote(root):
        return remote(root).versions()
    folder = versions_dir(root)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / MANIFEST).is_file())


def active_version(root: Path) -> str | None:
    if is_remote(root):
        return remote(root).active()
    try:
        name = (Path(root) / ACTIVE).read_text().strip()
    except FileNotFoundError:
        return None
    return name or None


def chosen_version(root: str | Path, version: str | None = None) -> str:
    """``version``, else the root's active one, checked to be published there (one listing); IndexMismatch naming
    the versions there when there is none to serve."""
    name = version or active_version(root)
    known = list_versions(root)
    if name is None:
        hint = f"; versions there: {', '.join(known)} (activate one)" if known else ""
        raise IndexMismatch(f"{root} has no active index version{hint}")
    if name not in known:
        raise IndexMismatch(f"index version {name!r} not found under {str(root).rstrip('/')}/versions")
    return name


def resolve_version_dir(path: Path, version: str | None = None, shards: list[str] | None = None,
                        cache_dir: Path | None = None) -> Path:
    """A version folder from an index root (its ACTIVE one, or ``version``) or a version folder itself. For a root
    in object storage, the version's folder in the node's cache (``cache_dir``), fetched first with the files of
    ``shards`` (all when None)."""
    if is_remote(path):
        return remote(path, cache_dir).fetch(chosen_version(path, version), shards)[0]
    path = Path(path)
    if (path / MANIFEST).is_file() and (path / "shards").is_dir():
        return path
    return versions_dir(path) / chosen_version(path, version)


def version_dir(root: str | Path, name: str, shards: list[str] | None = (), cache_dir: Path | None = None) -> Path:
    """The folder of published version ``name`` of ``root``. In object storage: its copy in the node's cache, with
    the version's own files (manifest, BM25 statistics) and those of ``shards`` (none by default; all: None)."""
    if is_remote(root):
        return remote(root, cache_dir).fetch(name, shards)[0]
    return versions_dir(Path(root)) / name


def shard_bytes(root: str | Path, version: str | None = None) -> dict[str, int]:
    """Shard folder name -> the bytes of its files (its manifest aside) in a version of ``root``: ``version``, else
    the active one (``root`` may also be a version folder). For a root in object storage, from the version's file
    table, so nothing is downloaded. What serving sizes a shard replica's memory by."""
    if is_remote(root):
        store = remote(root)
        name = version or store.active()
        if name is None:
            raise IndexMismatch(f"{root} has no active index version (activate one)")
        sizes = [(rel.split("/")[1:], f["size"]) for rel, f in store.files(name).items() if rel.startswith("shards/")]
    else:
        folder = resolve_version_dir(Path(root), version) / "shards"
        sizes = [(p.relative_to(folder).parts, p.stat().st_size) for p in folder.rglob("*") if p.is_file()]
    out: dict[str, int] = {}
    for (shard, *rest), size in sizes:
        out[shard] = out.get(shard, 0) + (size if rest != [MANIFEST] else 0)
    return out


def verify_published(root: str | Path, name: str) -> VersionManifest:
    """``verify_version`` of a published version. In object storage, without downloading its shards: every shard
    file its shard manifests list is in the version's file table under that checksum (downloads verify the bytes)."""
    if is_remote(root):
        return remote(root).verify(name)
    return verify_version(versions_dir(Path(root)) / name)


def read_version_manifest(version_dir: Path) -> VersionManifest:
    path = Path(version_dir) / MANIFEST
    try:
        return VersionManifest.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise IndexMismatch(f"{version_dir}: no {MANIFEST}: not an index version") from None
    except ValueError as e:
        raise IndexMismatch(f"{path}: not a valid version manifest: {e}") from None


def publish(staging: Path, root: Path, name: str) -> Path:
    """Move a finished staging folder into place under ``versions/<name>`` with one rename."""
    target = versions_dir(root) / name
    if target.exists():
        raise FileExistsError(f"index version {name!r} already exists at {target}; pick another --version")
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, target)
    fsync_dir(target.parent)
    return target


def verify_version(version_dir: Path, checksums: bool = True) -> VersionManifest:
    """The version's manifest, once every shard's files match their checksums (unless ``checksums`` is
    False: the build checks them in the shards' own tasks) and the counts add up."""
    from .manifest import verify_shard

    version_dir = Path(version_dir)
    manifest = read_version_manifest(version_dir)
    chunks = 0
    for shard in manifest.shards:
        m = verify_shard(version_dir / "shards" / shard, expect=manifest.shard_expect(),
                         checksums=checksums)
        if not counts_agree(m.counts):
            raise IndexMismatch(f"{version_dir.name}/{shard}: counts disagree: {m.counts}")
        if not named_encoders_agree(manifest, m):
            raise IndexMismatch(f"{version_dir.name}/{shard}: its named encoders {sorted(m.encoders)} are not the "
                                f"version's {sorted(manifest.encoders)}")
        chunks += m.counts["chunks"]
    if chunks != manifest.counts["chunks"]:
        raise IndexMismatch(f"{version_dir.name}: its shards hold {chunks} chunks, its manifest says "
                            f"{manifest.counts['chunks']}")
    return manifest


def activate(root: Path, name: str, by: str = "cli", verify: bool = True) -> str | None:
    """Point ACTIVE at ``name``: write a temporary file and rename it over the old pointer.

    Returns the version it replaced. Running services watch ACTIVE and switch to the new version once
    their shards have loaded it. ``name`` is looked up among the published versions, never joined
    into a path unchecked, since it may come from an HTTP request. The version is verified first
    (checksums and counts, ``verify_version``): a corrupted version is never made active.
    """
    if is_remote(root):
        return remote(root).activate(name, by=by)
    root = Path(root)
    if name not in list_versions(root):
        raise IndexMismatch(f"cannot activate {name!r}: no such version under {versions_dir(root)}")
    previous = active_version(root)
    if previous == name:
        return previous  # already live: nothing to write or log
    if verify:
        try:
            verify_version(versions_dir(root) / name)
        except IndexMismatch as e:
            raise IndexMismatch(f"not activating {name!r}: {e}") from None
    tmp = root / f".{ACTIVE}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / ACTIVE)
    fsync_dir(root)
    entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": name, "previous": previous,
             "by": by}
    with open(root / ACTIVATIONS, "a") as f:  # one short line per write: appends do not interleave
        f.write(json.dumps(entry) + "\n")
    return previous


def activation_history(root: Path) -> list[dict]:
    if is_remote(root):
        return remote(root).history()
    try:
        lines = (Path(root) / ACTIVATIONS).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def previous_version(root: Path) -> str | None:
    """The version that was active before the current one (what a rollback returns to)."""
    live = active_version(root)
    for entry in reversed(activation_history(root)):
        if entry.get("version") == live:
            return entry.get("previous")
    return None


def rollback(root: Path, by: str = "cli") -> tuple[str, str]:
    """Activate the version that was active before this one; returns (from, to)."""
    target = previous_version(root)
    if target is None:
        raise IndexMismatch(f"{root}: no earlier activation to roll back to")
    if target not in list_versions(root):
        raise IndexMismatch(f"cannot roll back to {target!r}: it was removed from {root}")
    return activate(root, target, by=by), target


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


_PINS: dict[str, int] = {}  # version folder -> the open, shared-locked pin file of this process


def pin_version(version_dir: Path) -> None:
    """Mark a version as served by this process until it exits: ``remove_version`` refuses it meanwhile."""
    version_dir = Path(version_dir).resolve()
    if str(version_dir) in _PINS or version_dir.parent.name != "versions":
        return  # already pinned, or a bare version folder outside a root (nothing removes it)
    pins = version_dir.parent.parent / "pins"
    pins.mkdir(exist_ok=True)
    fd = os.open(pins / version_dir.name, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    _PINS[str(version_dir)] = fd


def remove_version(root: Path, name: str) -> None:
    """Delete a version (not the active one). In a local root, not one a running app serves either (its pin); in
    object storage, replicas serving it keep their node's copy, and the blobs other versions share stay."""
    if is_remote(root):
        remote(root).remove(name)
        return
    if active_version(root) == name:
        raise ValueError(f"{name!r} is the active version; activate another one before removing it")
    folder = versions_dir(root) / name
    if not folder.is_dir():
        raise IndexMismatch(f"no version {name!r} under {versions_dir(root)}")
    pin = Path(root) / "pins" / name
    if pin.exists():
        fd = os.open(pin, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"{name!r} is served by a running app (it loaded this version); stop or redeploy it "
                             "before removing the version") from None
        finally:
            os.close(fd)
    # Rename first so a reader never opens a half-deleted folder.
    doomed = folder.with_name(f".removing-{name}")
    os.replace(folder, doomed)
    shutil.rmtree(doomed)
