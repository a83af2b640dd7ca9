"""The build job: read -> chunk -> shard -> embed (Ray Data) -> FAISS + Lucene (Ray tasks) -> publish.

The driver reads and chunks the corpus (cheap, and it must see every record to report bad ones),
then starts the Lucene indexing of every shard at once (it needs no vectors) while a Ray Data actor
pool embeds the chunks in shard order. As soon as a shard's last vector arrives its FAISS index is
built; as soon as both halves of a shard are done its manifest is written, which commits the shard.
A rerun with the same corpus and settings finds the staging folder by its build key and keeps every
committed shard whose checksums still match.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .bm25_stats import merge_shard_stats, merge_term_tables, write_stats
from .chunking import Chunk, chunk_document
from .config import BuildConfig
from .corpus import (
    BadRecord,
    CorpusError,
    Document,
    corpus_files,
    fingerprint,
    iter_documents,
    read_files_in_parallel,
    resolve_corpus_file,
)
from .faiss_index import FaissSpec
from .manifest import (
    CHUNKS_FILE,
    DOCUMENTS_FILE,
    EMBEDDINGS_FILE,
    FAISS_FILE,
    LUCENE_DIR,
    MANIFEST,
    TERMS_FILE,
    IndexMismatch,
    ShardManifest,
    VersionManifest,
    checksum_tree,
    code_version,
    now_iso,
    read_shard_manifest,
    sha256_file,
    verify_shard,
    write_json_atomic,
)
from .reuse import ReusePlan, VectorLookup, find_sources, link_shard, shard_donor
from .sharding import shard_name, shard_of
from .versions import activate, build_lock, publish, read_version_manifest, staging_dir, verify_version

CRASH_ENV = "INDEX_BUILD_CRASH_AFTER_SHARDS"  # fault injection: exit like a kill after N shard commits

DOCUMENT_SCHEMA = pa.schema([
    ("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string()), ("metadata_json", pa.string()),
    ("source", pa.string()),
])

CHUNK_SCHEMA = pa.schema([
    ("chunk_id", pa.string()), ("doc_id", pa.string()), ("chunk_index", pa.int32()),
    ("char_start", pa.int64()), ("char_end", pa.int64()), ("title", pa.string()), ("section", pa.string()),
    ("text", pa.string()), ("metadata_json", pa.string()), ("source", pa.string()),
])


@dataclass
class BuildSummary:
    version: str
    version_dir: Path
    active: bool
    docs: int
    chunks: int
    shards: int
    reused_shards: int
    bad_records: list[BadRecord]
    seconds: dict[str, float] = field(default_factory=dict)
    reuse: dict = field(default_factory=dict)  # ReusePlan.describe(): what came from earlier versions
    delta: dict = field(default_factory=dict)  # a delta build: its base, documents replaced, added, deleted

    @property
    def total_s(self) -> float:
        return self.seconds.get("total", 0.0)

    def render(self) -> str:
        t = max(self.total_s, 1e-9)
        reused = f" ({self.reused_shards} reused from an interrupted build)" if self.reused_shards else ""
        lines = [
            f"index version  {self.version}{' (active)' if self.active else ''}",
            f"location       {self.version_dir}",
            f"documents      {self.docs:,}   chunks {self.chunks:,}   shards {self.shards}{reused}",
            f"bad records    {len(self.bad_records):,} skipped" if self.bad_records else "bad records    none",
        ]
        if self.delta:
            d = self.delta
            lines.append(f"delta          on {d['base']}: {d['replaced']:,} replaced, {d['added']:,} added, "
                         f"{d['deleted']:,} deleted")
        if self.reuse:
            r = self.reuse
            linked = f"; shards linked unchanged: {len(r['shards_linked'])}" if r["shards_linked"] else ""
            origin = ", ".join(f"{n:,} from {v}" for v, n in r["reused_from"].items())
            lines.append(f"embedded       {r['chunks_embedded']:,} chunks   reused {r['chunks_reused']:,}"
                         f"{f' ({origin})' if origin else ''}{linked}")
        lines += [f"  {r}" for r in self.bad_records[:10]]
        if len(self.bad_records) > 10:
            lines.append(f"  ... and {len(self.bad_records) - 10} more (all listed in the version's bad_records.jsonl)")
        stages = "  ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items() if k != "total")
        lines.append(f"time           {self.total_s:.1f}s  ({stages})")
        lines.append(f"throughput     {self.docs / t:,.1f} docs/s   {self.chunks / t:,.1f} chunks/s")
        return "\n".join(lines)


def _progress(total: int | None, desc: str, unit: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True, leave=True)


def read_and_chunk(cfg: BuildConfig, documents: Iterable[Document | BadRecord] | None = None,
                   ) -> tuple[list[list[Chunk]], list[list[Document]], list[BadRecord]]:
    """Chunks per shard, documents per shard and the bad records, in corpus order (``documents``: another
    source than ``cfg.corpus``, such as a delta applied to a built version)."""
    chunks: list[list[Chunk]] = [[] for _ in range(cfg.shards)]
    docs: list[list[Document]] = [[] for _ in range(cfg.shards)]
    bad: list[BadRecord] = []
    if documents is None:
        documents = iter_documents(cfg.corpus, cfg.id_fields, cfg.text_fields)
    with _progress(None, "read+chunk", "doc", cfg.progress) as bar:
        for item in documents:
            bar.update(1)
            if isinstance(item, BadRecord):
                if cfg.strict:
                    raise CorpusError(f"{item} (strict mode; drop --strict to skip and count bad records)")
                bad.append(item)
                continue
            shard = shard_of(item.doc_id, cfg.shards)
            docs[shard].append(item)
            chunks[shard].extend(chunk_document(item, cfg.chunk_size, cfg.chunk_overlap))
    return chunks, docs, bad


def document_table(docs: list[Document]) -> pa.Table:
    return pa.table({
        "doc_id": [d.doc_id for d in docs], "title": [d.title for d in docs], "text": [d.text for d in docs],
        "metadata_json": [json.dumps(d.metadata, ensure_ascii=False, sort_keys=True) for d in docs],
        "source": [d.source for d in docs],
    }, schema=DOCUMENT_SCHEMA)


def chunk_table(chunks: list[Chunk]) -> pa.Table:
    return pa.table(
        {
            "chunk_id": [c.chunk_id for c in chunks],
            "doc_id": [c.doc_id for c in chunks],
            "chunk_index": [c.chunk_index for c in chunks],
            "char_start": [c.char_start for c in chunks],
            "char_end": [c.char_end for c in chunks],
            "title": [c.title for c in chunks],
            "section": [c.section for c in chunks],
            "text": [c.text for c in chunks],
            "metadata_json": [json.dumps(c.metadata, ensure_ascii=False, sort_keys=True) for c in chunks],
            "source": [c.source for c in chunks],
        },
        schema=CHUNK_SCHEMA,
    )


def contents_of(table: pa.Table, prepend_title: bool) -> list[str]:
    """The text BM25 and the encoder see for each row of a chunk table (see ``Chunk.contents``)."""
    titles, texts = table["title"].to_pylist(), table["text"].to_pylist()
    if not prepend_title:
        return [text or title for title, text in zip(titles, texts, strict=True)]
    return [
        (f"{title}\n{text}" if text else title) if title else text for title, text in zip(titles, texts, strict=True)
    ]


# ---------------------------------------------------------------- Ray side: tasks and the embedding actor


class EmbedBatch:
    """Ray Data actor: loads the encoder once, embeds each batch of chunk contents."""

    def __init__(self, encoder: str, device: str, batch_size: int, threads: int):
        if threads:
            import torch

            torch.set_num_threads(threads)
        from .encoders import load_encoder

        self.encoder = load_encoder(encoder, device)
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        vectors = self.encoder.encode([str(t) for t in batch["contents"]], self.batch_size)
        return {"shard": batch["shard"], "row": batch["row"], "embedding": vectors}


def _build_lucene_shard(shard_dir: str, prepend_title: bool, heap: str) -> dict:
    from .lucene import build_lucene_index, index_statistics, write_collection

    t0 = time.perf_counter()
    folder = Path(shard_dir)
    table = pq.read_table(folder / CHUNKS_FILE, columns=["chunk_id", "title", "text"])
    collection, tmp_index = folder / "_collection", folder / "_lucene.tmp"
    for stale in (collection, tmp_index):
        shutil.rmtree(stale, ignore_errors=True)
    write_collection(zip(table["chunk_id"].to_pylist(), contents_of(table, prepend_title), strict=True), collection)
    build_lucene_index(collection, tmp_index, heap=heap, threads=1)
    stats, terms = index_statistics(tmp_index)
    pq.write_table(terms, folder / TERMS_FILE)
    shutil.rmtree(folder / LUCENE_DIR, ignore_errors=True)
    os.replace(tmp_index, folder / LUCENE_DIR)
    shutil.rmtree(collection)
    return {"stats": stats, "seconds": time.perf_counter() - t0}


def _build_faiss_shard(shard_dir: str, spec: FaissSpec) -> dict:
    import faiss

    from .faiss_index import build_faiss_index, index_description

    folder = Path(shard_dir)
    index = build_faiss_index(np.load(folder / EMBEDDINGS_FILE), spec)
    faiss.write_index(index, str(folder / (FAISS_FILE + ".tmp")))
    os.replace(folder / (FAISS_FILE + ".tmp"), folder / FAISS_FILE)
    return index_description(index)


def ensure_ray() -> None:
    """Join the cluster in RAY_ADDRESS, or start a local Ray sized for this machine."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        return
    # A bounded object store: the JVMs and the models share this machine's memory with it.
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, object_store_memory=512 * 2**20,
             log_to_driver=False, configure_logging=False)


# ---------------------------------------------------------------- the job


def _reusable(folder: Path, build_key: str) -> bool:
    if not (folder / MANIFEST).is_file():
        return False
    try:
        verify_shard(folder, expect={"build_key": build_key})
        return True
    except IndexMismatch as e:
        print(f"rebuilding {folder.name}: {e}")
        return False


def build_index(cfg: BuildConfig) -> BuildSummary:
    """Build, verify, publish and (by default) activate one version of ``cfg.corpus`` under ``cfg.out``;
    one build at a time per root."""
    with build_lock(Path(cfg.out)):
        return _build_index(cfg)


def _corpus(cfg: BuildConfig) -> tuple[dict, str, Iterable[Document | BadRecord] | None, dict]:
    """(what the version's manifest records as its corpus, its fingerprint, the documents when they are not
    simply the corpus file's, what a delta did)."""
    if not cfg.is_delta:
        files = corpus_files(cfg.corpus)
        if len(files) == 1:
            sha = fingerprint(files[0])
            return ({"path": str(files[0].resolve()), "sha256": sha, "format": files[0].suffix.lstrip(".")}, sha,
                    None, {})
        ensure_ray()
        documents, shas = read_files_in_parallel(files, cfg.id_fields, cfg.text_fields)
        sha = hashlib.sha256(json.dumps(shas, sort_keys=True).encode()).hexdigest()
        return ({"path": str(Path(cfg.corpus).resolve()) if Path(cfg.corpus).exists() else str(cfg.corpus),
                 "files": shas, "sha256": sha, "format": "files"}, sha, documents, {})
    from .delta import delta_documents
    from .versions import active_version, versions_dir

    root = Path(cfg.reuse_from or cfg.out)
    base = cfg.base or active_version(root)
    if base is None or not (versions_dir(root) / base / MANIFEST).is_file():
        raise IndexMismatch(f"no version {base!r} under {root} to apply the delta to" if base else
                            f"{root} has no active version to apply the delta to; name one with --base")
    base_manifest = read_version_manifest(versions_dir(root) / base)
    parts = {"base": base, "base_build_key": base_manifest.build_key}
    for name in ("changes", "deletes"):
        path = getattr(cfg, name)
        if path is not None:
            path = resolve_corpus_file(path) if name == "changes" else Path(path)
            if not path.is_file():
                raise CorpusError(f"--{name} {path}: no such file")
            parts[name] = {"path": str(path.resolve()), "sha256": fingerprint(path)}
    sha = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    report: dict = {}
    documents = delta_documents(versions_dir(root) / base, cfg.changes, cfg.deletes, cfg.id_fields,
                                cfg.text_fields, report)
    return {"delta": parts, "sha256": sha, "format": "delta"}, sha, documents, report


def _build_index(cfg: BuildConfig) -> BuildSummary:
    t_start = time.perf_counter()
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    corpus_record, corpus_sha, documents, delta = _corpus(cfg)
    if corpus_record.get("format") == "files":
        seconds[f"read {len(corpus_record['files'])} files in parallel"] = time.perf_counter() - t
    build_key = cfg.build_key(corpus_sha)
    root = Path(cfg.out)
    staging = staging_dir(root, build_key)
    (staging / "shards").mkdir(parents=True, exist_ok=True)
    write_json_atomic(staging / "build.json", {"build_key": build_key, "config": cfg.model_dump(mode="json")})

    t = time.perf_counter()
    chunks, docs, bad = read_and_chunk(cfg, documents)
    docs_per_shard = [len(d) for d in docs]
    seconds["read+chunk"] = time.perf_counter() - t
    total_docs, total_chunks = sum(docs_per_shard), sum(len(c) for c in chunks)
    if total_chunks == 0:
        raise CorpusError(f"{cfg.corpus or cfg.changes or cfg.deletes}: no valid documents ({len(bad)} bad records); "
                          "nothing to index")
    with open(staging / "bad_records.jsonl", "w") as f:
        for r in bad:
            f.write(json.dumps({"file": r.file, "line": r.line, "reason": r.reason}) + "\n")

    shard_dirs = [staging / "shards" / shard_name(s) for s in range(cfg.shards)]
    todo = [s for s in range(cfg.shards) if not _reusable(shard_dirs[s], build_key)]
    reused = cfg.shards - len(todo)
    tables: dict[int, pa.Table] = {}
    for s in todo:
        shutil.rmtree(shard_dirs[s], ignore_errors=True)
        shard_dirs[s].mkdir(parents=True)
        tables[s] = chunk_table(chunks[s])
        pq.write_table(tables[s], shard_dirs[s] / CHUNKS_FILE)
        pq.write_table(document_table(docs[s]), shard_dirs[s] / DOCUMENTS_FILE)
    del chunks, docs

    t = time.perf_counter()
    plan, prefilled = ReusePlan(), {}
    if cfg.reuse and todo:
        todo, prefilled, plan = _plan_reuse(cfg, build_key, todo, tables, shard_dirs)
    seconds["reuse"] = time.perf_counter() - t

    t = time.perf_counter()
    dimension, lucene_seconds = _build_shards(cfg, build_key, todo, tables, shard_dirs, docs_per_shard, prefilled)
    plan.vectors_embedded = sum(len(prefilled[s][1]) if s in prefilled else tables[s].num_rows for s in todo)
    seconds["embed+index"] = time.perf_counter() - t
    seconds["lucene (sum of shard tasks)"] = lucene_seconds

    t = time.perf_counter()
    manifests = [read_shard_manifest(d) for d in shard_dirs]
    dimension = dimension or manifests[0].dimension
    stats = merge_shard_stats([m.lucene for m in manifests], cfg.bm25_k1, cfg.bm25_b)
    terms = merge_term_tables([pq.read_table(d / TERMS_FILE) for d in shard_dirs])
    write_stats(staging / "bm25", stats, terms)
    _verify_partition(shard_dirs, manifests, total_chunks)
    name = cfg.version or f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{build_key[:8]}"
    manifest = VersionManifest(
        version=name,
        build_key=build_key,
        created=now_iso(),
        corpus=corpus_record,
        encoder=cfg.encoder,
        dimension=dimension,
        metric="inner_product",
        num_shards=cfg.shards,
        shards=[d.name for d in shard_dirs],
        counts={"docs": total_docs, "chunks": total_chunks, "bad_records": len(bad)},
        bm25={"k1": cfg.bm25_k1, "b": cfg.bm25_b, "doc_count": stats.doc_count, "total_terms": stats.total_terms,
              "avgdl": stats.avgdl, "unique_terms": terms.num_rows},
        build_config=cfg.content_key(),
        code_version=code_version(),
        reuse=plan.describe() if cfg.reuse else None,
    )
    write_json_atomic(staging / MANIFEST, manifest.model_dump(mode="json"))
    verify_version(staging)  # every file against its checksum, the counts: before anyone can see the version
    version_dir = publish(staging, root, name)
    if cfg.activate:
        activate(root, name, by="index_build", verify=False)  # verified just above
    seconds["publish"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t_start
    return BuildSummary(name, version_dir, cfg.activate, total_docs, total_chunks, cfg.shards, reused, bad, seconds,
                        plan.describe() if cfg.reuse else {}, delta)


def _plan_reuse(cfg: BuildConfig, build_key: str, todo: list[int], tables: dict[int, pa.Table],
                shard_dirs: list[Path]):
    """Link the shards that are unchanged in an earlier version; for the others, the stored vectors of every
    chunk whose text was embedded before. Returns (shards still to build, shard -> (vectors or None, rows
    to embed), the plan)."""
    root = Path(cfg.reuse_from or cfg.out)
    plan = ReusePlan(sources=find_sources(root, cfg.encoder, cfg.chunk_size, cfg.chunk_overlap))
    if not plan.sources:
        return todo, {}, plan
    content_key = cfg.content_key()
    left = []
    for s in todo:
        donor = shard_donor(plan.sources, content_key, cfg.shards, shard_dirs[s].name,
                            {name: sha256_file(shard_dirs[s] / name) for name in (CHUNKS_FILE, DOCUMENTS_FILE)})
        if donor is None:
            left.append(s)
            continue
        source = donor.folder / "shards" / shard_dirs[s].name
        link_shard(source, shard_dirs[s])
        old = read_shard_manifest(source)
        write_json_atomic(shard_dirs[s] / MANIFEST, old.model_copy(update={
            "build_key": build_key, "build_config": content_key, "code_version": code_version(),
            "created": now_iso()}).model_dump(mode="json"))  # its files are checked by verify_version below
        plan.shards[s] = donor.name
        plan.vectors_reused += tables[s].num_rows
        plan.vectors_from[donor.name] = plan.vectors_from.get(donor.name, 0) + tables[s].num_rows
    prefilled = {}
    if left:
        lookup = VectorLookup(plan.sources)
        prefilled = {s: lookup.take(contents_of(tables[s], cfg.prepend_title), plan) for s in left}
    return left, prefilled, plan


def _build_shards(
    cfg: BuildConfig, build_key: str, todo: list[int], tables: dict[int, pa.Table], shard_dirs: list[Path],
    docs_per_shard: list[int], prefilled: dict[int, tuple[np.ndarray | None, list[int]]] | None = None,
) -> tuple[int, float]:
    """Embed and index the shards in ``todo``; returns the embedding dimension (0 if nothing was built)
    and the summed seconds of the Lucene shard tasks. ``prefilled``: per shard, vectors already known
    (reused) and the rows that still need embedding."""
    prefilled = prefilled or {}
    if not todo:
        return 0, 0.0
    ensure_ray()
    import ray
    import ray.data

    from .encoders import resolve_device

    device = resolve_device(cfg.device.value) if not cfg.encoder.startswith("hashing:") else "cpu"
    gpus = int(ray.cluster_resources().get("GPU", 0))
    faiss_gpu = gpus > 0 and cfg.device.value != "cpu"
    spec = FaissSpec(cfg.faiss_index.value, cfg.hnsw_m, cfg.hnsw_ef_construction, cfg.ivf_nlist,
                     cfg.device.value if faiss_gpu else "cpu")
    # An indexing JVM keeps about one core busy. Lucene builds start at once (they need no vectors)
    # but only on the CPUs the embedding actors leave free, topped up as they finish.
    lucene_task = ray.remote(num_cpus=1)(_build_lucene_shard)
    faiss_task = ray.remote(num_cpus=0.25, num_gpus=1 if faiss_gpu else 0)(_build_faiss_shard)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    slots = {"lucene": max(1, cpus - (0 if device == "cuda" else cfg.embed_actors))}
    lucene_queue = list(todo)
    pending: dict[ray.ObjectRef, tuple[int, str]] = {}

    def top_up_lucene() -> None:
        refs = [ref for ref, (_, part) in pending.items() if part == "lucene"]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False) if refs else ([], [])
        running = len(refs) - len(ready)
        while lucene_queue and running < slots["lucene"]:
            s = lucene_queue.pop(0)
            pending[lucene_task.remote(str(shard_dirs[s]), cfg.prepend_title, cfg.lucene_heap)] = (s, "lucene")
            running += 1

    top_up_lucene()

    # Embedding input in shard order, so early shards finish early and their FAISS builds overlap.
    blocks = []
    vectors: dict[int, np.ndarray] = {}
    filled = dict.fromkeys(todo, 0)
    dimension = 0
    for s in todo:
        contents = contents_of(tables[s], cfg.prepend_title)
        known, rows = prefilled.get(s, (None, list(range(len(contents)))))
        if known is not None:
            vectors[s], filled[s], dimension = known, len(contents) - len(rows), known.shape[1]
        for start in range(0, len(rows), 1024):
            part = rows[start:start + 1024]
            blocks.append(pa.table({"shard": [s] * len(part), "row": part, "contents": [contents[r] for r in part]}))
    on_gpu = device == "cuda"
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    threads = 0 if on_gpu else max(1, (os.cpu_count() or 1) // cfg.embed_actors)
    for s in todo:  # every vector reused: the shard's dense side can be built at once
        if tables[s].num_rows and filled[s] == tables[s].num_rows:
            np.save(shard_dirs[s] / EMBEDDINGS_FILE, vectors.pop(s))
            pending[faiss_task.remote(str(shard_dirs[s]), spec)] = (s, "faiss")
    ds = None if not blocks else ray.data.from_arrow(blocks).map_batches(
        EmbedBatch,
        fn_constructor_kwargs={"encoder": cfg.encoder, "device": device, "batch_size": cfg.embed_batch_size,
                               "threads": threads},
        compute=ray.data.ActorPoolStrategy(size=cfg.embed_actors),
        batch_size=cfg.embed_batch_size * 4,
        num_cpus=1,
        num_gpus=1 if on_gpu else 0,
    )
    with _progress(sum(b.num_rows for b in blocks), "embed", "chunk", cfg.progress) as bar:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy") if ds is not None else ():
            emb = np.asarray(batch["embedding"], dtype=np.float32)
            dimension = emb.shape[1]
            for s in np.unique(batch["shard"]).tolist():
                mask = batch["shard"] == s
                if s not in vectors:
                    vectors[s] = np.zeros((tables[s].num_rows, dimension), dtype=np.float32)
                vectors[s][batch["row"][mask]] = emb[mask]
                filled[s] += int(mask.sum())
                if filled[s] == tables[s].num_rows:
                    np.save(shard_dirs[s] / EMBEDDINGS_FILE, vectors.pop(s))
                    pending[faiss_task.remote(str(shard_dirs[s]), spec)] = (s, "faiss")
            bar.update(len(emb))
            top_up_lucene()
    slots["lucene"] = cpus  # the embedding actors are gone: Lucene builds may take every CPU
    for s in todo:  # a shard with no chunks never appears in the stream
        if tables[s].num_rows == 0:
            np.save(shard_dirs[s] / EMBEDDINGS_FILE, np.zeros((0, dimension), dtype=np.float32))
            pending[faiss_task.remote(str(shard_dirs[s]), spec)] = (s, "faiss")

    results: dict[int, dict[str, dict]] = {s: {} for s in todo}
    lucene_seconds = 0.0
    committed = 0
    crash_after = int(os.environ.get(CRASH_ENV, "0") or 0)
    with _progress(len(todo), "index shards", "shard", cfg.progress) as bar:
        while pending or lucene_queue:
            top_up_lucene()
            done, _ = ray.wait(list(pending), num_returns=1)
            s, part = pending.pop(done[0])
            try:
                results[s][part] = ray.get(done[0])
                if part == "lucene":
                    lucene_seconds += results[s][part]["seconds"]
            except ray.exceptions.RayTaskError as e:
                raise RuntimeError(f"{part} build of {shard_name(s)} failed: {e}") from None
            if len(results[s]) == 2:
                _commit_shard(cfg, build_key, s, shard_dirs[s], docs_per_shard[s], tables[s].num_rows, dimension,
                              results[s])
                committed += 1
                bar.update(1)
                if crash_after and committed >= crash_after:
                    print(f"{CRASH_ENV}={crash_after}: exiting after {committed} committed shard(s)", flush=True)
                    os._exit(137)
    return dimension, lucene_seconds


def _commit_shard(cfg: BuildConfig, build_key: str, shard: int, folder: Path, docs: int, chunks: int,
                  dimension: int, parts: dict[str, dict]) -> None:
    faiss_info, lucene_stats = parts["faiss"], parts["lucene"]["stats"]
    if not (faiss_info["ntotal"] == chunks == lucene_stats["documents"]):
        raise IndexMismatch(
            f"{folder.name}: {chunks} chunks but FAISS holds {faiss_info['ntotal']} vectors and Lucene "
            f"{lucene_stats['documents']} documents"
        )
    manifest = ShardManifest(
        shard=shard,
        num_shards=cfg.shards,
        build_key=build_key,
        encoder=cfg.encoder,
        dimension=dimension,
        metric="inner_product",
        faiss={"type": cfg.faiss_index.value} | faiss_info,
        counts={"docs": docs, "chunks": chunks, "faiss_vectors": faiss_info["ntotal"],
                "lucene_docs": lucene_stats["documents"]},
        lucene=lucene_stats,
        checksums=checksum_tree(folder),
        build_config=cfg.content_key(),
        code_version=code_version(),
        created=now_iso(),
    )
    write_json_atomic(folder / MANIFEST, manifest.model_dump(mode="json"))


def _verify_partition(shard_dirs: list[Path], manifests: list[ShardManifest], total_chunks: int) -> None:
    """Fail unless every chunk is in exactly one shard and the counts add up."""
    seen: set[str] = set()
    count = 0
    for folder, m in zip(shard_dirs, manifests, strict=True):
        ids = pq.read_table(folder / CHUNKS_FILE, columns=["chunk_id"])["chunk_id"].to_pylist()
        if len(ids) != m.counts["chunks"]:
            raise IndexMismatch(f"{folder.name}: {len(ids)} rows in {CHUNKS_FILE}, manifest says {m.counts['chunks']}")
        overlap = seen.intersection(ids)
        if overlap:
            raise IndexMismatch(f"{folder.name}: chunks also found in another shard: {sorted(overlap)[:5]}")
        seen.update(ids)
        count += len(ids)
    if count != total_chunks or len(seen) != total_chunks:
        raise IndexMismatch(f"shards hold {count} chunks ({len(seen)} distinct) but the corpus gave {total_chunks}")
