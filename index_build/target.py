"""Where a build's version goes: a local root, or a root in object storage through this node's mirror of it.

A local root: the build stages in ``ROOT/staging/<build_key>``, publishes with one rename and activates by renaming
``ACTIVE`` (``index_format.versions``).

A root in object storage (``s3://bucket/prefix``, ``index_format.remote_root``): the build stages in the root's
mirror in the node's cache (``RemoteRoot.local_root()``, laid out like a local root, so a rerun resumes there). Each
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

from index_format.remote_root import RemoteRoot
from index_format.store import Conflict, is_remote
from index_format.versions import activate, publish


class ActivationRefused(Conflict):
    """A build's version is published, but ``ACTIVE`` moved since the build started: it was not activated."""


@dataclass
class Target:
    """The root a build writes (``root``, as given), where it stages on this node (``local``), and, for a root in
    object storage, its ``RemoteRoot`` and the active version and tag read when the build started."""

    root: str
    local: Path
    remote: RemoteRoot | None = None
    active_at_start: tuple[str | None, str | None] = (None, None)

    @classmethod
    def open(cls, root: str | Path) -> Target:
        if not is_remote(root):
            return cls(str(root), Path(root))
        r = RemoteRoot(str(root))
        return cls(r.url, r.local_root(), r, r.active_tagged())

    @property
    def upload_to(self) -> str | None:
        """The URL shard tasks upload their committed files to (None: a local root, nothing to upload)."""
        return self.remote.url if self.remote is not None else None

    def publish(self, staging: Path, name: str, shard_uploads: list[dict]) -> tuple[Path, dict]:
        """The staged version published as ``name``; ``shard_uploads``: what each shard task uploaded
        (``shard_tasks.upload_shard``). Returns the version's folder on this node and, for a root in object storage,
        what went up: the version's files and bytes, the bytes uploaded (by the shard tasks and by this call), and
        the seconds of this call (the shard tasks' summed apart)."""
        if self.remote is None:
            return publish(staging, self.local, name), {}
        t = time.perf_counter()
        uploaded: dict[str, dict] = {}
        for u in shard_uploads:
            uploaded.update(u["files"])
        sent = self.remote.publish(staging, name, uploaded)
        folder = self.remote.keep(staging, name)
        by_shards = sum(u["bytes_uploaded"] for u in shard_uploads)
        return folder, {"root": self.remote.url, "files": sent["files"], "bytes": sent["bytes"],
                        "bytes_uploaded": sent["bytes_uploaded"] + by_shards, "bytes_uploaded_by_shards": by_shards,
                        "seconds": round(time.perf_counter() - t, 3),
                        "shard_upload_seconds": round(sum(u["seconds"] for u in shard_uploads), 3)}

    def activate(self, name: str, by: str = "index_build") -> None:
        """Point ``ACTIVE`` at ``name``; in object storage only if it still names what it named at the start."""
        if self.remote is None:
            activate(self.local, name, by=by, verify=False)  # the job verified it
            return
        try:
            self.remote.activate(name, by=by, expect=self.active_at_start)
        except Conflict:
            was, now = self.active_at_start[0], self.remote.active()
            raise ActivationRefused(
                f"index version {name!r} is published under {self.root} but not active: {now or 'none'} was activated "
                f"while it was built (it started on {was or 'none'}); to make it live: python -m index_build.versions "
                f"activate {self.root} {name}") from None
