"""An index root in a folder: what a disk allows beside the rules every root keeps (``index_format.root``).

Layout::

    ROOT/ACTIVE                  name of the live version (compare-and-swap: an flock, a write, a rename)
    ROOT/activations/            one object per activation (``activations.jsonl``: the history before that)
    ROOT/versions/<name>/        complete, immutable versions
    ROOT/staging/<build_key>/    builds in progress; a rerun with the same key resumes here
    ROOT/leases/                 who holds which version, and the publishes and collections in progress

A version folder appears under ``versions/`` only by one ``rename`` of a finished staging folder, so a reader never
sees a half-built version; files a version shares with another are hard links, so removing one version never takes
a file from another, nor from a publish in flight: there is nothing for a collection to delete.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .manifest import MANIFEST, IndexMismatch, VersionManifest, counts_agree, named_encoders_agree
from .root import IndexRoot
from .store import FolderStore, fsync_dir


class FolderRoot(IndexRoot):
    shared_by_nodes = False

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.url = str(self.folder)
        self.store = FolderStore(self.folder)

    @property
    def versions_folder(self) -> Path:
        return self.folder / "versions"

    def versions(self) -> list[str]:
        if not self.versions_folder.is_dir():
            return []
        return sorted(p.name for p in self.versions_folder.iterdir() if (p / MANIFEST).is_file())

    def manifest(self, name: str) -> VersionManifest:
        return read_version_manifest(self.versions_folder / name)

    def verify(self, name: str) -> VersionManifest:
        return verify_version(self.versions_folder / name)

    def version_dir(self, name: str, shards: list[str] | None = ()) -> Path:
        return self.versions_folder / name

    def shard_bytes(self, name: str) -> dict[str, int]:
        folder = self.versions_folder / name / "shards"
        out: dict[str, int] = {}
        for p in folder.rglob("*"):
            if p.is_file():
                shard, *rest = p.relative_to(folder).parts
                out[shard] = out.get(shard, 0) + (p.stat().st_size if rest != [MANIFEST] else 0)
        return out

    def locations(self, name: str, files: list[str]) -> list[str | None]:
        paths = [self.versions_folder / name / rel for rel in files]
        return [str(p) if p.is_file() else None for p in paths]

    def publish(self, staging: Path, name: str, uploaded: dict[str, dict] | None = None) -> tuple[Path, dict]:
        """Move a finished staging folder into place under ``versions/<name>`` with one rename."""
        target = self.versions_folder / name
        if target.exists():
            raise FileExistsError(f"index version {name!r} already exists at {target}; pick another --version")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, target)
        fsync_dir(target.parent)
        return target, {}

    def _unpublish(self, name: str) -> None:
        # Renamed first, so a reader never opens a half-deleted folder.
        folder = self.versions_folder / name
        doomed = folder.with_name(f".removing-{name}")
        os.replace(folder, doomed)
        shutil.rmtree(doomed)

    def _collect(self) -> dict:
        return {"files_deleted": 0}  # a file shared by hard links goes with its last version


def read_version_manifest(version_dir: Path) -> VersionManifest:
    path = Path(version_dir) / MANIFEST
    try:
        return VersionManifest.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise IndexMismatch(f"{version_dir}: no {MANIFEST}: not an index version") from None
    except ValueError as e:
        raise IndexMismatch(f"{path}: not a valid version manifest: {e}") from None


def verify_version(version_dir: Path, checksums: bool = True) -> VersionManifest:
    """The version's manifest, once every shard's files match their checksums (unless ``checksums`` is
    False: the build checks them in the shards' own tasks) and the counts add up."""
    from .manifest import verify_shard

    version_dir = Path(version_dir)
    manifest = read_version_manifest(version_dir)
    chunks = 0
    for shard in manifest.shards:
        m = verify_shard(version_dir / "shards" / shard, expect=manifest.shard_expect(), checksums=checksums)
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
