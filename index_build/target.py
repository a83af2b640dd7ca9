"""Where a build's version goes: a local root, or a root in object storage through this node's mirror of it.

Either kind holds a publish lease (``IndexRoot.publishing``) from when the job opens its target until it is closed:
a job counts on files it finds in the store (a shard reused, a blob not uploaded again), and no removal collects
them meanwhile.

A local root: the build stages in ``ROOT/staging/<build_key>`` and publishes with one rename.

A root in object storage (``s3://bucket/prefix``, ``index_format.object_root``): the build stages in the root's
mirror in the node's cache (``ObjectRoot.local_root()``, laid out like a local root, so a rerun resumes there). Each
shard task uploads its committed shard to ``blobs/`` from the node it ran on; the driver then publishes the rest
(the top-level files and the manifests: the shards' files are content-addressed, so they are references, not
uploads) and keeps the staged folder as the cache's copy of the version. ``ACTIVE`` moves only by a
compare-and-swap on the tag read when the build started: a build that another publisher's activation overtook
leaves its version published but not active, and says how to activate it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from index_format.leases import Lease
from index_format.object_root import ObjectRoot
from index_format.root import IndexRoot
from index_format.store import Conflict
from index_format.versions import open_root


class ActivationRefused(Conflict):
    """A build's version is published, but ``ACTIVE`` moved since the build started: it was not activated."""


@dataclass
class Target:
    """The root a job writes (``root``, as given; ``index``: the root itself), where it stages on this node
    (``local``), the active version and tag read when the job started, and, for a root in object storage, its
    ``ObjectRoot`` (``remote``). A context manager: its publish lease is held inside it."""

    root: str
    index: IndexRoot
    local: Path
    active_at_start: tuple[str | None, str | None] = (None, None)
    lease: Lease | None = None

    @classmethod
    def open(cls, root: str | Path) -> Target:
        index = open_root(root)
        remote = index if isinstance(index, ObjectRoot) else None
        return cls(index.url if remote else str(root), index, remote.local_root() if remote else Path(root),
                   index.active_tagged())

    @property
    def remote(self) -> ObjectRoot | None:
        return self.index if isinstance(self.index, ObjectRoot) else None

    def __enter__(self) -> Target:
        self._held = self.index.publishing()
        self.lease = self._held.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._held.__exit__(*exc)
        self.lease = None

    @property
    def upload_to(self) -> str | None:
        """The URL shard tasks upload their committed files to (None: a local root, nothing to upload)."""
        return self.remote.url if self.remote is not None else None

    def publish_version(self, staging: Path, name: str, shard_uploads: list[dict] = (), activate: bool = True,
                        by: str = "index_build") -> tuple[Path, dict]:
        """The one last step of a build, a fold and ``add_encoder``: the staged, verified version published as
        ``name`` and, with ``activate``, made active (``activate``, below). ``shard_uploads``: what each shard task
        uploaded (``shard_tasks.upload_shard``). Returns the version's folder on this node and, for a root in object
        storage, what went up: the version's files and bytes, the bytes uploaded (by the shard tasks and by this
        call), and the seconds of this call (the shard tasks' summed apart)."""
        folder, report = self._publish(staging, name, shard_uploads)
        if activate:
            self.activate(name, by=by)
        return folder, report

    def _publish(self, staging: Path, name: str, shard_uploads: list[dict]) -> tuple[Path, dict]:
        if self.remote is None:
            return self.index.publish(staging, name)[0], {}
        t = time.perf_counter()
        uploaded: dict[str, dict] = {}
        for u in shard_uploads:
            uploaded.update(u["files"])
        folder, sent = self.remote.publish(staging, name, uploaded)
        by_shards = sum(u["bytes_uploaded"] for u in shard_uploads)
        return folder, {"root": self.remote.url, "files": sent["files"], "bytes": sent["bytes"],
                        "bytes_uploaded": sent["bytes_uploaded"] + by_shards, "bytes_uploaded_by_shards": by_shards,
                        "seconds": round(time.perf_counter() - t, 3),
                        "shard_upload_seconds": round(sum(u["seconds"] for u in shard_uploads), 3)}

    def activate(self, name: str, by: str = "index_build") -> None:
        """Point ``ACTIVE`` at ``name`` (the job verified it) only if it still names what it named at the start."""
        try:
            self.index.activate(name, by=by, verify=False, expect=self.active_at_start)
        except Conflict:
            was, now = self.active_at_start[0], self.index.active()
            raise ActivationRefused(
                f"index version {name!r} is published under {self.root} but not active: {now or 'none'} was activated "
                f"while it was built (it started on {was or 'none'}); to make it live: python -m index_build.versions "
                f"activate {self.root} {name}") from None
