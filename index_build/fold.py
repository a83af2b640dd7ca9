"""Folding the documents written through the API (the change log) into a new version, at the cost of the change.

A version is immutable; writes since it live in the serving replicas' fresh segments, read from the change log
(``index_format.change_log``). A fold makes the next version hold them, so the segments can let go of them:

1. ``prepare_fold`` reads the log past the base version's ``log_seq``, keeps each document's last
   write (an upsert, or a delete), chunks the upserted documents exactly as the build does, embeds them with
   the version's encoder, and leaves each shard's part in the work folder.
2. ``fold_shard`` (one per shard touched; an untouched shard is hard-linked whole) starts from the base
   shard's files, hard-linked, and rewrites only what the change needs:

   - the two tables (``documents.parquet``, ``chunks.parquet``): the base's rows with the changed and deleted
     documents left out, the upserted ones appended;
   - ``embeddings.npy``: the kept rows and the new vectors;
   - FAISS: a flat index is made again from the vectors (a copy: as cheap as appending); an approximate one is
     appended to, the replaced vectors left in its graph as dead ids that ``faiss_rows.npy`` maps to no row
     (never answered), until they pass ``DEAD_FRACTION`` of it and the index is rebuilt;
   - Lucene: updated in place (``index_format.lucene.update_lucene_index``): its segments stay hard links to the
     base's, the replaced chunks are deleted (a new live-docs file) and the new ones added as a new segment;
   - the shard's term statistics: the base's, less the terms of what left and plus those of what came.

Step 1 runs in a ``FoldWorker`` actor on the driver's node, kept up between folds on a cluster (``fold_workers``). For
a local root step 2 runs there too, in the workers: the base version's folder is there. For a root in object storage
step 2 is a Ray Data ``map`` over the touched shards (``fold_stored_shard``), on any node: each task fetches its base
shard into its node's cache, reads its part of the change from the fold's work area in the store, folds, verifies and
uploads the shard, and returns its statistics; the untouched shards are referenced, never fetched.

3. The corpus-wide BM25 statistics are summed from the shards' (for a root in object storage: those the tasks
   returned, and the untouched shards' read from the store), the version is checked, published with
   ``log_seq`` (the last write it holds) and activated. What it holds equals a full build of the same documents:
   the same chunks, vectors and statistics, so the same scores (tested); rows of a folded shard are in a
   different order, which nothing reads as meaning.

``python -m index_build.fold --index ROOT`` runs it; one build or fold at a time per root (``build_lock``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import pickle
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from index_format.chunking import Chunking
from index_format.collection_log import open_change_log
from index_format.lucene import CONTENTS_FIELD
from index_format.manifest import (
    CHUNKS_ARROW,
    CHUNKS_FILE,
    DOCUMENTS_FILE,
    EMBEDDINGS_FILE,
    FAISS_FILE,
    FAISS_ROWS_FILE,
    LUCENE_DIR,
    MANIFEST,
    IndexMismatch,
    NamedEncoder,
    ShardManifest,
    VersionManifest,
    code_version,
    counts_agree,
    encoder_dir,
    encoder_fields,
    now_iso,
    read_shard_manifest,
    sha256_file,
    terms_file,
    write_json_atomic,
)
from index_format.process import configure_process
from index_format.prompts import EncoderSpec
from index_format.records import metadata_json, written_document
from index_format.sharding import shard_of
from index_format.versions import (
    absolute_root,
    build_lock,
    read_version_manifest,
    staging_dir,
    verify_version,
    version_dir,
)

from .reuse import link_shard, linked_checksums
from .tables import CHUNK_SCHEMA, DOCUMENT_SCHEMA, ROW_GROUP
from .target import Target

DEAD_FRACTION = 0.1  # an approximate index with more dead vectors than this share is rebuilt, not appended to
SHARD_THREADS = 2  # threads writing one shard's files at once


@dataclass
class FoldSummary:
    version: str | None  # None: nothing to fold
    base: str
    log_seq: int
    upserted: int = 0
    deleted: int = 0
    shards_changed: list[str] = field(default_factory=list)
    shards_linked: list[str] = field(default_factory=list)
    rebuilt_faiss: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    activated: bool = False
    shard_seconds: dict[str, dict[str, float]] = field(default_factory=dict)  # each changed shard's task, by step
    change_log: dict = field(default_factory=dict)  # its compaction after the fold (segments, bytes before/after)
    upload: dict = field(default_factory=dict)  # into object storage: files, bytes, bytes_uploaded, seconds
    nodes: dict[str, str] = field(default_factory=dict)  # a root in object storage: each changed shard's node

    def render(self) -> str:
        compacted = ""
        if self.change_log.get("segments"):
            c = self.change_log
            compacted = (f"\nchange log     {c['segments']} closed segment(s) compacted: {c['bytes_before']:,} -> "
                         f"{c['bytes_after']:,} bytes")
        if self.version is None:
            return f"nothing to fold: {self.base} holds the change log through seq {self.log_seq}{compacted}"
        lines = [f"folded         writes through seq {self.log_seq} into {self.version} (base {self.base})"
                 f"{', activated' if self.activated else ''}",
                 f"documents      {self.upserted:,} upserted, {self.deleted:,} deleted",
                 f"shards         {len(self.shards_changed)} changed, {len(self.shards_linked)} linked unchanged"
                 + (f"; FAISS rebuilt in {', '.join(self.rebuilt_faiss)}" if self.rebuilt_faiss else "")]
        if self.upload:
            u = self.upload
            lines.append(f"uploaded       {u['bytes_uploaded']:,} of the version's {u['bytes']:,} bytes (the rest were "
                         f"in the store already) in {u['seconds']:.2f}s")
        if len(set(self.nodes.values())) > 1:
            lines.append(f"nodes          the changed shards were folded on {len(set(self.nodes.values()))} nodes")
        lines.append("time           " + ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items()))
        return "\n".join(lines) + compacted

    def as_dict(self) -> dict:
        return dict(self.__dict__)


# ---------------------------------------------------------------- step 1: the log's changes, chunked and embedded


def _log_changes(root: str, after: int, through: int | None) -> tuple[dict[str, tuple[int, dict]], set[str], int]:
    """Each document's last write past ``after`` (through ``through``): (upserts: id -> (seq, record), deletes,
    the last seq read)."""
    upserts: dict[str, tuple[int, dict]] = {}
    deletes: set[str] = set()
    last = after
    for change in open_change_log(root, after=after).read_new():  # the segments past the base's only
        if through is not None and change.seq > through:
            break
        for doc_id in change.deletes:
            upserts.pop(doc_id, None)
            deletes.add(doc_id)
        for record in change.upserts:
            deletes.discard(record["id"])
            upserts[record["id"]] = (change.seq, record)
        last = change.seq
    return upserts, deletes, last


def prepare_fold(root: str, work: str, after: int, through: int | None, num_shards: int, build_config: dict,
                 encoder: EncoderSpec, named: dict[str, EncoderSpec] | None = None) -> dict:
    """Step 1: the writes past ``after`` as each shard's documents, chunks and vectors in ``work``: those of the
    version's encoder, and of each of its ``named`` encoders under ``encoders/<name>/``."""
    from index_format.encoders import load_encoder

    upserts, deletes, last = _log_changes(root, after, through)
    chunking = Chunking.of(build_config)
    docs: dict[int, list[dict]] = {}
    chunks: dict[int, list[dict]] = {}
    contents: dict[int, list[str]] = {}
    for doc_id, (seq, record) in upserts.items():
        doc = written_document(seq, record)
        s = shard_of(doc_id, num_shards)
        as_json = metadata_json(doc.metadata)
        docs.setdefault(s, []).append({"doc_id": doc.doc_id, "title": doc.title, "text": doc.text, "source": doc.source,
                                       "metadata_json": as_json})
        for c in chunking.chunks(doc):
            chunks.setdefault(s, []).append(c.row(as_json))
            contents.setdefault(s, []).append(c.contents(chunking.prepend_title))
    texts = [t for s in sorted(contents) for t in contents[s]]
    vectors = (load_encoder(encoder.model, "auto").encode(texts, prompt=encoder.document_prompt).astype(np.float32)
               if texts else None)
    others = {n: load_encoder(e.model, "auto").encode(texts, prompt=e.document_prompt).astype(np.float32)
              for n, e in (named or {}).items()} if texts else {}
    folder = Path(work)
    folder.mkdir(parents=True, exist_ok=True)
    touched: dict[int, dict] = {}
    at = 0
    for s in range(num_shards):
        gone = sorted(d for d in deletes if shard_of(d, num_shards) == s)
        if s not in docs and not gone:
            continue
        part = folder / f"shard-{s:06d}"
        part.mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pylist(docs.get(s, []), schema=DOCUMENT_SCHEMA), part / DOCUMENTS_FILE)
        pq.write_table(pa.Table.from_pylist(chunks.get(s, []), schema=CHUNK_SCHEMA), part / CHUNKS_FILE)
        n = len(contents.get(s, []))
        np.save(part / EMBEDDINGS_FILE, vectors[at:at + n] if n else np.zeros((0, 0), dtype=np.float32))
        for name, theirs in others.items():
            (part / encoder_dir(name)).mkdir(parents=True)
            np.save(part / encoder_dir(name) / EMBEDDINGS_FILE, theirs[at:at + n])
        (part / "contents.json").write_text(json.dumps(contents.get(s, [])))
        (part / "deletes.json").write_text(json.dumps(gone))
        at += n
        touched[s] = {"upserts": len(docs.get(s, [])), "deletes": len(gone), "chunks": n}
    return {"log_seq": last, "upserted": len(upserts), "deleted": len(deletes), "touched": touched}


# ---------------------------------------------------------------- step 2: one shard, at the cost of its change


def _replace_table(path: Path, tables: list[pa.Table], schema: pa.Schema) -> None:
    """A table file written anew (never through a hard link to the base's bytes), in the build's row groups and
    uncompressed: Snappy made the two tables' writes 0.33 s a shard of 57k chunks against 0.12 s (and reading
    them back 0.16 against 0.05 s), for 1.8x the bytes; a fold rewrites them whole, so it pays that at every fold
    (bench/README.md, "Folding")."""
    tmp = path.with_name(path.name + ".tmp")
    table = pa.concat_tables([t.select(schema.names).cast(schema) for t in tables])
    pq.write_table(table, tmp, row_group_size=ROW_GROUP, compression="none")
    os.replace(tmp, path)


def _terms_after(base_terms: pa.Table, removed: dict[str, list[int]], added: dict[str, list[int]]) -> pa.Table:
    """The shard's (term, df, cf) table less what left and plus what came; terms no document holds dropped."""
    from index_format.bm25_stats import merge_term_tables

    delta = {t: [0, 0] for t in set(removed) | set(added)}
    for t, (df, cf) in removed.items():
        delta[t][0] -= df
        delta[t][1] -= cf
    for t, (df, cf) in added.items():
        delta[t][0] += df
        delta[t][1] += cf
    change = pa.table({"term": list(delta), "df": [v[0] for v in delta.values()],
                       "cf": [v[1] for v in delta.values()]},
                      schema=pa.schema([("term", pa.string()), ("df", pa.int64()), ("cf", pa.int64())]))
    merged = merge_term_tables([base_terms, change])
    if pc.any(pc.less(merged["df"], 0)).as_py():
        raise IndexMismatch("a fold removed terms the shard's statistics did not hold: its term table is wrong")
    return merged.filter(pc.greater(merged["df"], 0))


def _lucene_after(base: Path, folder: Path, before: dict, change: dict, field: str = CONTENTS_FIELD) -> dict:
    """One Lucene field's shard statistics after a fold, by difference (``update_lucene_index``'s ``change``), and
    its term table written anew (never through the hard link to the base's)."""
    terms = _terms_after(pq.read_table(base / terms_file(field)), change["removed"], change["added"])
    (folder / terms_file(field)).unlink()
    pq.write_table(terms, folder / terms_file(field))
    return {"non_empty_documents": before["non_empty_documents"] - change["removed_nonempty"] + change["added_nonempty"],
            "total_terms": before["total_terms"] - change["removed_length"] + change["added_length"],
            "unique_terms": terms.num_rows}


def fold_shard(base_shard: str, shard_dir: str, part: str, build_key: str, build_config: dict,
               dead_fraction: float = DEAD_FRACTION) -> dict:
    """Step 2: the base shard with its part of the change applied, committed (its manifest written). The tables,
    the vectors and the FAISS index are written by ``SHARD_THREADS`` threads (Arrow, numpy, FAISS and hashing
    release the GIL), then Lucene is updated on this one."""
    from index_format.lucene import update_lucene_index

    t0 = time.perf_counter()
    base, folder, part_dir = Path(base_shard), Path(shard_dir), Path(part)
    old = read_shard_manifest(base)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    link_shard(base, folder)

    new_docs = pq.read_table(part_dir / DOCUMENTS_FILE)
    new_chunks = pq.read_table(part_dir / CHUNKS_FILE)
    new_vectors = np.load(part_dir / EMBEDDINGS_FILE)
    contents = json.loads((part_dir / "contents.json").read_text())
    gone = pa.array(sorted(set(json.loads((part_dir / "deletes.json").read_text()))
                           | set(new_docs["doc_id"].to_pylist())), pa.string())
    chunk_ids = pq.read_table(base / CHUNKS_FILE, columns=["doc_id", "chunk_id"], memory_map=True)
    keep = pc.invert(pc.is_in(chunk_ids["doc_id"], value_set=gone)).to_numpy(zero_copy_only=False)
    removed_ids = chunk_ids.filter(pa.array(~keep))["chunk_id"].to_pylist()
    kept = np.flatnonzero(keep)
    rows = len(kept) + new_chunks.num_rows

    with ThreadPoolExecutor(SHARD_THREADS) as pool:
        jobs = [pool.submit(_fold_documents, base, folder, gone, new_docs),
                pool.submit(_fold_chunks, base, folder, keep, new_chunks),
                pool.submit(_fold_vectors, base, folder, kept, rows, new_vectors, old.dimension),
                pool.submit(_fold_faiss, base, folder, old, kept, rows, new_vectors, build_config, dead_fraction)]
        (docs_count, docs_sum), chunks_sum, vectors_sum, (faiss_info, faiss_sums, dead, rebuilt) = \
            [j.result() for j in jobs]
    t_files = time.perf_counter() - t0

    # Lucene in place, and the shard's term statistics by difference.
    t = time.perf_counter()
    # The base's Lucene fields beside contents (a title) are kept: the new chunks get them, their statistics follow.
    fields = list(old.lucene.get("fields", {}))
    extra = ([dict(zip(fields, values, strict=True))
              for values in zip(*[new_chunks[f].fill_null("").to_pylist() for f in fields], strict=True)]
             if fields else [{}] * new_chunks.num_rows)
    update = update_lucene_index(folder / LUCENE_DIR, removed_ids,
                                 list(zip(new_chunks["chunk_id"].to_pylist(), contents, extra, strict=True)), fields)
    lucene = dict(old.lucene) | _lucene_after(base, folder, old.lucene, update)
    for name in fields:
        lucene["fields"] = dict(lucene["fields"]) | {
            name: _lucene_after(base, folder, old.lucene["fields"][name], update["fields"][name], name)}
    lucene["documents"] = update["documents"]
    rows_sum = _fold_doc_rows(base, folder, keep, kept, new_chunks["chunk_id"].to_pylist())
    t_lucene = time.perf_counter() - t

    counts = {"docs": docs_count, "chunks": rows, "faiss_vectors": faiss_info["ntotal"],
              "lucene_docs": update["documents"]} | ({"faiss_dead": dead} if dead else {})
    if not counts_agree(counts):
        raise IndexMismatch(f"{folder.name}: a fold left counts that disagree: {counts}")
    encoders = {name: _fold_named(base, folder, part_dir, name, entry, kept, old.build_config)
                for name, entry in old.encoders.items()}
    written = {DOCUMENTS_FILE: docs_sum, EMBEDDINGS_FILE: vectors_sum} | chunks_sum | faiss_sums | rows_sum
    body = ShardManifest(shard=old.shard, num_shards=old.num_shards, build_key=build_key,
                         **encoder_fields(EncoderSpec.of(old), old.dimension), metric=old.metric, faiss=faiss_info, counts=counts, lucene=lucene, encoders=encoders,
                         checksums=linked_checksums(folder, base, old.checksums, written), build_config=old.build_config,
                         code_version=code_version(), created=now_iso())
    write_json_atomic(folder / MANIFEST, body.model_dump(mode="json"))
    return {"shard": old.shard, "counts": counts, "rebuilt_faiss": rebuilt,
            "seconds": {"files": t_files, "lucene": t_lucene, "total": time.perf_counter() - t0}}


def _fold_doc_rows(base: Path, folder: Path, keep: np.ndarray, kept: np.ndarray, added_ids: list[str]) -> dict:
    """The folded index's document -> row map (``DOC_ROWS_FILE``), moved on from the base's where Lucene kept the
    base's segments as they were, else read from every stored id; none where the base had none (a version built
    before the map: a replica then reads the ids as it opens the shard). Returns its checksum entry."""
    from index_format.lucene import DOC_ROWS_FILE, folded_doc_rows, lucene_doc_rows

    path = folder / DOC_ROWS_FILE
    path.unlink(missing_ok=True)  # the base's, linked: wrong once Lucene changed
    if not (base / DOC_ROWS_FILE).is_file():
        return {}
    new_row_of_old = np.full(len(keep), -1, dtype=np.int64)
    new_row_of_old[kept] = np.arange(len(kept))
    rows = folded_doc_rows(base / LUCENE_DIR, folder / LUCENE_DIR, np.load(base / DOC_ROWS_FILE), new_row_of_old,
                           added_ids, len(kept))
    if rows is None:
        table = pq.read_table(folder / CHUNKS_FILE, columns=["chunk_id"])["chunk_id"].to_pylist()
        rows = lucene_doc_rows(folder / LUCENE_DIR, table)
    tmp = folder / (DOC_ROWS_FILE + ".tmp.npy")
    np.save(tmp, rows)
    os.replace(tmp, path)
    return {DOC_ROWS_FILE: sha256_file(path)}


def _fold_named(base: Path, folder: Path, part: Path, name: str, entry: NamedEncoder, kept: np.ndarray,
                build_config: dict) -> NamedEncoder:
    """A named encoder's vectors of the kept rows and the new ones, and its FAISS index made again from them."""
    from .add_encoder import write_encoder_files

    stored = np.load(base / encoder_dir(name) / EMBEDDINGS_FILE, mmap_mode="r")
    new = part / encoder_dir(name) / EMBEDDINGS_FILE
    added = np.load(new) if new.is_file() else np.zeros((0, entry.dimension), dtype=np.float32)
    vectors = np.concatenate([np.asarray(stored[kept], dtype=np.float32), added.reshape(-1, entry.dimension)])
    return write_encoder_files(folder, name, entry.spec, vectors, build_config)


def _fold_documents(base: Path, folder: Path, gone: pa.Array, new_docs: pa.Table) -> tuple[int, str]:
    """The documents table less the changed and deleted, plus the upserted; (its documents, its checksum)."""
    docs = pq.read_table(base / DOCUMENTS_FILE, memory_map=True)
    kept = docs.filter(pc.invert(pc.is_in(docs["doc_id"], value_set=gone)))
    _replace_table(folder / DOCUMENTS_FILE, [kept, new_docs], DOCUMENT_SCHEMA)
    return kept.num_rows + new_docs.num_rows, sha256_file(folder / DOCUMENTS_FILE)


def _fold_chunks(base: Path, folder: Path, keep: np.ndarray, new_chunks: pa.Table) -> dict[str, str]:
    """The chunk table less the replaced and deleted rows, plus the new ones, and its copy a replica maps
    (``chunk_table``); their checksums."""
    from index_format.chunk_table import write_arrow_table

    chunks = pq.read_table(base / CHUNKS_FILE, memory_map=True)
    _replace_table(folder / CHUNKS_FILE, [chunks.filter(pa.array(keep)), new_chunks], CHUNK_SCHEMA)
    write_arrow_table(folder)
    return {CHUNKS_FILE: sha256_file(folder / CHUNKS_FILE), CHUNKS_ARROW: sha256_file(folder / CHUNKS_ARROW)}


def _fold_vectors(base: Path, folder: Path, kept: np.ndarray, rows: int, new_vectors: np.ndarray,
                  dimension: int) -> str:
    """The kept rows' vectors and the new ones, row for row with the chunk table."""
    stored = np.load(base / EMBEDDINGS_FILE, mmap_mode="r")
    dim = stored.shape[1] if stored.ndim == 2 and stored.shape[1] else dimension
    tmp = folder / (EMBEDDINGS_FILE + ".tmp")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(rows, dim))
    at = 0
    for first, last in _runs(kept):  # a few long runs (only the changed documents' rows are left out): slices
        out[at:at + last - first] = stored[first:last]
        at += last - first
    if len(new_vectors):
        out[len(kept):] = new_vectors
    out.flush()
    del out
    os.replace(tmp, folder / EMBEDDINGS_FILE)
    return sha256_file(folder / EMBEDDINGS_FILE)


def _fold_faiss(base: Path, folder: Path, old: ShardManifest, kept: np.ndarray, rows: int, new_vectors: np.ndarray,
                build_config: dict, dead_fraction: float) -> tuple[dict, dict[str, str], int, bool]:
    """FAISS: each id's row after the change (-1: its chunk left); appended to where approximate, made again where
    flat (as cheap) or past ``dead_fraction`` dead. (its manifest entry, checksums, dead ids, whether rebuilt)"""
    import faiss

    from .faiss_index import (
        build_faiss_index,
        index_description,
        resolved_kind,
        search_options,
        spec_of_config,
    )

    base_rows = np.load(base / FAISS_ROWS_FILE) if (base / FAISS_ROWS_FILE).is_file() \
        else np.arange(old.counts["chunks"], dtype=np.int64)
    new_row = np.full(old.counts["chunks"], -1, dtype=np.int64)
    new_row[kept] = np.arange(len(kept))
    vector_rows = np.concatenate([np.where(base_rows >= 0, new_row[np.maximum(base_rows, 0)], -1),
                                  np.arange(len(kept), rows, dtype=np.int64)])
    dead = int((vector_rows < 0).sum())
    kind = old.faiss.get("type", "flat")
    rebuilt = kind == "flat" or dead > dead_fraction * max(len(vector_rows), 1)
    (folder / FAISS_FILE).unlink()
    (folder / FAISS_ROWS_FILE).unlink(missing_ok=True)
    sums = {}
    if rebuilt:  # from the vectors as the table now holds them: the kept rows, then the new
        spec = spec_of_config(build_config, kind, device="cpu")
        stored = np.load(base / EMBEDDINGS_FILE, mmap_mode="r")
        vectors = np.concatenate([stored[kept], np.asarray(new_vectors, dtype=np.float32).reshape(-1, stored.shape[1])])
        index = build_faiss_index(vectors, spec)
        kind = resolved_kind(spec, rows)
        faiss_info = {"type": kind} | index_description(index) | search_options(spec, kind, index)
        dead = 0
    else:
        index = faiss.read_index(str(base / FAISS_FILE))
        if len(new_vectors):
            index.add(np.ascontiguousarray(new_vectors, dtype=np.float32))
        np.save(folder / FAISS_ROWS_FILE, vector_rows)
        sums[FAISS_ROWS_FILE] = sha256_file(folder / FAISS_ROWS_FILE)
        faiss_info = old.faiss | {"ntotal": int(index.ntotal)}  # (index_description serializes it: 0.15 s)
    faiss.write_index(index, str(folder / FAISS_FILE))
    sums[FAISS_FILE] = sha256_file(folder / FAISS_FILE)
    return faiss_info, sums, dead, rebuilt


def _runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """Sorted row numbers as [first, last) runs of consecutive ones."""
    if not len(rows):
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(rows)]])
    return [(int(rows[a]), int(rows[b - 1]) + 1) for a, b in zip(starts, ends, strict=True)]


# ---------------------------------------------------------------- the workers


class FoldWorker:
    """Runs a fold's steps (a Ray actor). On a cluster the workers stay up between folds (detached, named, no CPU
    reserved while idle): a fold is a new Ray job, and a job's task workers start cold (a process, its imports,
    a JVM whose first Lucene update costs about a second), which for a fold of a few documents was most of its
    time (bench/README.md, "Folding"). Started by the first fold; a local Ray (no cluster) takes them down with it."""

    def prepare(self, *args) -> dict:
        return prepare_fold(*args)

    def shard(self, *args) -> dict:
        return fold_shard(*args)


WORKER_NAMESPACE = "raysearch"


def fold_workers(count: int) -> list:
    """``count`` fold workers on this (the driver's) node, started where none runs yet. A worker is named after the
    code it runs (a digest of the fold's modules) and its node, so a fold after an upgrade starts new workers, and
    takes down those left by the old code. Pinned to the driver's node: the workers share the fold's work folder and
    the base version's folder there (nodes share no disk)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    code = hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in _worker_modules())).hexdigest()[:10]
    prefix = "raysearch-fold-"
    for stale in ray.util.list_named_actors(all_namespaces=True):
        if stale["namespace"] == WORKER_NAMESPACE and stale["name"].startswith(prefix) and \
                not stale["name"].startswith(f"{prefix}{code}-"):
            with contextlib.suppress(ValueError):  # gone meanwhile
                ray.kill(ray.get_actor(stale["name"], namespace=WORKER_NAMESPACE))
    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(num_cpus=0)(FoldWorker)
    return [actor.options(name=f"{prefix}{code}-{node[:12]}-{i}", namespace=WORKER_NAMESPACE, lifetime="detached",
                          get_if_exists=True, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
            .remote() for i in range(count)]


def _worker_modules() -> list:
    import index_format.lucene

    from . import add_encoder, faiss_index, tables

    return [sys.modules[__name__], index_format.lucene, faiss_index, tables, add_encoder]


# ---------------------------------------------------------------- the fold


def fold(root: Path, through: int | None = None, base: str | None = None, do_activate: bool = True,
         version: str | None = None, dead_fraction: float = DEAD_FRACTION) -> FoldSummary:
    """Fold the change log of the index root ``root`` (its writes past the base version's ``log_seq``, through
    ``through`` when given) into a new version on top of ``base`` (default: the active one), publish it and
    activate it. One build or fold at a time per root. A root in object storage: its change log read from the store
    (``index_format.store_log``), the shards the writes touched folded on any node and uploaded (the only new bytes),
    the version published and activated by compare-and-swap."""
    with build_lock(root), Target.open(root) as dest:
        summary = _fold(dest, through, base, do_activate, version, dead_fraction)
        # The log's closed segments keep each document's last write only: every version, folded or not, replays
        # the same documents from it (index_format.change_log), and the log stops growing with rewrites.
        summary.change_log = dict(open_change_log(root).compact().__dict__)
        return summary


def _fold(dest: Target, through: int | None, base: str | None, do_activate: bool, version: str | None,
          dead_fraction: float) -> FoldSummary:
    import ray

    from .build import clear_work_area, ensure_ray, work_area
    from .shard_tasks import merge_bm25, merge_bm25_returned

    t_start = time.perf_counter()
    seconds: dict[str, float] = {}
    root = dest.root
    base = base or dest.active_at_start[0]
    if base is None:
        raise IndexMismatch(f"{root} has no active version to fold the change log into; build one first")
    # A root in object storage: only the base's own files come to this node; its shards are fetched by the tasks that
    # fold them, each on its node.
    base_dir = version_dir(root, base, shards=None if dest.remote is None else ())
    manifest = read_version_manifest(base_dir)
    key = f"fold-{base}-{time.time_ns()}"
    staging = staging_dir(dest.local, key)
    work = staging / "_work"
    # A fold that died (killed, or failed) left its staging folder; this one holds the root's build lock, so no
    # other fold is writing any: they are removed (a fold has nothing to resume: it starts from its base again).
    for stale in staging.parent.glob("fold-*") if staging.parent.is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)
    (staging / "shards").mkdir(parents=True)
    ensure_ray()
    seconds["start"] = time.perf_counter() - t_start

    # Each worker writes a shard with SHARD_THREADS threads: as many workers as that leaves CPUs for.
    cpus = int(ray.cluster_resources().get("CPU", 1))
    workers = fold_workers(max(1, min(manifest.num_shards, cpus // SHARD_THREADS)))
    t = time.perf_counter()
    prepared = ray.get(workers[0].prepare.remote(
        absolute_root(root), str(work), manifest.log_seq, through, manifest.num_shards, manifest.build_config,
        EncoderSpec.of(manifest), {n: e.spec for n, e in manifest.encoders.items()}))
    seconds["read+embed"] = time.perf_counter() - t
    summary = FoldSummary(None, base, prepared["log_seq"], prepared["upserted"], prepared["deleted"])
    if prepared["log_seq"] == manifest.log_seq:
        shutil.rmtree(staging, ignore_errors=True)
        summary.log_seq = manifest.log_seq
        return summary

    t = time.perf_counter()
    build_key = key
    if dest.remote is None:
        results = _fold_here(workers, manifest, prepared["touched"], base_dir, staging, work, build_key, dead_fraction,
                             summary)
    else:
        results = _fold_spread(dest, base, manifest, prepared["touched"], work, key, dead_fraction, summary)
    summary.rebuilt_faiss = [manifest.shards[s] for s, r in results.items() if r["rebuilt_faiss"]]
    summary.shard_seconds = {manifest.shards[s]: {k: round(v, 3) for k, v in r["seconds"].items()}
                             for s, r in sorted(results.items())}
    summary.nodes = {manifest.shards[s]: r["node"] for s, r in sorted(results.items()) if "node" in r}
    seconds["shards"] = time.perf_counter() - t

    t = time.perf_counter()
    if dest.remote is None:
        shard_dirs = [staging / "shards" / shard for shard in manifest.shards]
        bm25 = merge_bm25(str(staging), [str(d) for d in shard_dirs], manifest.bm25["k1"], manifest.bm25["b"])
        counts = [read_shard_manifest(d).counts for d in shard_dirs]
    else:  # each folded shard's statistics came back from its task; the others' are the base's, read from the store
        stats = {s: (r["lucene"], r["terms"], r["counts"]) for s, r in results.items()} | _base_statistics(
            dest.remote, base, manifest, set(results))
        order = range(manifest.num_shards)
        bm25 = merge_bm25_returned(str(staging), [stats[s][0] for s in order], manifest.bm25["k1"],
                                   manifest.bm25["b"], *[stats[s][1] for s in order])
        counts = [stats[s][2] for s in order]
    name = version or f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-fold{prepared['log_seq']}"
    body = manifest.model_copy(update={
        "version": name, "build_key": build_key, "created": now_iso(), "code_version": code_version(),
        "corpus": {"format": "fold", "base": base, "log_seq": prepared["log_seq"],
                   "upserted": prepared["upserted"], "deleted": prepared["deleted"]},
        "counts": {"docs": sum(c["docs"] for c in counts), "chunks": sum(c["chunks"] for c in counts),
                   "bad_records": 0},
        "bm25": {"k1": manifest.bm25["k1"], "b": manifest.bm25["b"]} | bm25,
        "reuse": {"shards_linked": summary.shards_linked, "folded_from": base},
        "log_seq": prepared["log_seq"]})
    write_json_atomic(staging / MANIFEST, VersionManifest(**body.model_dump()).model_dump(mode="json"))
    if dest.remote is None:
        verify_version(staging, checksums=False)  # the counts add up; written files were checksummed as written
    elif sum(c["chunks"] for c in counts) != body.counts["chunks"]:
        raise IndexMismatch(f"{name}: its shards hold {sum(c['chunks'] for c in counts)} chunks, its manifest says "
                            f"{body.counts['chunks']}")
    shutil.rmtree(work)
    uploads = [] if dest.remote is None else [r["upload"] for r in results.values()] + [
        {"files": _base_files(dest.remote, base, [sh for s, sh in enumerate(manifest.shards) if s not in results]),
         "bytes_uploaded": 0, "seconds": 0.0}]
    _, summary.upload = dest.publish_version(staging, name, uploads, activate=do_activate, by="fold")
    if dest.remote is not None:
        clear_work_area(dest, work_area(dest, key))
    summary.version, summary.activated = name, do_activate
    seconds["publish"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t_start
    summary.seconds = {k: round(v, 3) for k, v in seconds.items()}
    return summary


def _fold_here(workers: list, manifest: VersionManifest, touched: dict, base_dir: Path, staging: Path, work: Path,
               build_key: str, dead_fraction: float, summary: FoldSummary) -> dict[int, dict]:
    """A local root: each touched shard folded by the fold workers on this node (its folder is here); an untouched
    one linked whole, its manifest as it was."""
    import ray

    refs = {}
    for s, shard in enumerate(manifest.shards):
        target = staging / "shards" / shard
        if s in touched:
            worker = workers[len(refs) % len(workers)]
            refs[s] = worker.shard.remote(str(base_dir / "shards" / shard), str(target), str(work / f"shard-{s:06d}"),
                                          build_key, manifest.build_config, dead_fraction)
            summary.shards_changed.append(shard)
        else:
            target.mkdir(parents=True)
            link_shard(base_dir / "shards" / shard, target)
            shutil.copy2(base_dir / "shards" / shard / MANIFEST, target / MANIFEST)
            summary.shards_linked.append(shard)
    return {s: ray.get(ref) for s, ref in refs.items()}


def _fold_spread(dest: Target, base: str, manifest: VersionManifest, touched: dict, work: Path, key: str,
                 dead_fraction: float, summary: FoldSummary) -> dict[int, dict]:
    """A root in object storage: each touched shard's part of the change put in the fold's work area there, and each
    touched shard folded by a Ray Data task on any node (``fold_stored_shard``). An untouched shard is the base's: its
    files are referenced, never moved."""
    import ray
    import ray.data

    from index_format.store import open_store

    from .build import work_area

    work_at = work_area(dest, key)
    store = open_store(work_at)
    for s in touched:
        part = work / f"shard-{s:06d}"
        for path in sorted(part.rglob("*")):
            if path.is_file():
                store.upload(path, f"shard-{s:06d}/{path.relative_to(part).as_posix()}")
    summary.shards_changed = [manifest.shards[s] for s in sorted(touched)]
    summary.shards_linked = [shard for s, shard in enumerate(manifest.shards) if s not in touched]
    ds = ray.data.from_items([{"shard": s} for s in sorted(touched)], override_num_blocks=len(touched))
    # No CPU reserved, as the fold workers reserve none: a fold runs beside the service that started it, whose
    # replicas may hold every CPU of the cluster; a task that waited for a whole CPU would wait for ever.
    ds = ds.map(fold_stored_shard, num_cpus=0, fn_kwargs={
        "root": dest.remote.url, "base": base, "shards": list(manifest.shards), "work_at": work_at, "key": key,
        "build_config": manifest.build_config, "dead_fraction": dead_fraction, "expect": manifest.shard_expect(),
        "home": ray.get_runtime_context().get_node_id()})
    return {row["shard"]: pickle.loads(row["result"]) for row in ds.take_all()}


def fold_stored_shard(row: dict, root: str, base: str, shards: list[str], work_at: str, key: str, build_config: dict,
                      dead_fraction: float, expect: dict, home: str) -> dict:
    """Ray Data ``map``, on any node: one shard of a root in object storage folded. Its base shard fetched into the
    node's cache, its part of the change read from the work area, ``fold_shard`` into the node's staging folder, the
    shard verified and uploaded. Returns (pickled) the fold's result with the shard's counts, Lucene statistics, term
    tables and upload. A node other than the driver's (``home``) keeps nothing of it."""
    import ray

    from index_format.object_root import ObjectRoot
    from index_format.store import open_store

    from .shard_tasks import upload_shard, verify_shard_files

    s = row["shard"]
    at = ObjectRoot(root)
    base_dir, _ = at.fetch(base, [shards[s]])
    staging = at.local_root() / "staging" / key
    part = staging / "_work" / f"shard-{s:06d}"
    store = open_store(work_at)
    for stored in store.list(f"shard-{s:06d}/"):
        path = part / stored.split("/", 1)[1]
        path.parent.mkdir(parents=True, exist_ok=True)
        store.download(stored, path)
    target = staging / "shards" / shards[s]
    result = fold_shard(str(base_dir / "shards" / shards[s]), str(target), str(part), key, build_config, dead_fraction)
    checked, terms = verify_shard_files(str(target), expect)
    node = ray.get_runtime_context().get_node_id()
    result |= {"counts": checked["counts"], "lucene": checked["lucene"], "terms": terms,
               "upload": upload_shard(str(target), root), "node": node}
    shutil.rmtree(part, ignore_errors=True)
    if node != home:
        shutil.rmtree(target, ignore_errors=True)
    return {"shard": s, "result": pickle.dumps(result)}


def _base_statistics(remote, base: str, manifest: VersionManifest, skip: set[int]) -> dict[int, tuple]:
    """(Lucene statistics, term tables, counts) of each base shard not in ``skip``, from its manifest and term files
    in the store (the bytes of the statistics only)."""
    import io

    files = remote.files(base)

    def blob(rel: str) -> bytes:
        return remote.store.get(f"blobs/{files[rel]['sha256']}")

    out = {}
    for s, name in enumerate(manifest.shards):
        if s in skip:
            continue
        m = ShardManifest.model_validate_json(blob(f"shards/{name}/{MANIFEST}"))
        terms = {field: pq.read_table(io.BytesIO(blob(f"shards/{name}/{terms_file(field)}")))
                 for field in [CONTENTS_FIELD, *m.lucene.get("fields", {})]}
        out[s] = (m.lucene, terms, m.counts)
    return out


def _base_files(remote, base: str, names: list[str]) -> dict[str, dict]:
    """The file table entries of the base's shards ``names``: the new version references them as they are."""
    prefixes = tuple(f"shards/{n}/" for n in names)
    return {rel: f for rel, f in remote.files(base).items() if prefixes and rel.startswith(prefixes)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m index_build.fold",
        description="Fold the documents written through the API (the index root's change log) into a new version: "
                    "only the shards they touch are changed (Lucene updated in place, FAISS appended where "
                    "approximate), the rest linked; the version is published and activated, and serving replicas "
                    "then drop what it holds from their fresh segments.")
    p.add_argument("--index", required=True, help="Index root: the folder holding versions/ and changes/, or "
                   "s3://bucket/prefix (its change log then in the store beside the versions).")
    p.add_argument("--through", type=int, default=None, help="Fold the writes up to this sequence number only "
                   "(default: all of them).")
    p.add_argument("--base", default=None, help="Version to fold into (default: the active one).")
    p.add_argument("--version", default=None, help="Name of the new version (default: a timestamp and the seq).")
    p.add_argument("--no-activate", action="store_true", help="Publish the version without making it active.")
    p.add_argument("--json", action="store_true", help="Print the summary as JSON.")
    p.add_argument("--summary-json", type=Path, metavar="FILE", help="Also write the summary to FILE as JSON (what "
                   "a fold started through the API reports).")
    args = p.parse_args(argv)
    configure_process()
    from .build import shutdown_ray

    try:
        summary = fold(args.index, args.through, args.base, not args.no_activate, args.version)
    except IndexMismatch as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        shutdown_ray()
    print(json.dumps(summary.as_dict(), indent=2) if args.json else summary.render())
    if args.summary_json is not None:
        args.summary_json.write_text(json.dumps(summary.as_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
