"""The work of one shard, each step a Ray task or actor that reads and writes the shard's own files.

Every step of a shard runs on one node: ``assemble_shard`` runs wherever Ray puts it and returns its node's id,
and the build pins every later step of that shard there (``NodeAffinitySchedulingStrategy``, hard), so no step
reads a file a task on another node wrote. The driver of a build only passes folder names, keys and small results between these steps; no document, chunk text or vector of the corpus passes through it:

1. ``assemble_shard``: the shard's fragments (Parquet files the read's Ray Data pipeline wrote in the store of the
   root, ``read``; a delta's: files in the work folder on the driver's node) put together in corpus order, a repeated id dropped
   and reported, ``documents.parquet`` and ``chunks.parquet`` written; then what can be reused from earlier
   versions (the whole shard, or the vector of each chunk whose text was embedded before; a root in object
   storage: fetched into this node's cache first), and the rows still to embed written to the work folder in
   blocks. Returns how many rows its fragments held, which the driver checks against the read tasks' counts.
2. The embedding (``embedding``, a Ray Data pipeline with an actor pool, not a task of this module): the rows to
   embed read from the work area, their vectors written back there.
3. ``finish_dense``: the stored and the new vectors into ``embeddings.npy``, then the FAISS index.
4. ``build_lucene_shard``: the BM25 index and the shard's term statistics, from ``chunks.parquet``.
5. ``commit_shard``: counts checked, checksums taken, the manifest written: the shard is committed. For a root
   in object storage the same task then uploads the shard's files (``upload_shard``), from the node that built
   them, so the driver publishes only the top-level files.
6. ``verify_shard_files``: every file against its checksum; returns the counts, the Lucene statistics and the
   term table, from which ``merge_bm25_returned`` (on the driver's node) writes the corpus-wide statistics.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from index_format.chunk_table import write_arrow_table
from index_format.lucene import CONTENTS_FIELD
from index_format.manifest import (
    CHUNKS_FILE,
    DOCUMENTS_FILE,
    EMBEDDINGS_FILE,
    FAISS_FILE,
    LUCENE_DIR,
    MANIFEST,
    TERMS_FILE,
    IndexMismatch,
    ShardManifest,
    checksum_tree,
    code_version,
    counts_agree,
    now_iso,
    read_shard_manifest,
    sha256_file,
    terms_file,
    verify_shard,
    write_json_atomic,
)
from index_format.sharding import shard_of

from .faiss_index import FaissSpec
from .tables import CHUNK_SCHEMA, DOCUMENT_SCHEMA, RowGroupWriter, contents_of

REUSED_FILE, REUSED_ROWS_FILE = "reused.npy", "reused_rows.npy"


def work_dir(work: Path, shard_name: str) -> Path:
    return Path(work) / "shards" / shard_name


def _committed(folder: Path, build_key: str) -> ShardManifest | None:
    """The shard's manifest when an interrupted run of this very build committed it (files verified)."""
    if not (folder / MANIFEST).is_file():
        return None
    try:
        return verify_shard(folder, expect={"build_key": build_key})
    except IndexMismatch as e:
        print(f"rebuilding {folder.name}: {e}")
        return None


def _fragment_tables(root: str, keys: list[str]):
    """(documents, chunks) of each of the shard's fragments (``keys`` in the store at ``root``, sorted by their first
    rows), one in memory at a time; fragments whose rows interleave (a delta's new documents, found by the tasks of
    several base shards; Ray Data handing one write task rows of several read tasks) read together and sorted."""
    from index_format.store import open_store

    from .splits import fragment_range, read_fragment

    store = open_store(root)
    order = [("split", "ascending"), ("position", "ascending")]
    for group in _overlapping(keys, [fragment_range(k) for k in keys]):
        if len(group) == 1:
            yield read_fragment(store, group[0])
            continue
        tables = [read_fragment(store, key) for key in group]
        yield (pa.concat_tables([d for d, _ in tables]).sort_by(order),
               pa.concat_tables([c for _, c in tables]).sort_by([*order, ("chunk_index", "ascending")]))


def _overlapping(keys: list[str], ranges: list[tuple]) -> list[list[str]]:
    """``keys`` (sorted by the first row of their ``ranges``) in runs whose row ranges overlap."""
    groups: list[list[str]] = []
    end = None
    for key, (first, last) in zip(keys, ranges, strict=True):
        if groups and first <= end:
            groups[-1].append(key)
            end = max(end, last)
        else:
            groups.append([key])
            end = last
    return groups


def _write_tables(shard: int, num_shards: int, fragments, folder: Path | None, strict: bool,
                  received: dict[str, int]) -> tuple[int, int, list[tuple[int, int, str, int, str]]]:
    """Stream the fragments ((documents, chunks) tables, ``_fragment_tables``) into the shard's two tables
    (``folder`` None: only find the duplicates, and count no chunks); ``received`` counts the rows the fragments
    held. Returns (documents, chunks, duplicates as (split, position, file, line, reason))."""
    from .corpus import CorpusError

    first_seen: dict[str, tuple[int, int, str]] = {}  # doc id -> (split, position, source) of its first record
    bad: list[tuple[int, int, str, int, str]] = []
    docs = chunks = 0
    writers = (RowGroupWriter(folder / DOCUMENTS_FILE, DOCUMENT_SCHEMA),
               RowGroupWriter(folder / CHUNKS_FILE, CHUNK_SCHEMA)) if folder is not None else None
    try:
        for table, chunk_table in fragments:
            received["docs"] += table.num_rows
            received["chunks"] += chunk_table.num_rows
            ids, sources = table["doc_id"].to_pylist(), table["source"].to_pylist()
            splits, positions = table["split"].to_pylist(), table["position"].to_pylist()
            keep, dropped = [], set()
            for doc_id, source, split, position in zip(ids, sources, splits, positions, strict=True):
                if shard_of(doc_id, num_shards) != shard:
                    raise IndexMismatch(f"document {doc_id!r} reached shard {shard} but hashes to another")
                first = first_seen.setdefault(doc_id, (split, position, source))
                if first[:2] == (split, position):
                    keep.append(True)
                    continue
                keep.append(False)
                dropped.add((split, position))
                file, _, line = source.rpartition(":")
                reason = f"duplicate id {doc_id!r} (first seen at {first[2]}); kept the first"
                if strict:
                    raise CorpusError(f"{source}: {reason} (strict mode; drop --strict to skip and count bad records)")
                bad.append((split, position, file, int(line) if line.isdigit() else 0, reason))
            docs += sum(keep)
            if writers is None:
                continue
            writers[0].write(table.filter(pa.array(keep)) if dropped else table)
            if dropped:
                gone = [s * 2**40 + p for s, p in dropped]  # (split, position) as one integer: lines < 2**40
                at = pc.add(pc.multiply(chunk_table["split"].cast(pa.int64()), 2**40), chunk_table["position"])
                chunk_table = chunk_table.filter(pc.invert(pc.is_in(at, pa.array(gone, pa.int64()))))
            writers[1].write(chunk_table)
            chunks += chunk_table.num_rows
    finally:
        if writers is not None:
            for w in writers:
                w.close()
    return docs, chunks, bad


def _text_keys(folder: Path, prepend_title: bool):
    """The text key of every row of a shard's chunk table, in row order, read a batch at a time."""
    from .reuse import text_key

    pf = pq.ParquetFile(Path(folder) / CHUNKS_FILE)
    for batch in pf.iter_batches(columns=["title", "text"], batch_size=8192):
        yield from (text_key(t) for t in contents_of(pa.Table.from_batches([batch]), prepend_title))


def _find_vectors(keys: list[bytes], sources: list[dict], work: Path) -> tuple[int, dict[str, int], int, list[int]]:
    """The stored vector of every row whose text a source version embedded, gathered into the work folder.
    Sources are searched in order (the active version first), each shard's rows in order; the first
    holder of a text gives its vector. Holds this shard's keys, never a source's. Returns (rows reused,
    version -> rows taken from it, dimension, rows still to embed)."""
    needed: dict[bytes, list[int]] = {}
    for row, key in enumerate(keys):
        needed.setdefault(key, []).append(row)
    found: dict[tuple[int, int], tuple[list[int], list[int]]] = {}  # (source, shard) -> (rows, source rows)
    for i, source in enumerate(sources):
        for j, shard_folder in enumerate(source["shards"]):
            if not needed:
                break
            for at, key in enumerate(_text_keys(shard_folder, source["prepend_title"])):
                rows = needed.pop(key, None)
                if rows is not None:
                    mine, theirs = found.setdefault((i, j), ([], []))
                    mine.extend(rows)
                    theirs.extend([at] * len(rows))
    if not found:
        return 0, {}, 0, list(range(len(keys)))
    reused_rows: list[int] = []
    parts: list[np.ndarray] = []
    by_version: dict[str, int] = {}
    for (i, j), (mine, theirs) in found.items():
        stored = np.load(Path(sources[i]["shards"][j]) / EMBEDDINGS_FILE, mmap_mode="r")
        parts.append(np.asarray(stored[theirs], dtype=np.float32))  # one gather per stored shard
        reused_rows.extend(mine)
        by_version[sources[i]["name"]] = by_version.get(sources[i]["name"], 0) + len(mine)
    vectors = np.concatenate(parts)
    np.save(work / REUSED_FILE, vectors)
    np.save(work / REUSED_ROWS_FILE, np.asarray(reused_rows, dtype=np.int64))
    taken = set(reused_rows)
    return len(reused_rows), by_version, vectors.shape[1], [r for r in range(len(keys)) if r not in taken]


def assemble_shard(shard: int, shard_dir: str, work: str, build_key: str, num_shards: int, prepend_title: bool,
                   strict: bool, sources: list[dict] | None, content_key: dict, upload_to: str | None,
                   fragments: list[str], fragments_from: str, work_at: str, sources_from: str | None = None) -> dict:
    """Ray task: step 1 of the module. ``fragments``: the keys of this shard's fragments in the store at
    ``fragments_from`` (the root in object storage, or a local folder on this node), in corpus order; ``work_at``:
    the build's work area, where the rows to embed are written for the embedding (``embedding``). ``sources``: the versions to reuse from
    (None: reuse is off), each as ``reuse.task_sources`` gives them; ``sources_from``: the root in object storage
    they are fetched from into this node's cache (None: a local root, read where they are). A shard that needs no
    more work (committed by an interrupted run on this node, or linked whole) is uploaded here when the root is in
    object storage (``upload_to``). Returns, besides the shard's counts, ``node`` (where every later step of the
    shard must run) and ``received`` (the rows its fragments held, duplicates included)."""
    import ray

    folder, mine = Path(shard_dir), work_dir(Path(work), Path(shard_dir).name)
    tables = _fragment_tables(fragments_from, fragments)
    received = {"docs": 0, "chunks": 0}
    result = {"shard": shard, "resumed": False, "linked": None, "todo": 0, "blocks": 0, "reused": 0,
              "reused_from": {}, "dimension": 0, "node": ray.get_runtime_context().get_node_id(),
              "received": received}
    committed = _committed(folder, build_key)
    if committed is not None:  # an interrupted run of this build finished it; find its duplicates again
        _, _, bad = _write_tables(shard, num_shards, tables, None, strict, received)
        return result | {"resumed": True, "docs": committed.counts["docs"], "chunks": committed.counts["chunks"],
                         "dimension": committed.dimension, "bad": bad, "upload": upload_shard(shard_dir, upload_to)}
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(mine, ignore_errors=True)
    folder.mkdir(parents=True)
    mine.mkdir(parents=True)
    docs, chunks, bad = _write_tables(shard, num_shards, tables, folder, strict, received)
    result |= {"docs": docs, "chunks": chunks, "bad": bad}
    sources = _sources_here(sources, sources_from)
    if sources:
        from .reuse import link_shard, shard_donor_of

        donor = shard_donor_of(sources, content_key, num_shards, folder.name,
                               {name: sha256_file(folder / name) for name in (CHUNKS_FILE, DOCUMENTS_FILE)})
        if donor is not None:
            link_shard(Path(donor["folder"]) / "shards" / folder.name, folder)
            old = read_shard_manifest(Path(donor["folder"]) / "shards" / folder.name)
            write_json_atomic(folder / MANIFEST, old.model_copy(update={
                "build_key": build_key, "build_config": content_key, "code_version": code_version(),
                "created": now_iso()}).model_dump(mode="json"))  # its files are verified before publishing
            return result | {"linked": donor["name"], "reused": chunks, "reused_from": {donor["name"]: chunks},
                             "dimension": old.dimension, "upload": upload_shard(shard_dir, upload_to)}
    write_arrow_table(folder)  # the table as a replica maps it (a shard linked whole above keeps its donor's files)
    todo = list(range(chunks))
    if sources and chunks:
        reused, by_version, dimension, todo = _find_vectors(list(_text_keys(folder, prepend_title)), sources, mine)
        result |= {"reused": reused, "reused_from": by_version, "dimension": dimension}
    if todo:
        _write_todo(folder, mine, todo, prepend_title, shard, work_at)
    from .embedding import EMBED_BLOCK

    return result | {"todo": len(todo), "blocks": -(-len(todo) // EMBED_BLOCK)}


def _sources_here(sources: list[dict] | None, root: str | None) -> list[dict] | None:
    """The reuse sources with their folders on this node: a root in object storage's versions fetched into this
    node's cache (each blob downloaded once per node; nothing on the driver's node, which fetched them to plan)."""
    if not sources or root is None:
        return sources
    from index_format.object_root import ObjectRoot

    remote = ObjectRoot(root)
    here = []
    for source in sources:
        if _whole(source):  # this node holds it (the driver's, which fetched it to plan)
            here.append(source)
            continue
        folder, _ = remote.fetch(source["name"])
        here.append(source | {"folder": str(folder),
                              "shards": [str(folder / "shards" / Path(p).name) for p in source["shards"]]})
    return here


def _whole(source: dict) -> bool:
    """Every file of every shard of a reuse source is in its folder on this node."""
    try:
        return all((Path(shard) / rel).is_file() for shard in source["shards"]
                   for rel in read_shard_manifest(Path(shard)).checksums)
    except (IndexMismatch, OSError):
        return False


def _write_todo(folder: Path, mine: Path, todo: list[int], prepend_title: bool, shard: int, work_at: str) -> None:
    """The rows to embed and their contents, in blocks of EMBED_BLOCK rows (one Parquet row group each), in the work
    area ``work_at`` (uploaded there when it is not this node's folder)."""
    from index_format.store import is_remote, open_store

    from .embedding import EMBED_BLOCK, TODO_FILE, TODO_SCHEMA, todo_key

    schema = TODO_SCHEMA
    wanted = np.zeros(pq.read_metadata(folder / CHUNKS_FILE).num_rows, dtype=bool)
    wanted[todo] = True
    with RowGroupWriter(mine / TODO_FILE, schema, EMBED_BLOCK) as writer:
        at = 0
        for batch in pq.ParquetFile(folder / CHUNKS_FILE).iter_batches(columns=["title", "text"], batch_size=8192):
            rows = np.arange(at, at + batch.num_rows)
            take = wanted[at:at + batch.num_rows]
            at += batch.num_rows
            if not take.any():
                continue
            table = pa.Table.from_batches([batch]).filter(pa.array(take))
            writer.write(pa.table({"row": rows[take], "contents": contents_of(table, prepend_title)}, schema=schema))
    if is_remote(work_at):  # else ``mine`` is the work area's own folder for this shard
        open_store(work_at).upload(mine / TODO_FILE, todo_key(shard))


def finish_dense(shard_dir: str, work: str, shard: int, rows: int, dimension: int, spec: FaissSpec,
                 work_at: str) -> dict:
    """Ray task: the stored vectors (reused) and the new ones (the embedding's, in the work area ``work_at``) of a
    shard into ``embeddings.npy`` (written in place, never whole in memory twice), then its FAISS index.
    ``dimension`` is needed only for an empty shard."""
    import faiss

    from .embedding import read_vectors
    from .faiss_index import build_faiss_index, index_description, resolved_kind, search_options

    folder, mine = Path(shard_dir), Path(work)
    reused = [(np.load(mine / REUSED_ROWS_FILE), np.load(mine / REUSED_FILE, mmap_mode="r"))] \
        if (mine / REUSED_FILE).is_file() else []
    new = read_vectors(work_at, shard)  # a file at a time
    first = next(new, None)
    parts = itertools.chain(reused, [first] if first is not None else [], new)
    if reused or first is not None:  # else an empty shard: the dimension given
        dimension = (reused[0] if reused else first)[1].shape[1]
    tmp = folder / (EMBEDDINGS_FILE + ".tmp")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(rows, dimension))
    filled = 0
    for row_ids, vectors in parts:
        out[row_ids] = vectors
        filled += len(row_ids)
    if filled != rows:
        raise IndexMismatch(f"{folder.name}: {filled} vectors for {rows} chunks")
    out.flush()
    del out, parts, reused, first  # unmapped before the index is built: the process then holds the index
    os.replace(tmp, folder / EMBEDDINGS_FILE)
    t = time.perf_counter()
    index = build_faiss_index(np.load(folder / EMBEDDINGS_FILE, mmap_mode="r"), spec)
    seconds = time.perf_counter() - t
    faiss.write_index(index, str(folder / (FAISS_FILE + ".tmp")))
    os.replace(folder / (FAISS_FILE + ".tmp"), folder / FAISS_FILE)
    shutil.rmtree(mine, ignore_errors=True)
    kind = resolved_kind(spec, rows)
    return ({"type": kind} | index_description(index) | search_options(spec, kind, index)
            | {"build_s": round(seconds, 2), "dimension": dimension})


def build_lucene_shard(shard_dir: str, prepend_title: bool, heap: str, fields: tuple[str, ...] = ()) -> dict:
    """Ray task: the shard's Lucene index and term statistics, from its chunk table: ``contents`` and each of
    ``fields`` (chunk-table columns, e.g. ``title``) as a Lucene field of its own, with its own term table."""
    from index_format.lucene import (
        DOC_ROWS_FILE,
        build_lucene_index,
        field_statistics,
        index_statistics,
        lucene_doc_rows,
        write_collection,
    )

    t0 = time.perf_counter()
    folder = Path(shard_dir)
    collection, tmp_index = folder / "_collection", folder / "_lucene.tmp"
    for stale in (collection, tmp_index):
        shutil.rmtree(stale, ignore_errors=True)
    pf = pq.ParquetFile(folder / CHUNKS_FILE)

    def rows():
        for batch in pf.iter_batches(columns=["chunk_id", "title", "text"], batch_size=8192):
            table = pa.Table.from_batches([batch])
            extra = [dict(zip(fields, values, strict=True))
                     for values in zip(*[table[f].fill_null("").to_pylist() for f in fields], strict=True)] \
                if fields else [{}] * table.num_rows
            yield from zip(table["chunk_id"].to_pylist(), contents_of(table, prepend_title), extra, strict=True)

    write_collection(rows(), collection)
    build_lucene_index(collection, tmp_index, heap=heap, threads=1, fields=fields)
    stats, terms = index_statistics(tmp_index)
    pq.write_table(terms, folder / TERMS_FILE)
    if fields:
        stats["fields"] = {}
        for name in fields:
            stats["fields"][name], field_terms = field_statistics(tmp_index, name)
            pq.write_table(field_terms, folder / terms_file(name))
    chunk_ids = pq.read_table(folder / CHUNKS_FILE, columns=["chunk_id"])["chunk_id"].to_pylist()
    np.save(folder / (DOC_ROWS_FILE + ".tmp.npy"), lucene_doc_rows(tmp_index, chunk_ids))
    del chunk_ids
    shutil.rmtree(folder / LUCENE_DIR, ignore_errors=True)
    os.replace(tmp_index, folder / LUCENE_DIR)
    os.replace(folder / (DOC_ROWS_FILE + ".tmp.npy"), folder / DOC_ROWS_FILE)
    shutil.rmtree(collection)
    return {"stats": stats, "seconds": time.perf_counter() - t0}


def commit_shard(shard_dir: str, manifest: dict, faiss_info: dict, lucene_stats: dict,
                 upload_to: str | None = None) -> dict:
    """Ray task: the shard's counts checked against each other, its files' checksums taken, its manifest
    written (which commits it), then its files uploaded when the root is in object storage (``upload_to``).
    Returns the manifest's counts and what was uploaded (``upload_shard``)."""
    folder = Path(shard_dir)
    chunks = manifest["counts"]["chunks"]
    if not (faiss_info["ntotal"] == chunks == lucene_stats["documents"]):
        raise IndexMismatch(f"{folder.name}: {chunks} chunks but FAISS holds {faiss_info['ntotal']} vectors and "
                            f"Lucene {lucene_stats['documents']} documents")
    body = ShardManifest(**manifest, checksums=checksum_tree(folder), code_version=code_version(), created=now_iso())
    write_json_atomic(folder / MANIFEST, body.model_dump(mode="json"))
    return {"counts": body.counts, "upload": upload_shard(shard_dir, upload_to)}


def upload_shard(shard_dir: str, upload_to: str | None) -> dict | None:
    """A committed shard's files into the ``blobs/`` of the root at ``upload_to`` (those not there yet; None: a
    local root, nothing to do). Checks that the bytes sent are those its manifest's checksums name: a file changed
    since the commit would otherwise be published under the wrong checksum. Returns the file table under the
    version's paths (``shards/<shard>/<file>``), the bytes uploaded and the seconds."""
    if upload_to is None:
        return None
    from index_format.object_root import ObjectRoot

    t = time.perf_counter()
    folder = Path(shard_dir)
    files, sent = ObjectRoot(upload_to).upload_files(folder)
    checksums = read_shard_manifest(folder).checksums
    sent_sums = {rel: f["sha256"] for rel, f in files.items() if rel != MANIFEST}
    if sent_sums != checksums:
        changed = sorted(rel for rel in set(sent_sums) | set(checksums) if sent_sums.get(rel) != checksums.get(rel))
        raise IndexMismatch(f"{folder.name}: files changed since the shard was committed {changed[:5]}; rerun the "
                            "build (the shard is then built again)")
    return {"files": {f"shards/{folder.name}/{rel}": f for rel, f in files.items()}, "bytes_uploaded": sent,
            "seconds": time.perf_counter() - t}


def verify_shard_files(shard_dir: str, expect: dict) -> tuple[dict, dict[str, pa.Table]]:
    """Ray task (``num_returns=2``, on the shard's node): every file of a shard against its checksum. Returns its
    counts and Lucene statistics, and its term table of each Lucene field (``merge_bm25_returned`` sums them on
    the driver's node)."""
    m = verify_shard(Path(shard_dir), expect=expect)
    if not counts_agree(m.counts):
        raise IndexMismatch(f"{Path(shard_dir).name}: counts disagree: {m.counts}")
    return {"counts": m.counts, "lucene": m.lucene}, _term_tables(Path(shard_dir), m.lucene)


def _term_tables(folder: Path, lucene: dict) -> dict[str, pa.Table]:
    return {name: pq.read_table(folder / terms_file(name)) for name in [CONTENTS_FIELD, *lucene.get("fields", {})]}


def merge_bm25(staging: str, shard_dirs: list[str], k1: float, b: float) -> dict:
    """Corpus-wide BM25 statistics, summed from the shards' own (``bm25/``), read from the shard folders (one node:
    a fold)."""
    lucene = [read_shard_manifest(Path(d)).lucene for d in shard_dirs]
    return merge_bm25_returned(staging, lucene, k1, b,
                               *[_term_tables(Path(d), s) for d, s in zip(shard_dirs, lucene, strict=True)])


def merge_bm25_returned(staging: str, lucene: list[dict], k1: float, b: float, *terms: dict[str, pa.Table]) -> dict:
    """Ray task, on the driver's node (it writes ``staging/bm25``): corpus-wide BM25 statistics of each Lucene field,
    summed from each shard's Lucene statistics and term tables as ``verify_shard_files`` returned them (no shard
    folder is read). Every shard must have the same fields (they were built with one configuration)."""
    from index_format.bm25_stats import field_folder, merge_shard_stats, merge_term_tables, write_stats

    names = {tuple(t) for t in terms}
    if len(names) > 1:
        raise IndexMismatch(f"shards were indexed with different Lucene fields: {sorted(names)}")
    out: dict[str, Any] = {}
    for name in terms[0] if terms else [CONTENTS_FIELD]:
        per_shard = [s if name == CONTENTS_FIELD else s["fields"][name] | {"documents": s["documents"]}
                     for s in lucene]
        stats = merge_shard_stats(per_shard, k1, b)
        table = merge_term_tables([t[name] for t in terms])
        write_stats(field_folder(Path(staging) / "bm25", name), stats, table)
        summary = {"doc_count": stats.doc_count, "total_terms": stats.total_terms, "avgdl": stats.avgdl,
                   "unique_terms": table.num_rows}
        if name == CONTENTS_FIELD:
            out |= summary
        else:
            out.setdefault("fields", {})[name] = summary
    return out


def remove_staging(staging: str) -> None:
    """Ray task, on a node that built shards of a published version: its copy of the staging folder removed."""
    shutil.rmtree(staging, ignore_errors=True)
