"""The build job: scan -> read+parse+chunk -> fragments (Ray Data) -> assemble shards (tasks) -> embed (Ray Data, an
actor pool) -> FAISS + Lucene (tasks) -> commit -> verify -> publish.

The driver plans and schedules; it never holds, nor opens, the corpus. Ray Data scans the corpus's files (each
file's fingerprint and its read splits, a task a file), reads each split, parses and chunks its records, and writes
each shard's rows once as Parquet fragments in the staging area of the root (``read``): only counts, keys and bad
records come back. One task per shard puts its fragments together in corpus order and decides what earlier versions
can give (a whole shard, or the vectors of texts embedded before), and writes the rows still to embed into the
build's work area; Ray Data's actor pool embeds them block by block, each block's vectors written back there
(``embedding``); as soon as a shard's last block is written its FAISS index is built, and its Lucene index is built
as soon as its chunk table exists. A shard is committed by its manifest. A rerun with the same corpus and settings
finds the staging folder by its build key and keeps every committed shard whose checksums still match (on the node
that committed it; a shard whose node is gone is built again).

Where each task runs (nodes share no disk; only files a task's own node wrote are read):

- the scan and the read (``read.scan_corpus``, ``read.read_corpus``; a delta's ``delta.read_delta``): a corpus (a
  changes or deletes file) in object storage on any node, and its fragments into object storage when the root is
  there too; else on the driver's node, which holds the files or the root's folder. A delta reads its base's
  documents where the root is: its blobs, from any node;
- ``assemble_shard``: a root in object storage: any node (spread); a local root: the driver's node. It returns its node's id: every later task of that shard (``finish_dense``,
  ``build_lucene_shard``, ``commit_shard``, ``verify_shard_files``) is pinned there;
- the embedding (``embedding.embed_rows``): an actor pool on any node for a root in object storage, on the driver's
  node for a local root;
- ``merge_bm25_returned``: the driver's node, from the statistics the verify tasks returned; the driver's staging
  then holds only the top-level files, which ``Target.publish`` sends (each shard task uploaded its shard).

The read's sink counts what it wrote for each shard, and the driver fails the build (``IndexMismatch``) when a shard
was assembled from other counts: a fragment lost on the way is never published as a smaller index.

The root may be in object storage (``s3://bucket/prefix``): the build then stages in this node's mirror of it,
each shard's task uploads the shard once committed, and the version is published and activated there
(``target``); nothing named by a URL is downloaded to the driver's node.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from index_format.chunking import Chunk, chunk_document
from index_format.manifest import (
    MANIFEST,
    IndexMismatch,
    VersionManifest,
    code_version,
    encoder_fields,
    now_iso,
    write_json_atomic,
)
from index_format.prompts import EncoderSpec
from index_format.sharding import shard_name, shard_of
from index_format.store import is_remote
from index_format.versions import (
    build_lock,
    open_root,
    staging_dir,
    verify_version,
)

from .config import BuildConfig
from .corpus import BadRecord, CorpusError, resolve_corpus_file
from .faiss_index import FaissSpec, spec_of_config
from .reuse import ReusePlan, find_sources, task_sources
from .splits import DEFAULT_SPLIT_BYTES, FRAGMENTS, Split
from .target import ActivationRefused, Target

if TYPE_CHECKING:
    from .delta import DeltaInput

CRASH_ENV = "INDEX_BUILD_CRASH_AFTER_SHARDS"  # fault injection: exit like a kill after N shard commits
SUMMARY_BAD_RECORDS = 100  # bad records a summary keeps in memory; all of them go to bad_records.jsonl
NODES_LOST_AT_MOST = 2  # nodes a build may lose and still resume itself; past that it fails (rerun it)


@dataclass
class BuildSummary:
    version: str
    version_dir: Path
    active: bool
    docs: int
    chunks: int
    shards: int
    reused_shards: int
    bad_records: list[BadRecord]  # the first SUMMARY_BAD_RECORDS, in corpus order
    seconds: dict[str, float] = field(default_factory=dict)
    reuse: dict = field(default_factory=dict)  # ReusePlan.describe(): what came from earlier versions
    delta: dict = field(default_factory=dict)  # a delta build: its base, documents replaced, added, deleted
    bad_count: int = 0
    read: dict = field(default_factory=dict)  # files and read tasks
    publish: dict = field(default_factory=dict)  # a root in object storage: what was uploaded (Target.publish)
    fetched: dict = field(default_factory=dict)  # versions of a root in object storage fetched to reuse or apply to
    nodes: dict = field(default_factory=dict)  # shard name -> the Ray node that assembled, embedded and indexed it
    stages: dict = field(default_factory=dict)  # stage -> its nodes, rows, bytes and seconds (``read.stage_report``)
    nodes_lost: list[str] = field(default_factory=list)  # nodes that left the cluster during the build, which resumed

    @property
    def total_s(self) -> float:
        return self.seconds.get("total", 0.0)

    def as_dict(self) -> dict:
        """The summary as JSON values (``--summary-json``; what a build job started through the API reports)."""
        return {"version": self.version, "version_dir": str(self.version_dir), "active": self.active,
                "docs": self.docs, "chunks": self.chunks, "shards": self.shards, "reused_shards": self.reused_shards,
                "bad_records": self.bad_count, "first_bad_records": [str(r) for r in self.bad_records],
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}, "reuse": self.reuse,
                "delta": self.delta, "publish": self.publish, "fetched": self.fetched, "nodes": self.nodes,
                "read": self.read, "stages": self.stages, "nodes_lost": self.nodes_lost}

    def render(self) -> str:
        t = max(self.total_s, 1e-9)
        reused = f" ({self.reused_shards} reused from an interrupted build)" if self.reused_shards else ""
        bad_count = max(self.bad_count, len(self.bad_records))
        where = (f"{self.publish['root']}/versions/{self.version}  (this node's copy: {self.version_dir})"
                 if self.publish else str(self.version_dir))
        lines = [
            f"index version  {self.version}{' (active)' if self.active else ''}",
            f"location       {where}",
            f"documents      {self.docs:,}   chunks {self.chunks:,}   shards {self.shards}{reused}",
            f"bad records    {bad_count:,} skipped" if bad_count else "bad records    none",
        ]
        if self.nodes_lost:
            lines.append(f"nodes lost     {len(self.nodes_lost)} during the build, which resumed without "
                         f"{'it' if len(self.nodes_lost) == 1 else 'them'}")
        if len(set(self.nodes.values())) > 1:
            lines.append(f"nodes          the shards were built on {len(set(self.nodes.values()))} nodes")
        if self.read:
            lines.append(f"read           {self.read['files']:,} file{'s' if self.read['files'] != 1 else ''} in "
                         f"{self.read['tasks']:,} parallel task{'s' if self.read['tasks'] != 1 else ''}")
        for name, stage in self.stages.items():
            nodes = len(stage.get("nodes") or [])
            rows = f"{stage['rows']:,} rows" if stage.get("rows") is not None else ""
            lines.append(f"  {name:<32} {rows:>16}  {stage.get('seconds') or 0:7.1f}s  on {nodes} node"
                         f"{'s' if nodes != 1 else ''}")
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
        if self.fetched:
            f = self.fetched
            lines.append(f"fetched        {', '.join(f['versions'])}: {_mb(f['bytes_downloaded'])} downloaded in "
                         f"{f['seconds']:.1f}s")
        if self.publish:
            p = self.publish
            lines.append(f"published      {p['files']:,} files, {_mb(p['bytes'])}: {_mb(p['bytes_uploaded'])} uploaded "
                         f"({_mb(p['bytes_uploaded_by_shards'])} by the shard tasks in {p['shard_upload_seconds']:.1f}s "
                         f"summed, the rest in {p['seconds']:.1f}s)")
        lines += [f"  {r}" for r in self.bad_records[:10]]
        if bad_count > 10:
            lines.append(f"  ... and {bad_count - 10:,} more (all listed in the version's bad_records.jsonl)")
        stages = "  ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items() if k != "total")
        lines.append(f"time           {self.total_s:.1f}s  ({stages})")
        lines.append(f"throughput     {self.docs / t:,.1f} docs/s   {self.chunks / t:,.1f} chunks/s")
        return "\n".join(lines)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f} MB"


def _progress(total: int | None, desc: str, unit: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True, leave=True)


def read_and_chunk(cfg: BuildConfig) -> tuple[list[list[Chunk]], list[BadRecord]]:
    """The corpus's chunks per shard and its bad records, read in this process: for benchmarks and tests
    that need the chunks themselves. The build job never calls it (its driver holds no corpus)."""
    from .corpus import corpus_files, iter_documents

    chunks: list[list[Chunk]] = [[] for _ in range(cfg.shards)]
    bad: list[BadRecord] = []
    for path in corpus_files(cfg.corpus):
        for item in iter_documents(path, cfg.id_fields, cfg.text_fields):
            if isinstance(item, BadRecord):
                bad.append(item)
            else:
                chunks[shard_of(item.doc_id, cfg.shards)].extend(chunk_document(item, cfg.chunk_size, cfg.chunk_overlap))
    return chunks, bad


def shutdown_ray() -> None:
    """Leave Ray before the process exits: Ray's own exit hook took 0.85 s more than this (a fold's wall time)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


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


def build_index(cfg: BuildConfig) -> BuildSummary:
    """Build, verify, publish and (by default) activate one version of ``cfg.corpus`` under ``cfg.out``;
    one build at a time per root (per node, for a root in object storage: see ``versions.build_lock``)."""
    cfg = cfg.with_prompts()  # what the build key, the actors and the manifest use
    # ACTIVE and its tag are read as the build starts; its publish lease is held until it ends.
    with build_lock(cfg.out), Target.open(cfg.out) as target:
        lost: list[str] = []
        while True:
            nodes: set[str] = set()
            try:
                summary = _build_index(cfg, target, nodes)
                summary.nodes_lost = lost
                return summary
            except (CorpusError, KeyboardInterrupt):
                raise
            except Exception as e:
                gone = sorted(nodes - _alive_nodes()) if nodes else []
                if target.remote is None or not gone or len(lost) + len(gone) > NODES_LOST_AT_MOST:
                    raise
                lost += gone
                # Ray Data retries what its stages lost; a shard's own tasks were pinned to the lost node. The build
                # resumes as a rerun does: shards committed on live nodes kept, the rest built again elsewhere.
                print(f"node {', '.join(n[:12] for n in gone)} left the cluster during the build "
                      f"({type(e).__name__}); resuming on the nodes left", file=sys.stderr, flush=True)


def _alive_nodes() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def _driver_node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _on(node: str | None, soft: bool = False) -> dict:
    """Ray options placing a task on ``node`` (never elsewhere; ``soft``: there if it can run there), or spreading
    such tasks when None."""
    if node is None:
        return {"scheduling_strategy": "SPREAD"}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=soft)}


NODES = "nodes.json"  # staging/_work/nodes.json: shard -> the node that built it, for a rerun to resume there


def _assemble_on(where: str | None, work: Path, shards: int) -> list[dict]:
    """Each shard's ``assemble_shard`` placement: on ``where`` when given; else (spread over the cluster) on the node
    an interrupted run built it on, when that node is still up and has room, since only that node's disk holds what
    the run committed (a shard placed elsewhere is built again)."""
    import ray

    if where is not None:
        return [_on(where)] * shards
    try:
        last = json.loads((work / NODES).read_text())
    except (FileNotFoundError, ValueError):
        last = {}
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    dealt = _deal(shards, {n["NodeID"]: n.get("Resources", {}).get("CPU", 0) for n in ray.nodes() if n.get("Alive")})
    return [_on(last[str(s)] if last.get(str(s)) in alive else dealt[s], soft=True) for s in range(shards)]


def _deal(shards: int, cpus: dict[str, float]) -> list[str | None]:
    """Shards dealt over the nodes in proportion to their CPUs (each next shard to the node with the fewest shards
    per CPU), so that a cluster builds them side by side. Ray's SPREAD strategy alone was seen to queue three
    one-CPU shard tasks on one node of three. None where no node has a CPU."""
    nodes = sorted((n for n, c in cpus.items() if c > 0), key=lambda n: (-cpus[n], n))
    if not nodes:
        return [None] * shards
    held = dict.fromkeys(nodes, 0)
    out = []
    for _ in range(shards):
        node = min(nodes, key=lambda n: (held[n] / cpus[n], nodes.index(n)))
        held[node] += 1
        out.append(node)
    return out


@dataclass
class _Fragments:
    """Each shard's fragments: their keys in corpus order in the store at ``root`` (the root in object storage, or a
    folder on the driver's node), and the documents and chunks the read counted for it."""

    keys: list[list[str]]
    counts: list[dict[str, int]]
    root: str = ""

    @classmethod
    def empty(cls, shards: int) -> _Fragments:
        return cls([[] for _ in range(shards)], [{"docs": 0, "chunks": 0} for _ in range(shards)])

    def add_counts(self, per_shard: list[dict[str, int]]) -> None:
        for mine, theirs in zip(self.counts, per_shard, strict=True):
            mine["docs"] += theirs["docs"]
            mine["chunks"] += theirs["chunks"]

    def of(self, shard: int) -> list[str]:
        return self.keys[shard]


def _check_received(shards: list[dict], fragments: _Fragments) -> None:
    """Each shard was assembled from what the read tasks gave it, or the build fails naming the shard."""
    for r, sent in zip(shards, fragments.counts, strict=True):
        got = r["received"]
        if (got["docs"], got["chunks"]) != (sent["docs"], sent["chunks"]):
            raise IndexMismatch(f"{shard_name(r['shard'])}: the read tasks gave it {sent['docs']} documents and "
                                f"{sent['chunks']} chunks, it was assembled from {got['docs']} and {got['chunks']} "
                                "(a fragment was lost between the nodes); rerun the build")


@dataclass
class _Plan:
    """What the driver knows of the corpus before it is read."""

    record: dict  # what the version's manifest records as its corpus
    sha256: str
    splits: list[Split] = field(default_factory=list)  # a corpus's, or a delta's changes file's
    files: int = 0
    delta: DeltaInput | None = None  # a delta: its base and files (``delta.read_delta``)
    base: VersionManifest | None = None  # a delta: its base version's manifest
    scan: dict = field(default_factory=dict)  # the scan's report (``read.scan_corpus``)


def _plan(cfg: BuildConfig, home: str) -> _Plan:
    """The corpus's splits and fingerprint, from its files scanned where they are (a local corpus on this node ``home``,
    one in object storage on any); or the delta's base and its files, scanned the same way."""
    from .inputs import corpus_locations
    from .read import placement, scan_corpus

    split_bytes = cfg.read_split_mb * 2**20 if cfg.read_split_mb else DEFAULT_SPLIT_BYTES
    if not cfg.is_delta:
        files = corpus_locations(cfg.corpus)
        splits, shas, scan = scan_corpus(files, split_bytes, placement(None if is_remote(cfg.corpus) else home))
        if len(files) == 1:
            sha, one = shas[files[0]], files[0]
            return _Plan({"path": one if is_remote(one) else str(Path(one).resolve()), "sha256": sha,
                          "format": PurePosixPath(one).suffix.lstrip(".")}, sha, splits, 1, scan=scan)
        sha = hashlib.sha256(json.dumps(shas, sort_keys=True).encode()).hexdigest()
        path = str(cfg.corpus) if is_remote(cfg.corpus) or not Path(cfg.corpus).exists() else \
            str(Path(cfg.corpus).resolve())
        return _Plan({"path": path, "files": shas, "sha256": sha, "format": "files"}, sha, splits, len(files),
                     scan=scan)
    from .delta import DeltaInput, base_documents

    root = str(cfg.reuse_from or cfg.out)
    base, manifest = _delta_base(cfg)
    parts = {"base": base, "base_build_key": manifest.build_key}
    delta = DeltaInput(base, base_documents(root, base, manifest.shards))
    splits: list[Split] = []
    for name in ("changes", "deletes"):
        given = getattr(cfg, name)
        if given is None:
            continue
        location = _delta_file(name, given)
        got, shas, scan = scan_corpus([location], split_bytes, placement(None if is_remote(location) else home))
        parts[name] = {"path": location, "sha256": shas[location]}
        setattr(delta, name, location)
        delta.names[name] = location
        if name == "changes":
            splits = got
    sha = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return _Plan({"delta": parts, "sha256": sha, "format": "delta"}, sha, splits, delta=delta, base=manifest)


def _delta_file(name: str, given: str | Path) -> str:
    """The one file ``--changes`` or ``--deletes`` names: a local path made absolute (a BEIR folder's corpus file for
    the changes), or one object's URL."""
    if is_remote(given):
        from .inputs import locate

        store, keys = locate(str(given))
        if len(keys) != 1:
            raise CorpusError(f"--{name} {given}: names {len(keys)} objects; name one file")
        return f"{store.url}/{keys[0]}"
    path = resolve_corpus_file(Path(given)) if name == "changes" else Path(given)
    if not path.is_file():
        raise CorpusError(f"--{name} {given}: no such file")
    return str(path.resolve())


def _delta_base(cfg: BuildConfig) -> tuple[str, VersionManifest]:
    """The version a delta applies to and its manifest (read where the root is: nothing is fetched)."""
    from index_format.versions import open_root

    root = open_root(cfg.reuse_from or cfg.out)
    base = cfg.base or root.active()
    if base is None:
        raise IndexMismatch(f"{root.url} has no active version to apply the delta to; name one with --base")
    if base not in root.versions():
        raise IndexMismatch(f"no version {base!r} under {root.url}/versions to apply the delta to")
    return base, root.manifest(base)


class _BadRecords:
    """Bad records in corpus order, written to the version's bad_records.jsonl as they come; the first few
    kept for the summary, all counted. Each has a sort key (split, position)."""

    def __init__(self, path: Path):
        self.path = path
        self.first: list[BadRecord] = []
        self.read_first: BadRecord | None = None  # the read's first, in corpus order (strict mode stops there)
        self.count = 0
        self._read = open(path.with_suffix(".read.jsonl"), "w")  # noqa: SIM115 (from the read tasks, in order)

    def add_read(self, split: int, records: list) -> None:
        """Bad records the read found, given in corpus order."""
        for file, line, reason in records:
            if self.read_first is None:
                self.read_first = BadRecord(file, line, reason)
            self._read.write(json.dumps([split, line, file, line, reason]) + "\n")

    def finish(self, duplicates: list[list]) -> None:
        """Merge the read tasks' records with the shards' duplicates, each already sorted, into the file."""
        self._read.close()
        with open(self._read.name) as f, open(self.path, "w") as out:
            read = (json.loads(line) for line in f)
            for _split, _position, file, line, reason in heapq.merge(read, *[sorted(list(x) for x in d) for d in duplicates]):
                out.write(json.dumps({"file": file, "line": line, "reason": reason}) + "\n")
                if len(self.first) < SUMMARY_BAD_RECORDS:
                    self.first.append(BadRecord(file, line, reason))
                self.count += 1
        os.unlink(self._read.name)


def _build_index(cfg: BuildConfig, target: Target, nodes: set[str]) -> BuildSummary:
    """The build; ``nodes`` is given the cluster's live nodes as it starts."""
    import ray

    t_start = time.perf_counter()
    seconds: dict[str, float] = {}
    ensure_ray()
    nodes.update(_alive_nodes())
    home = _driver_node()
    from .read import show_progress

    show_progress(cfg.progress)
    seconds["ray start"] = time.perf_counter() - t_start
    t = time.perf_counter()
    plan = _plan(cfg, home)
    seconds["scan"] = time.perf_counter() - t
    build_key = cfg.build_key(plan.sha256)
    staging = staging_dir(target.local, build_key)
    work = staging / "_work"
    work_at = work_area(target, build_key)
    shutil.rmtree(work / FRAGMENTS, ignore_errors=True)
    shutil.rmtree(work / "delta", ignore_errors=True)
    clear_work_area(target, work_at)
    (staging / "shards").mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    write_json_atomic(staging / "build.json", {"build_key": build_key, "config": cfg.model_dump(mode="json")})

    t = time.perf_counter()
    bad = _BadRecords(staging / "bad_records.jsonl")
    delta_report, fragments, stages = _read(cfg, plan, target, work_at, bad, home)
    seconds["read+chunk"] = time.perf_counter() - t
    if cfg.strict and bad.read_first is not None:
        raise CorpusError(f"{bad.read_first} (strict mode; drop --strict to skip and count bad records)")

    t = time.perf_counter()
    shard_dirs = [staging / "shards" / shard_name(s) for s in range(cfg.shards)]
    reuse_plan = ReusePlan()
    if cfg.reuse:
        reuse_plan.sources = find_sources(cfg.reuse_from or cfg.out, _spec(cfg), cfg.chunk_size, cfg.chunk_overlap)
    sources = task_sources(reuse_plan.sources) if cfg.reuse else None
    reuse_root = cfg.reuse_from or cfg.out
    reuse_at = open_root(reuse_root)
    sources_from = reuse_at.url if sources and reuse_at.shared_by_nodes else None
    # A local root is one node's folder: its shards are built there. A root in object storage: the shards spread
    # over the cluster.
    where = home if target.remote is None else None
    assemble = ray.remote(num_cpus=1)(_task("assemble_shard"))
    refs = [assemble.options(**placed).remote(s, str(shard_dirs[s]), str(work), build_key, cfg.shards, cfg.prepend_title, cfg.strict,
                            sources, cfg.content_key(), target.upload_to, _shard_fragments(fragments, s),
                            fragments.root, work_at, sources_from)
            for s, placed in enumerate(_assemble_on(where, work, cfg.shards))]
    shards = [_get(ref) for ref in refs]
    write_json_atomic(work / NODES, {str(r["shard"]): r["node"] for r in shards})
    _check_received(shards, fragments)
    uploads = [r["upload"] for r in shards if r.get("upload")]
    bad.finish([r["bad"] for r in shards])
    if cfg.strict and bad.count:
        raise CorpusError(f"{bad.first[0]} (strict mode; drop --strict to skip and count bad records)")
    total_docs, total_chunks = sum(r["docs"] for r in shards), sum(r["chunks"] for r in shards)
    if total_chunks == 0:
        raise CorpusError(f"{cfg.corpus or cfg.changes or cfg.deletes}: no valid documents ({bad.count} bad records); "
                          "nothing to index")
    for r in shards:
        if r["linked"]:
            reuse_plan.shards[r["shard"]] = r["linked"]
        for name, n in r["reused_from"].items():
            reuse_plan.vectors_from[name] = reuse_plan.vectors_from.get(name, 0) + n
        if not r["resumed"]:
            reuse_plan.vectors_reused += r["reused"]
            reuse_plan.vectors_embedded += r["todo"]
    seconds["assemble shards"] = time.perf_counter() - t
    stages["assemble shards"] = {"nodes": sorted({r["node"] for r in shards}), "rows": total_docs,
                                 "seconds": round(seconds["assemble shards"], 3)}

    t = time.perf_counter()
    dimension, lucene_seconds, embed_report = _embed_and_index(cfg, build_key, shards, shard_dirs, work, work_at,
                                                               home, target.upload_to, uploads)
    seconds["embed+index"] = time.perf_counter() - t
    stages |= embed_report
    built = [r for r in shards if not r["resumed"] and not r["linked"]]
    if built:
        stages["FAISS + Lucene + commit"] = {"nodes": sorted({r["node"] for r in built}),
                                             "rows": sum(r["chunks"] for r in built),
                                             "seconds": round(seconds["embed+index"], 3)}
    seconds["lucene (sum of shard tasks)"] = lucene_seconds

    t = time.perf_counter()
    # Every file against its checksum and the counts, in the shards' own tasks on their nodes, before anyone can
    # see it; their statistics come back as values, summed on this node.
    verify = ray.remote(num_cpus=0.5, num_returns=2)(_task("verify_shard_files"))
    verified = [verify.options(**_on(r["node"])).remote(str(d), _shard_expect(cfg, dimension))
                for d, r in zip(shard_dirs, shards, strict=True)]
    counts = [_get(ref) for ref, _ in verified]
    for d, c, r in zip(shard_dirs, counts, shards, strict=True):
        if (c["counts"]["docs"], c["counts"]["chunks"]) != (r["docs"], r["chunks"]):
            raise IndexMismatch(f"{d.name}: holds {c['counts']['docs']} documents and {c['counts']['chunks']} chunks, "
                                f"its fragments gave {r['docs']} and {r['chunks']}")
    merge = ray.remote(num_cpus=1)(_task("merge_bm25_returned")).options(**_on(home))
    bm25 = _get(merge.remote(str(staging), [c["lucene"] for c in counts], cfg.bm25_k1, cfg.bm25_b,
                             *[terms for _, terms in verified]))
    del verified
    name = cfg.version or f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{build_key[:8]}"
    manifest = VersionManifest(
        version=name,
        build_key=build_key,
        created=now_iso(),
        corpus=plan.record,
        encoder=cfg.encoder,
        dimension=dimension,
        query_prompt=cfg.query_prompt,
        document_prompt=cfg.document_prompt,
        metric="inner_product",
        num_shards=cfg.shards,
        shards=[d.name for d in shard_dirs],
        counts={"docs": total_docs, "chunks": total_chunks, "bad_records": bad.count},
        bm25={"k1": cfg.bm25_k1, "b": cfg.bm25_b} | bm25,
        build_config=cfg.content_key(),
        code_version=code_version(),
        reuse=reuse_plan.describe() if cfg.reuse else None,
        # A delta on a version keeps the API's writes that version held; a corpus build holds none of them.
        log_seq=plan.base.log_seq if plan.base else 0,
    )
    write_json_atomic(staging / MANIFEST, manifest.model_dump(mode="json"))
    if target.remote is None:  # one node: the counts add up (the files were checked just above)
        verify_version(staging, checksums=False)
    elif sum(c["counts"]["chunks"] for c in counts) != total_chunks:
        raise IndexMismatch(f"{name}: its shards hold {sum(c['counts']['chunks'] for c in counts)} chunks, its "
                            f"manifest says {total_chunks}")
    shutil.rmtree(work)
    clear_work_area(target, work_at)
    others = sorted({r["node"] for r in shards} - {home})
    try:
        version_dir, published = target.publish_version(staging, name, uploads, activate=cfg.activate)  # verified
    except ActivationRefused:
        _remove_staging(staging, others)  # published, only not active
        raise
    _remove_staging(staging, others)
    seconds["publish"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t_start
    return BuildSummary(name, version_dir, cfg.activate, total_docs, total_chunks, cfg.shards,
                        sum(r["resumed"] for r in shards), bad.first, seconds,
                        reuse_plan.describe() if cfg.reuse else {}, delta_report, bad.count,
                        {"files": plan.files, "tasks": len(plan.splits)} if plan.splits else {}, published,
                        _fetched(reuse_plan.sources), {shard_name(r["shard"]): r["node"] for r in shards},
                        stages)


def _remove_staging(staging: Path, nodes: list[str]) -> None:
    """A published version's staging folders on the other nodes that built its shards."""
    import ray

    remove = ray.remote(num_cpus=0)(_task("remove_staging"))
    for node in nodes:
        with contextlib.suppress(ray.exceptions.RayError):  # that node is gone, and its disk with it
            ray.get(remove.options(**_on(node)).remote(str(staging)))


def _fetched(sources: list) -> dict:
    """What fetching versions of a root in object storage downloaded: the reuse sources."""
    got = [(s.name, s.fetched) for s in sources if s.fetched]
    if not got:
        return {}
    return {"versions": sorted({name for name, _ in got}), "bytes_downloaded": sum(f["bytes_downloaded"] for _, f in got),
            "seconds": round(sum(f["seconds"] for _, f in got), 3)}


def _task(name: str):
    """A function of shard_tasks, looked up by name (keeps the driver from importing FAISS or the encoders)."""
    from . import shard_tasks

    return getattr(shard_tasks, name)


def _get(ref):
    """ray.get, with a task's own error (a bad corpus, a mismatch) raised as itself."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, CorpusError | IndexMismatch):
            raise type(e.cause)(*e.cause.args) from None
        raise


def _read(cfg: BuildConfig, plan: _Plan, target: Target, work_at: str, bad: _BadRecords,
          home: str) -> tuple[dict, _Fragments, dict]:
    """Read the corpus, or apply the delta to its base, into each shard's fragments in the work area ``work_at``; the
    bad records go to ``bad``. Ray Data pipelines (``read.read_corpus``, ``delta.read_delta``): on every node when the
    root is in object storage and so are the files read, else on this node ``home``, which holds them. Returns what a
    delta did, the fragments and each stage's report."""
    spread = target.remote is not None
    if plan.delta is None:
        from .read import read_corpus

        result = read_corpus(plan.splits, cfg.shards, cfg.chunk_size, cfg.chunk_overlap, cfg.id_fields,
                             cfg.text_fields, work_at, None if spread and is_remote(cfg.corpus) else home)
        for split, position, reason in result.bad:
            bad.add_read(split, [(plan.splits[split].name, position, reason)])
        return {}, _Fragments(result.fragments, result.counts, work_at), {"scan": plan.scan} | result.stages
    from .delta import read_delta

    got = read_delta(plan.delta, plan.splits, cfg.shards, cfg.chunk_size, cfg.chunk_overlap, cfg.id_fields,
                     cfg.text_fields, work_at, home, spread)
    for order, line, file, reason in got.bad:
        bad.add_read(order - 2, [(file, line, reason)])  # before every split of the shards' own
    return got.report, _Fragments(got.read.fragments, got.read.counts, work_at), got.read.stages


def work_area(target: Target, build_key: str) -> str:
    """The build's work area, where Ray Data's stages write what the shards' tasks read (the fragments, the rows to
    embed, the vectors): its staging folder's ``_work`` in the root's object storage, or on this node for a local root
    (every stage then runs here)."""
    if target.remote is not None:
        return f"{target.root}/staging/{build_key}/_work"
    return str(staging_dir(target.local, build_key) / "_work")


def clear_work_area(target: Target, work_at: str) -> None:
    """A root in object storage: the build's work area there emptied (a local root's is its work folder, removed with
    it)."""
    if target.remote is None:
        return
    from index_format.store import open_store

    store = open_store(work_at)
    store.delete(list(store.list()))


def _shard_fragments(fragments: _Fragments, shard: int) -> list[str]:
    """The fragments shard ``shard``'s task is given (its own, in split order; a test drops one here)."""
    return fragments.of(shard)


def _spec(cfg: BuildConfig) -> EncoderSpec:
    """The encoder and its prompts of a config ``with_prompts``."""
    return EncoderSpec(cfg.encoder, cfg.query_prompt, cfg.document_prompt)


def _shard_expect(cfg: BuildConfig, dimension: int) -> dict:
    return encoder_fields(_spec(cfg), dimension)


def _embed_and_index(cfg: BuildConfig, build_key: str, shards: list[dict], shard_dirs: list[Path],
                     work: Path, work_at: str, home: str, upload_to: str | None,
                     uploads: list[dict]) -> tuple[int, float, dict]:
    """Embed what each shard still needs (``embedding.embed_rows``: Ray Data, with an actor pool, on this node ``home``
    for a local root, anywhere for a root in object storage) and build each shard's FAISS and Lucene indexes on the
    node its ``assemble_shard`` ran on, committing each shard as soon as both are done (and uploading it to
    ``upload_to``: what each upload sent is added to ``uploads``). Lucene builds need no vectors: they run while the
    embedding does, on the CPUs its actors leave free. Returns the embedding dimension, the summed seconds of the
    Lucene tasks and the embedding's stage report."""
    import queue
    import threading

    import ray

    from .embedding import embed_rows, embedding_pool, node_plans
    from .shard_tasks import work_dir

    nodes = node_plans(cfg.encoder, cfg.device.value, cfg.embed_actors)
    todo = [r for r in shards if not r["resumed"] and not r["linked"]]
    dimension = max([r["dimension"] for r in shards] + [0])
    if not todo:
        return dimension, 0.0, {}
    to_embed = [r["shard"] for r in todo if r["blocks"]]
    local = upload_to is None
    pool = embedding_pool(nodes, cfg.device.value, home if local else None, len(to_embed)) if to_embed else None

    def spec_on(node: str) -> FaissSpec:
        gpu = nodes[node].gpus > 0 and cfg.device.value != "cpu"
        return spec_of_config(cfg.content_key(), device=cfg.device.value if gpu else "cpu")

    # An indexing JVM keeps about one core busy. Lucene builds start at once (they need no vectors)
    # but only on the CPUs the embedding's actors leave free, topped up as they finish.
    lucene_task = ray.remote(num_cpus=1)(_task("build_lucene_shard"))
    dense_task = ray.remote(num_cpus=0.25)(_task("finish_dense"))
    commit_task = ray.remote(num_cpus=0.25)(_task("commit_shard"))
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    slots = {"lucene": cpus - pool.actors[1] if pool and not pool.gpus else cpus}
    slots["lucene"] = max(slots["lucene"], 0 if len(nodes) > 1 else 1)  # one node: Lucene runs beside one actor
    lucene_queue = [r["shard"] for r in todo]
    pending: dict = {}
    by_shard = {r["shard"]: r for r in todo}

    def top_up_lucene() -> None:
        refs = [ref for ref, (_, part) in pending.items() if part == "lucene"]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False) if refs else ([], [])
        running = len(refs) - len(ready)
        while lucene_queue and running < slots["lucene"]:
            s = lucene_queue.pop(0)
            pending[lucene_task.options(**_on(by_shard[s]["node"])).remote(
                str(shard_dirs[s]), cfg.prepend_title, cfg.lucene_heap, tuple(cfg.bm25_fields))] = (s, "lucene")
            running += 1

    def start_dense(s: int) -> None:
        r = by_shard[s]
        gpu = nodes[r["node"]].gpus > 0 and cfg.device.value != "cpu"
        pending[dense_task.options(num_gpus=1 if gpu else 0, **_on(r["node"])).remote(
            str(shard_dirs[s]), str(work_dir(work, shard_dirs[s].name)), s, r["chunks"], dimension,
            spec_on(r["node"]), work_at)] = (s, "faiss")

    top_up_lucene()
    for r in todo:  # every vector reused, or no chunks: the shard's dense side can be built at once
        if not r["blocks"]:
            start_dense(r["shard"])
    embedded: dict = {}
    stop = threading.Event()
    blocks: queue.Queue = queue.Queue()  # (shard, rows, dimension) of each block embedded, from the thread below
    rows_in = dict.fromkeys(to_embed, 0)

    def embed() -> None:
        try:
            embedded["report"] = embed_rows(work_at, to_embed, _spec(cfg), pool, batch_size=cfg.embed_batch_size,
                                            written=lambda *block: blocks.put(block), stop=stop)
        except BaseException as e:  # raised in the driver's thread below
            embedded["error"] = e

    def take_blocks() -> None:
        nonlocal dimension
        while not blocks.empty():
            s, n, dim = blocks.get()
            dimension = dimension or dim
            rows_in[s] += n
            if rows_in[s] > by_shard[s]["todo"]:
                raise IndexMismatch(f"{shard_name(s)}: {by_shard[s]['todo']} chunks to embed, the embedding wrote "
                                    f"{rows_in[s]} vectors")
            if rows_in[s] == by_shard[s]["todo"]:
                start_dense(s)

    embedding = threading.Thread(target=embed, name="embedding", daemon=True)
    waiting = bool(to_embed)  # for the embedding to end
    if waiting:
        embedding.start()

    results: dict[int, dict[str, dict]] = {r["shard"]: {} for r in todo}
    lucene_seconds = 0.0
    committed = submitted = 0
    crash_after = int(os.environ.get(CRASH_ENV, "0") or 0)
    content_key = cfg.content_key()
    try:
        with _progress(len(todo), "index shards", "shard", cfg.progress) as bar:
            while pending or lucene_queue or waiting:
                top_up_lucene()
                take_blocks()
                if waiting and not embedding.is_alive():
                    waiting = False
                    take_blocks()
                    if "error" in embedded:
                        raise RuntimeError(f"embedding failed: {embedded['error']}") from embedded["error"]
                    for s in to_embed:
                        if rows_in[s] != by_shard[s]["todo"]:
                            raise IndexMismatch(f"{shard_name(s)}: {by_shard[s]['todo']} chunks to embed, the embedding "
                                                f"wrote {rows_in[s]} vectors")
                    slots["lucene"] = cpus  # the embedding's actors are gone: Lucene builds may take every CPU
                if not pending:
                    embedding.join(timeout=0.5)
                    continue
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5 if waiting else None)
                if not done:
                    continue
                s, part = pending.pop(done[0])
                try:
                    results[s][part] = ray.get(done[0])
                except ray.exceptions.RayTaskError as e:
                    raise RuntimeError(f"{part} build of {shard_name(s)} failed: {e}") from None
                if part == "lucene":
                    lucene_seconds += results[s][part]["seconds"]
                if part == "faiss":
                    dimension = dimension or results[s][part]["dimension"]
                if part == "commit":
                    if results[s][part]["upload"]:
                        uploads.append(results[s][part]["upload"])
                    committed += 1
                    bar.update(1)
                    if crash_after and committed >= crash_after:
                        print(f"{CRASH_ENV}={crash_after}: exiting after {committed} committed shard(s)", flush=True)
                        os._exit(137)
                elif "faiss" in results[s] and "lucene" in results[s]:
                    if crash_after and submitted >= crash_after:
                        continue  # the kill lands before this shard commits: exactly ``crash_after`` are committed
                    submitted += 1
                    faiss_info = {k: v for k, v in results[s]["faiss"].items() if k != "dimension"}
                    manifest = {
                        "shard": s, "num_shards": cfg.shards, "build_key": build_key, "metric": "inner_product",
                        **_shard_expect(cfg, results[s]["faiss"]["dimension"]),
                        "faiss": faiss_info,
                        "counts": {"docs": by_shard[s]["docs"], "chunks": by_shard[s]["chunks"],
                                   "faiss_vectors": faiss_info["ntotal"],
                                   "lucene_docs": results[s]["lucene"]["stats"]["documents"]},
                        "lucene": results[s]["lucene"]["stats"], "build_config": content_key,
                    }
                    pending[commit_task.options(**_on(by_shard[s]["node"])).remote(
                        str(shard_dirs[s]), manifest, faiss_info, results[s]["lucene"]["stats"], upload_to)] = (s, "commit")
    except BaseException:
        stop.set()  # the embedding ends too: a build resumed after a lost node must not meet its writes
        embedding.join(timeout=60)
        raise
    return dimension, lucene_seconds, embedded.get("report", {})
