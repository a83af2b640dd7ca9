"""What the app builder hands the router: typed specs, checked when they are made, read by attribute.

``build_app`` resolves the config and each collection's manifest into these; the router turns them into its
clients. Ray-free dataclasses: a spec's deployment handles (``target``, ``encoder``) are whatever Serve put there
for a bound deployment, and Serve finds them wherever they sit in the arguments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployments.edge.schemas import AnnParams
from index_format.manifest import VersionManifest
from index_format.prompts import EncoderSpec
from index_format.versions import open_root, read_version_manifest, resolve_version_dir

_SLOT = re.compile(r"^(?P<collection>.+)-(?:shard|group)-\d{3,}$")


def slot_name(collection: str, group: list[str], index: int) -> str:
    """A shard deployment's name: ``<collection>-shard-000`` for one shard, ``<collection>-group-000`` else."""
    return f"{collection}-{group[0]}" if len(group) == 1 else f"{collection}-group-{index:03d}"


def slot_collection(name: str) -> str | None:
    """The collection whose shard deployment ``name`` is (``slot_name``'s inverse); None for any other deployment."""
    m = _SLOT.match(name)
    return m.group("collection") if m else None


@dataclass(frozen=True)
class HostSpec:
    """What a process that holds shards opens: a group of one version's shards (``ShardHost``'s arguments)."""

    index_root: str | None  # None: a pinned version folder, never followed
    version_dir: str | None  # the version to open first; None: fetch ``version`` of a root in object storage
    shards: list[str]
    expect: dict[str, Any]  # the encoder and dimension every shard's manifest must name
    verify_checksums: bool = True
    lucene_heap: str = "512m"
    search_device: str = "cpu"
    warmup_searches: int = 2000
    version: str | None = None  # the first version's name


@dataclass(frozen=True)
class HeldSlot:
    """A shard slot searched inside the router replica (``shards.placement: router``)."""

    host: HostSpec
    max_versions: int = 2


@dataclass(frozen=True)
class SlotSpec:
    """One group of a collection's shards: a shard deployment's handle, or a ``HeldSlot`` the router opens."""

    name: str
    target: Any
    shards: list[str]


@dataclass(frozen=True)
class CollectionSpec:
    name: str
    version: str
    slots: list[SlotSpec]
    encoder_spec: EncoderSpec  # the version's encoder and prompts (its manifest's)
    dimension: int
    judgments: str  # the root whose judgments POST /feedback writes (deployments.judgments.judgments_of)
    encoder: Any = None  # a query-encoder deployment's handle; None: embedded in the router
    encoder_backend: str = "onnx"
    encoder_threads: int = 1
    root: str | None = None  # the index root whose ACTIVE pointer the collection follows; None: pinned
    rerank: bool = True
    ann: AnnParams | None = None
    counts: dict[str, int] = field(default_factory=dict)  # the manifest's counts (docs, chunks)
    bm25: dict[str, Any] = field(default_factory=dict)  # the manifest's BM25 block (names the Lucene fields)
    field_weights: dict[str, float] | None = None  # the collection's configured BM25 field weights
    # The version's named encoders (``index_build.add_encoder``): name -> (its spec, its query-encoder deployment's
    # handle, None: embedded in the router).
    named_encoders: dict[str, tuple[EncoderSpec, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class CreatedOptions:
    """How a router replica serves collections created through the API (under ``collections_root``): their shards
    held in the replica, opened with these of the config's shards settings, queries embedded in the replica."""

    collections_root: str
    verify_checksums: bool = True
    lucene_heap: str = "512m"
    search_device: str = "cpu"
    warmup_searches: int = 2000
    max_versions: int = 2
    encoder_backend: str = "onnx"
    encoder_threads: int = 1

def served_version(index: str, version: str | None) -> tuple[VersionManifest, Path | None]:
    """The manifest of the version a collection starts on, and its folder (None for a root in object storage:
    each replica fetches the files it serves to its own node; nothing is downloaded here)."""
    root = open_root(index)
    if not root.shared_by_nodes:
        folder = resolve_version_dir(Path(index), version)
        return read_version_manifest(folder), folder
    return root.manifest(root.chosen(version)), None


def created_spec(name: str, root: str, opts: CreatedOptions) -> CollectionSpec:
    """A collection created through the API, at its active version, as a router replica serves it: its shards in one
    group held in the replica (``shards.placement: router``), its queries embedded there, following its root's
    ACTIVE pointer like any collection served from a root. Reads the version's manifest (a thread's work)."""
    manifest, version_dir = served_version(root, None)
    host = HostSpec(index_root=root, version_dir=str(version_dir) if version_dir else None, version=manifest.version,
                    shards=list(manifest.shards), expect=manifest.shard_expect(),
                    verify_checksums=opts.verify_checksums, lucene_heap=opts.lucene_heap,
                    search_device=opts.search_device, warmup_searches=opts.warmup_searches)
    slot = SlotSpec(slot_name(name, list(manifest.shards), 0), HeldSlot(host, opts.max_versions), list(manifest.shards))
    return CollectionSpec(
        name=name, version=manifest.version, slots=[slot], encoder_spec=EncoderSpec.of(manifest),
        dimension=manifest.dimension, judgments=root, encoder_backend=opts.encoder_backend,
        encoder_threads=opts.encoder_threads, root=root, counts=dict(manifest.counts), bm25=dict(manifest.bm25),
        named_encoders={n: (e.spec, None) for n, e in manifest.encoders.items()})
