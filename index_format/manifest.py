"""Self-describing index artifacts: shard and version manifests, checksums, and their verification.

A shard's ``manifest.json`` is written last, after every file it lists: its presence with matching
checksums is what marks a shard finished (a resumed build reuses exactly those). Serving reads the
encoder, dimension and BM25 parameters from here, never from a second copy of the settings.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from index_format.lucene import CONTENTS_FIELD

from .process import cache_root
from .prompts import EncoderSpec

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# A shard folder's files (the build writes them, serving reads them): the layout of an index version.
CHUNKS_FILE = "chunks.parquet"
CHUNKS_ARROW = "chunks.arrow"  # the same rows as Arrow IPC, memory-mapped by a replica (index_format.chunk_table)
DOCUMENTS_FILE = "documents.parquet"  # the shard's documents as read, in corpus order (deltas start from them)
EMBEDDINGS_FILE = "embeddings.npy"
FAISS_FILE = "dense.faiss"
LUCENE_DIR = "lucene"
TERMS_FILE = "terms.parquet"
# A named encoder's files in a shard: ``encoders/<name>/embeddings.npy`` (row i: chunk-table row i) and its FAISS
# index ``encoders/<name>/dense.faiss`` (ids are rows).
ENCODERS_DIR = "encoders"
ENCODER_NAME = re.compile(r"^[a-z][a-z0-9]{0,31}$")


def encoder_dir(name: str) -> str:
    """A named encoder's folder in a shard, relative to it."""
    return f"{ENCODERS_DIR}/{name}"


def checked_encoder_name(name: str) -> str:
    """A named encoder's name as a feature, a folder and a request field take it: lower-case letters and digits
    (``dense_<name>`` and ``dense_gap_<name>`` are its ranking features, so no ``_``)."""
    if not ENCODER_NAME.match(name or ""):
        raise ValueError(f"encoder name {name!r} is not valid: a lower-case letter, then letters or digits "
                         "(at most 32)")
    return name


def terms_file(field: str) -> str:
    """A shard's (term, df, cf) table of one Lucene field: ``terms.parquet`` for ``contents`` (as before fields),
    ``terms-<field>.parquet`` for a field beside it."""
    return TERMS_FILE if field == CONTENTS_FIELD else f"terms-{field}.parquet"
# A folded shard's FAISS id -> chunk-table row (-1: a replaced or deleted chunk's vector, never answered); absent
# where the ids are the rows (every shard a full build writes).
FAISS_ROWS_FILE = "faiss_rows.npy"


class IndexMismatch(RuntimeError):
    """An index on disk does not match its manifest, or not what the reader expects."""


class NamedEncoder(BaseModel):
    """An encoder a version holds beside its own (``python -m index_build.add_encoder``): its model, dimension and
    prompts, and in a shard's manifest its FAISS index's description. Its cosine is a ranking feature
    (``dense_<name>``), and a request may search the dense leg with it (``encoder``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    encoder: str
    dimension: int
    query_prompt: str = ""
    document_prompt: str = ""
    faiss: dict[str, Any] = {}  # a shard's index of these vectors ({} in a version's manifest)

    @property
    def spec(self) -> EncoderSpec:
        return EncoderSpec(self.encoder, self.query_prompt, self.document_prompt)

    def described(self) -> dict[str, Any]:
        """What a version and each of its shards must agree on (everything but the shard's FAISS index)."""
        return self.model_dump(exclude={"faiss"})


class ShardManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format_version: int = FORMAT_VERSION
    shard: int
    num_shards: int
    build_key: str
    encoder: str
    dimension: int
    # Put before every query and every document this shard's vectors were embedded from (``index_format.prompts``).
    query_prompt: str = ""
    document_prompt: str = ""
    metric: str  # inner_product over unit vectors (cosine)
    faiss: dict[str, Any]
    counts: dict[str, int]  # docs, chunks, faiss_vectors, lucene_docs; faiss_dead in a folded shard
    # The shard's own Lucene stats of ``contents`` (documents, non_empty_documents, total_terms, ...), and under
    # ``fields`` those of each field beside it (non_empty_documents, total_terms, unique_terms).
    lucene: dict[str, Any]
    encoders: dict[str, NamedEncoder] = {}  # the named encoders beside ``encoder`` (``encoders/<name>/``)
    checksums: dict[str, str]  # relative path -> sha256
    build_config: dict[str, Any]
    code_version: str
    created: str


class VersionManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format_version: int = FORMAT_VERSION
    version: str
    build_key: str
    created: str
    corpus: dict[str, Any]  # path, sha256, format
    encoder: str
    dimension: int
    # The prompts the version embeds with (``index_format.prompts``): every query is embedded as query_prompt +
    # text, every chunk as document_prompt + contents. "" in a version built before they were recorded.
    query_prompt: str = ""
    document_prompt: str = ""
    metric: str
    num_shards: int
    shards: list[str]  # shard folder names, in shard order
    counts: dict[str, int]  # docs, chunks, bad_records
    bm25: dict[str, Any]  # k1, b, doc_count, total_terms, avgdl, unique_terms
    build_config: dict[str, Any]
    code_version: str
    # What came from earlier versions: shards linked unchanged, chunks embedded and reused, and from where
    # (``index_build.reuse``); None for a build with reuse off.
    reuse: dict[str, Any] | None = None
    # The change log's writes (documents written through the API) this version holds: every one through this
    # sequence number (``index_build.fold``); 0 for none. Serving searches the later ones from its fresh segment.
    log_seq: int = 0
    # Encoders held beside ``encoder``, by name (``NamedEncoder``); each shard holds their vectors.
    encoders: dict[str, NamedEncoder] = {}

    def shard_expect(self) -> dict[str, Any]:
        """The fields every shard's manifest must share with this version's (``verify_shard``'s ``expect``)."""
        return encoder_fields(EncoderSpec.of(self), self.dimension)


def named_encoders_agree(version: VersionManifest, shard: ShardManifest) -> bool:
    return ({n: e.described() for n, e in version.encoders.items()}
            == {n: e.described() for n, e in shard.encoders.items()})


def encoder_fields(spec: EncoderSpec, dimension: int) -> dict[str, Any]:
    """A manifest's fields that say how its vectors were embedded; a version's and each of its shards' agree."""
    return {"encoder": spec.model, "dimension": dimension, "query_prompt": spec.query_prompt,
            "document_prompt": spec.document_prompt}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def code_version() -> str:
    """Package version, plus the git commit when the code runs from a checkout."""
    from . import __version__

    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+g{sha}" if sha else __version__


def _remembered(path: Path) -> tuple[Path, str] | None:
    """Where this node remembers a file's checksum, and the key it is remembered under: the file's inode, size,
    modification and change times. A version's files are never written once published (a change is a new file
    renamed into place, a new inode), so the same key is the same bytes; a write in place, even one that put the
    modification time back, moves the change time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    folder = cache_root() / "checksums"
    return folder, f"{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}-{st.st_ctime_ns}"


def sha256_file(path: Path, remembered: bool = True) -> str:
    """The file's SHA-256. Remembered on this node (``$RAYSEARCH_CACHE/checksums``): a replica opening a shard that
    the build or another replica on this node already checked reads none of its bytes to check it again, so a
    shard of millions of chunks opens in the time its own reads take. ``remembered=False`` reads every byte."""
    place = _remembered(path) if remembered else None
    if place is not None:
        with contextlib.suppress(OSError):
            return (place[0] / place[1]).read_text()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    after = _remembered(path) if place is not None else None
    if after is not None and after == place:  # not written while it was read
        with contextlib.suppress(OSError):
            place[0].mkdir(parents=True, exist_ok=True)
            tmp = place[0] / f".{place[1]}.{os.getpid()}"
            tmp.write_text(digest)
            os.replace(tmp, place[0] / place[1])
    return digest


def checksum_tree(folder: Path, skip: tuple[str, ...] = (MANIFEST,), remembered: bool = True) -> dict[str, str]:
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            if rel not in skip:
                out[rel] = sha256_file(path, remembered)
    return dict(sorted(out.items()))


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_shard_manifest(shard_dir: Path) -> ShardManifest:
    path = Path(shard_dir) / MANIFEST
    try:
        return ShardManifest.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise IndexMismatch(f"{shard_dir}: no {MANIFEST}; the shard is incomplete (rerun the build to resume it)") from None
    except ValueError as e:
        raise IndexMismatch(f"{path}: not a valid shard manifest: {e}") from None


def verify_shard(shard_dir: Path, *, expect: dict[str, Any] | None = None, checksums: bool = True,
                 remembered: bool = True) -> ShardManifest:
    """The shard's manifest, after checking its files and, when given, expected manifest fields. A file whose
    checksum this node remembers (``sha256_file``) is not read again unless ``remembered`` is False.

    ``expect`` maps manifest field -> required value (for example the encoder a service will embed
    queries with); any difference is refused with both values in the message.
    """
    shard_dir = Path(shard_dir)
    manifest = read_shard_manifest(shard_dir)
    if manifest.format_version != FORMAT_VERSION:
        raise IndexMismatch(
            f"{shard_dir}: format_version {manifest.format_version}, this code reads {FORMAT_VERSION}; rebuild the index"
        )
    for field, wanted in (expect or {}).items():
        have = getattr(manifest, field)
        if have != wanted:
            raise IndexMismatch(f"{shard_dir}: manifest says {field}={have!r} but {wanted!r} is required")
    if checksums:
        actual = checksum_tree(shard_dir, remembered=remembered)
        missing = sorted(set(manifest.checksums) - set(actual))
        extra = sorted(set(actual) - set(manifest.checksums))
        changed = sorted(k for k in manifest.checksums if k in actual and actual[k] != manifest.checksums[k])
        if missing or changed or extra:
            parts = []
            if missing:
                parts.append(f"missing {missing[:5]}")
            if changed:
                parts.append(f"changed since build {changed[:5]}")
            if extra:
                parts.append(f"not in manifest {extra[:5]}")
            raise IndexMismatch(f"{shard_dir}: files do not match the manifest: {'; '.join(parts)}")
    return manifest


def counts_agree(counts: dict[str, int]) -> bool:
    """A shard's chunk table, FAISS index and Lucene index hold the same chunks (a folded shard's FAISS index
    also holds ``faiss_dead`` vectors of chunks no longer there, which it never answers)."""
    return counts["chunks"] == counts["faiss_vectors"] - counts.get("faiss_dead", 0) == counts["lucene_docs"]
