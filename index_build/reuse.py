"""What a build can take from versions already built instead of computing it again.

Two levels, both checked against the content, never assumed from a name or a date:

- **A whole shard.** When a published version was built with the same index options (everything in
  ``BuildConfig.content_key`` but the corpus path) and the same number of shards, and a new shard's
  chunk table is byte-identical to that version's shard (``chunks.parquet`` has the same checksum), the
  shard's files are linked into the new version (hard links: versions are immutable, so sharing the
  bytes is safe) and nothing of it is embedded or indexed again. A rebuild of an unchanged corpus
  therefore starts no Ray job at all.
- **A chunk's vector.** For every other chunk, a vector is reused when a published version built with
  the same encoder and document prompt and the same chunking (size and overlap) holds a chunk whose text as embedded (title
  prepended or not, as each version was built) is identical. Only new or changed texts are embedded.

The versions searched are those of the output root (the active one first, then the newest), or of a
``--reuse-from`` root; ``--no-reuse`` turns both off. Both checks run in each shard's own task
(``shard_tasks.assemble_shard``), which holds its own chunks' text keys, never a source's.

A root in object storage is read through this node's cache: the one version searched (the active one, else the
newest that fits) is fetched there first (``ObjectRoot.fetch``: only the blobs the node lacks), then read like a
local version. One, not four: each version fetched may cost a download of its size on a fresh node, and the live
version holds what a new build most likely shares with it (a rebuild, a delta on it). Since blobs are
content-addressed, a shard linked from it is published as references to blobs already there: nothing is uploaded
again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from index_format.manifest import MANIFEST, IndexMismatch, VersionManifest, sha256_file
from index_format.prompts import EncoderSpec
from index_format.root import IndexRoot
from index_format.versions import (
    active_version,
    list_versions,
    open_root,
    read_version_manifest,
    versions_dir,
)

MAX_SOURCES = 4  # versions searched for vectors: the active one and the newest others
REMOTE_SOURCES = 1  # versions of a root in object storage fetched to be searched (see the module's docstring)


def text_key(contents: str) -> bytes:
    return hashlib.blake2b(contents.encode("utf-8"), digest_size=16).digest()


def _same_index_options(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "corpus"} == {k: v for k, v in b.items() if k != "corpus"}


@dataclass
class SourceVersion:
    name: str
    folder: Path
    manifest: VersionManifest
    fetched: dict | None = None  # from a root in object storage: what fetching it downloaded (ObjectRoot.fetch)


@dataclass
class ReusePlan:
    """Where each reused thing comes from; filled while the build runs, reported in its summary."""

    sources: list[SourceVersion] = field(default_factory=list)
    shards: dict[int, str] = field(default_factory=dict)  # shard -> the version its files were linked from
    vectors_reused: int = 0
    vectors_embedded: int = 0
    vectors_from: dict[str, int] = field(default_factory=dict)  # version -> vectors taken from it

    def describe(self) -> dict:
        return {"from": [s.name for s in self.sources], "shards_linked": {str(k): v for k, v in self.shards.items()},
                "chunks_embedded": self.vectors_embedded, "chunks_reused": self.vectors_reused,
                "reused_from": dict(self.vectors_from)}


def find_sources(root: str | Path, spec: EncoderSpec, chunk_size: int, chunk_overlap: int) -> list[SourceVersion]:
    """Published versions under ``root`` whose vectors a build with these options may reuse, best first; those of a
    root in object storage fetched into this node's cache first."""
    options = (spec.model, spec.document_prompt, chunk_size, chunk_overlap)
    opened = open_root(root)
    if opened.shared_by_nodes:
        return _remote_sources(opened, options)
    found = []
    for name in list_versions(root):
        folder = versions_dir(root) / name
        try:
            manifest = read_version_manifest(folder)
        except IndexMismatch:
            continue
        if _fits(manifest, options):
            found.append(SourceVersion(name, folder, manifest))
    return _best_first(found, active_version(root))[:MAX_SOURCES]


def _fits(manifest: VersionManifest, options: tuple[str, str, int, int]) -> bool:
    """Built with this encoder, document prompt, chunk size and overlap (what a reused vector depends on; the query
    prompt does not change a stored vector)."""
    cfg = manifest.build_config
    return (manifest.encoder, manifest.document_prompt, cfg.get("chunk_size"), cfg.get("chunk_overlap")) == options


def _best_first(found: list[SourceVersion], live: str | None) -> list[SourceVersion]:
    """The active version, then the others newest first."""
    active = [s for s in found if s.name == live]
    return active + sorted((s for s in found if s.name != live), key=lambda s: s.manifest.created, reverse=True)


def _remote_sources(root: IndexRoot, options: tuple[str, str, int, int]) -> list[SourceVersion]:
    """The best REMOTE_SOURCES versions of a root in object storage, fetched: the active one when it fits (its
    manifest alone is read), else the newest that fits."""
    names, live = root.versions(), root.active()

    def fitting(candidates: list[str]) -> list[SourceVersion]:
        found = []
        for name in candidates:
            try:
                manifest = root.manifest(name)
            except IndexMismatch:
                continue
            if _fits(manifest, options):
                found.append(SourceVersion(name, Path(), manifest))
        return found

    chosen = fitting([live]) if live in names else []
    if len(chosen) < REMOTE_SOURCES:
        chosen = _best_first(chosen + fitting([n for n in names if n != live]), live)
    out = []
    for source in chosen[:REMOTE_SOURCES]:
        folder, fetched = root.fetch(source.name)
        out.append(SourceVersion(source.name, folder, source.manifest, fetched))
    return out


def task_sources(sources: list[SourceVersion]) -> list[dict]:
    """What the shard tasks need of the source versions: plain values, sent to every task."""
    return [{"name": s.name, "folder": str(s.folder), "num_shards": s.manifest.num_shards,
             "prepend_title": bool(s.manifest.build_config.get("prepend_title", True)),
             "build_config": s.manifest.build_config,
             "shards": [str(s.folder / "shards" / shard) for shard in s.manifest.shards]} for s in sources]


def shard_donor_of(sources: list[dict], content_key: dict, num_shards: int, shard: str,
                   files_sha256: dict[str, str]) -> dict | None:
    """A source version (as ``task_sources`` gives it) whose shard ``shard`` was built from exactly these
    chunks and documents (``files_sha256``: file name -> checksum) with the same index options."""
    from index_format.manifest import read_shard_manifest

    for source in sources:
        if source["num_shards"] != num_shards or not _same_index_options(source["build_config"], content_key):
            continue
        try:
            shard_manifest = read_shard_manifest(Path(source["folder"]) / "shards" / shard)
        except IndexMismatch:
            continue
        if all(shard_manifest.checksums.get(name) == sha for name, sha in files_sha256.items()):
            return source
    return None


def link_shard(donor: Path, target: Path) -> None:
    """Every file of a donor shard into ``target`` (hard links where the filesystem allows, else copies),
    except its manifest, which the build writes anew."""
    for path in sorted(donor.rglob("*")):
        rel = path.relative_to(donor)
        if rel.as_posix() == MANIFEST:
            continue
        dest = target / rel
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            continue
        if dest.exists():  # the chunk table, written by the build, is the same bytes
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)
        except OSError:
            shutil.copy2(path, dest)


def linked_checksums(folder: Path, base: Path, base_sums: dict[str, str], written: dict[str, str]) -> dict[str, str]:
    """Every file's checksum in a shard folder made from ``base``'s by ``link_shard`` and then partly written:
    ``written`` (taken as they were written); a file that is still a hard link to the base's has the base's (verified when the base was published, and never written since: versions are
    immutable); the others (Lucene's new files) are read."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            if rel == MANIFEST:
                continue
            if rel in written:
                out[rel] = written[rel]
                continue
            source = base / rel
            same = rel in base_sums and source.exists() and os.stat(source).st_ino == os.stat(path).st_ino
            out[rel] = base_sums[rel] if same else sha256_file(path)
    return dict(sorted(out.items()))
