"""What a build can take from versions already built instead of computing it again.

Two levels, both checked against the content, never assumed from a name or a date:

- **A whole shard.** When a published version was built with the same index options (everything in
  ``BuildConfig.content_key`` but the corpus path) and the same number of shards, and a new shard's
  chunk table is byte-identical to that version's shard (``chunks.parquet`` has the same checksum), the
  shard's files are linked into the new version (hard links: versions are immutable, so sharing the
  bytes is safe) and nothing of it is embedded or indexed again. A rebuild of an unchanged corpus
  therefore starts no Ray job at all.
- **A chunk's vector.** For every other chunk, a vector is reused when a published version built with
  the same encoder and the same chunking (size and overlap) holds a chunk whose text as embedded (title
  prepended or not, as each version was built) is identical. Only new or changed texts are embedded.

The versions searched are those of the output root (the active one first, then the newest), or of a
``--reuse-from`` root; ``--no-reuse`` turns both off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from .manifest import CHUNKS_FILE, EMBEDDINGS_FILE, MANIFEST, IndexMismatch, VersionManifest
from .versions import active_version, list_versions, read_version_manifest, versions_dir

MAX_SOURCES = 4  # versions searched for vectors: the active one and the newest others


def text_key(contents: str) -> bytes:
    return hashlib.blake2b(contents.encode("utf-8"), digest_size=16).digest()


def _same_index_options(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "corpus"} == {k: v for k, v in b.items() if k != "corpus"}


@dataclass
class SourceVersion:
    name: str
    folder: Path
    manifest: VersionManifest


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


def find_sources(root: Path, encoder: str, chunk_size: int, chunk_overlap: int) -> list[SourceVersion]:
    """Published versions under ``root`` whose vectors a build with these options may reuse, best first."""
    found = []
    for name in list_versions(root):
        folder = versions_dir(root) / name
        try:
            manifest = read_version_manifest(folder)
        except IndexMismatch:
            continue
        cfg = manifest.build_config
        if (manifest.encoder, cfg.get("chunk_size"), cfg.get("chunk_overlap")) == (encoder, chunk_size, chunk_overlap):
            found.append(SourceVersion(name, folder, manifest))
    live = active_version(root)
    active = [s for s in found if s.name == live]
    others = sorted((s for s in found if s.name != live), key=lambda s: s.manifest.created, reverse=True)
    return (active + others)[:MAX_SOURCES]


def shard_donor(sources: list[SourceVersion], content_key: dict, num_shards: int, shard: str,
                files_sha256: dict[str, str]) -> SourceVersion | None:
    """A version whose shard ``shard`` was built from exactly these chunks and documents (``files_sha256``:
    file name -> checksum) with the same index options."""
    from .manifest import read_shard_manifest

    for source in sources:
        m = source.manifest
        if m.num_shards != num_shards or not _same_index_options(m.build_config, content_key):
            continue
        folder = source.folder / "shards" / shard
        try:
            shard_manifest = read_shard_manifest(folder)
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


class VectorLookup:
    """Stored vectors of the source versions, found by the text they were embedded from."""

    def __init__(self, sources: list[SourceVersion]):
        from .build import contents_of

        self.where: dict[bytes, tuple[int, int, int]] = {}  # text key -> (source, shard, row)
        self.arrays: list[list[np.ndarray | None]] = []
        self.names = [s.name for s in sources]
        for i, source in enumerate(sources):
            prepend = bool(source.manifest.build_config.get("prepend_title", True))
            shards: list[np.ndarray | None] = []
            for j, shard in enumerate(source.manifest.shards):
                folder = source.folder / "shards" / shard
                table = pq.read_table(folder / CHUNKS_FILE, columns=["title", "text"])
                shards.append(None)
                for row, contents in enumerate(contents_of(table, prepend)):
                    self.where.setdefault(text_key(contents), (i, j, row))
            self.arrays.append(shards)
        self._folders = [[s.folder / "shards" / shard for shard in s.manifest.shards] for s in sources]

    def _array(self, source: int, shard: int) -> np.ndarray:
        array = self.arrays[source][shard]
        if array is None:
            array = self.arrays[source][shard] = np.load(self._folders[source][shard] / EMBEDDINGS_FILE,
                                                          mmap_mode="r")
        return array

    def take(self, contents: list[str], plan: ReusePlan) -> tuple[np.ndarray | None, list[int]]:
        """(vectors with the found rows filled, or None when none was found; the rows still to embed)."""
        found: list[tuple[int, tuple[int, int, int]]] = []
        missing: list[int] = []
        for row, text in enumerate(contents):
            hit = self.where.get(text_key(text))
            if hit is None:
                missing.append(row)
            else:
                found.append((row, hit))
        if not found:
            return None, missing
        dimension = self._array(found[0][1][0], found[0][1][1]).shape[1]
        vectors = np.zeros((len(contents), dimension), dtype=np.float32)
        groups: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        for row, (source, shard, at) in found:
            rows, ats = groups.setdefault((source, shard), ([], []))
            rows.append(row)
            ats.append(at)
        for (source, shard), (rows, ats) in groups.items():
            vectors[rows] = self._array(source, shard)[ats]  # one gather per stored shard
            plan.vectors_from[self.names[source]] = plan.vectors_from.get(self.names[source], 0) + len(rows)
        plan.vectors_reused += len(found)
        return vectors, missing
