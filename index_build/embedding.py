"""The build's embedding on Ray Data: the rows each shard still needs (``assemble_shard`` wrote them, in blocks, in the
build's work area) read, embedded by a pool of actors, and their vectors written back beside them.

    read    ray.data.read_datasource(rows_to_embed(shards))     a read task a shard, in turn: its rows, a block at a time
    embed   .map_batches(EmbedRows, compute=ActorPoolStrategy)   actors that load the encoder once (CPU actors, or
                                                                one a GPU on a cluster with GPUs, in float16 with
                                                                tokenizer threads) embed a block and
                                                                write its vectors as one file (row, vector); the pool
                                                                grows from an actor a node to as many as they allow
    count   .iter_batches() on the driver                       each block's shard and rows, nothing more: a shard's
                                                                FAISS task starts as soon as its last block is written

The work area is a folder on the driver's node for a local root (every stage runs there), or the root's object storage
(``staging/<build key>/_work``) for a root there: then any node reads, embeds and writes, and each shard's
``finish_dense`` reads its vectors from there, on its own node. Ray Data streams the rows to the actors with
backpressure, retries a task or actor lost with its node (a block's vectors file is named by its first row, so a
block embedded again replaces its file), and shows its progress bars.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray
import ray.data

from index_format.encoders import cpu_only, runs_on_torch
from index_format.prompts import EncoderSpec
from index_format.sharding import shard_name
from index_format.store import open_store

from .read import TaskSource, placement, stage_report

TODO_FILE = "todo.parquet"
EMBED_BLOCK = 1024  # rows of a shard read as one block for the embedding (a row group of its rows to embed)
TODO_SCHEMA = pa.schema([("row", pa.int64()), ("contents", pa.string())])


def todo_key(shard: int) -> str:
    """A shard's rows to embed, in the work area."""
    return f"shards/{shard_name(shard)}/{TODO_FILE}"


def write_todo(work_at: str, shard: int, rows: np.ndarray, contents: list[str]) -> None:
    """A shard's rows to embed and their contents into the work area, in blocks of EMBED_BLOCK rows (one Parquet row
    group each: one call of an actor)."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"row": rows, "contents": contents}, schema=TODO_SCHEMA), sink, row_group_size=EMBED_BLOCK)
    open_store(work_at).put(todo_key(shard), sink.getvalue().to_pybytes(), durable=False)


def vectors_prefix(shard: int) -> str:
    """Where a shard's new vectors are written in the work area: files of (row, vector)."""
    return f"shards/{shard_name(shard)}/vectors/"


def rows_to_embed(work_at: str, shards: list[int]) -> TaskSource:
    """One read task a shard, yielding its rows to embed one row group (block) at a time, with the shard's number."""
    return TaskSource("RowsToEmbed", [(_reader(work_at, s), None) for s in shards])


def _reader(work_at: str, shard: int):
    def read():
        with open_store(work_at).open(todo_key(shard)) as f:
            pf = pq.ParquetFile(f)
            for group in range(pf.num_row_groups):
                rows = pf.read_row_group(group)
                yield rows.append_column("shard", pa.array([shard] * rows.num_rows, pa.int32()))

    return read


class EmbedRows:
    """Ray Data's actor: loads the encoder once; embeds each block's ``contents`` and writes its vectors into the
    work area, a file a shard (under ``vectors_prefix``); returns each shard's rows and the dimension."""

    def __init__(self, spec: EncoderSpec, device: str, batch_size: int, threads: int, work_at: str):
        self.store = open_store(work_at)
        if threads and runs_on_torch(spec.model, device):
            import torch

            torch.set_num_threads(threads)
        if device == "cuda":
            # On a GPU the tokenizer is the bottleneck (bench/README.md, "On a GPU": 3,100 chunks/s with one
            # tokenizer thread, 4,114 with its threads on); a CPU actor's cores are torch's instead.
            os.environ["TOKENIZERS_PARALLELISM"] = "true"
        from index_format.encoders import load_encoder

        self.encoder = load_encoder(spec.model, device, threads=threads or 1, half=device == "cuda")
        self.prompt = spec.document_prompt
        self.batch_size = batch_size

    def __call__(self, batch: pa.Table) -> pa.Table:
        vectors = self.encoder.encode(batch["contents"].to_pylist(), self.batch_size, self.prompt).astype(np.float32)
        out = {"shard": [], "rows": [], "dimension": []}
        for shard in pc.unique(batch["shard"]).to_pylist():
            mine = pc.equal(batch["shard"], shard)
            rows = batch["row"].filter(mine)
            block = pa.table({"row": rows, "vector": pa.FixedSizeListArray.from_arrays(
                pa.array(vectors[mine.to_numpy(zero_copy_only=False)].reshape(-1)), vectors.shape[1])})
            sink = pa.BufferOutputStream()
            pq.write_table(block, sink, compression="none")  # floats: nothing to gain
            self.store.put(f"{vectors_prefix(shard)}{rows[0].as_py():012d}.parquet", sink.getvalue().to_pybytes(),
                           durable=False)  # a rerun embeds them again
            out["shard"].append(shard)
            out["rows"].append(len(rows))
            out["dimension"].append(vectors.shape[1])
        return pa.table(out)


def read_vectors(work_at: str, shard: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(rows, vectors) of each file the embedding wrote for ``shard``, one file in memory at a time."""
    store = open_store(work_at)
    for key in store.list(vectors_prefix(shard)):
        with store.open(key) as f:
            table = pq.read_table(f)
        dim = table.schema.field("vector").type.list_size
        vectors = table["vector"].combine_chunks().flatten().to_numpy().reshape(-1, dim)
        yield table["row"].to_numpy(), vectors


START_ACTORS_S = 60  # how long the pool's first actors may take to start before it starts with fewer


@dataclass(frozen=True)
class NodePlan:
    """A node's share of the embedding: how many actors, on which device, with how many torch threads each."""

    cpus: int
    gpus: int
    device: str  # "cuda" | "cpu": what the encoder runs on there
    actors: int
    threads: int  # torch threads of a CPU actor (0: leave torch's default)


def node_plans(encoder: str, device: str, embed_actors: int) -> dict[str, NodePlan]:
    """Each live node's embedding plan, from the cluster's resources (never from the driver's own torch): ``device``
    ``auto`` embeds on CUDA on a node with a GPU, ``cuda`` asks for one on every node, ``cpu`` never does.
    ``embed_actors`` actors a node at most, one a GPU."""
    plans = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        cpus, gpus = int(res.get("CPU", 0)), int(res.get("GPU", 0))
        on_gpu = not cpu_only(encoder) and device != "cpu" and (gpus > 0 or device == "cuda")
        actors = max(1, min(embed_actors, gpus if on_gpu and gpus else max(cpus, 1)))
        plans[node["NodeID"]] = NodePlan(cpus, gpus, "cuda" if on_gpu else "cpu", actors,
                                         0 if on_gpu else max(1, cpus // actors))
    return plans


@dataclass(frozen=True)
class Pool:
    """The embedding's actor pool: (least, most) actors, on GPUs (one actor a GPU) or CPUs (``threads`` torch threads
    each), on ``node`` or anywhere (None)."""

    actors: tuple[int, int]
    gpus: bool
    threads: int
    node: str | None
    reserve_cpus: bool = True  # a CPU actor holds a CPU; False beside a service whose replicas may hold them all


def beside_service(pool: Pool) -> Pool:
    """The pool reserving no CPU (a GPU actor still its GPU): what a job run against a served root (a fold,
    ``add_encoder``) embeds with, as the service's replicas may hold every CPU of the cluster and a pool waiting for
    one would wait for ever. Its actors then share the cores with the replicas."""
    return replace(pool, reserve_cpus=False)


def embedding_pool(plans: dict[str, NodePlan], device: str, node: str | None, shards: int) -> Pool:
    """The pool over the nodes that may embed (``node`` alone, for a local root): an actor on each to start with, up to
    their plans' actors as Ray Data sees rows waiting; on a cluster with GPUs, only its GPU nodes embed."""
    gpus = any(n.device == "cuda" for n in plans.values())
    if device == "cuda" and not any(n.gpus for n in plans.values()):
        raise RuntimeError("device=cuda was asked for but no node of the cluster has a GPU; use device=auto or cpu")
    pool = [n for node_id, n in plans.items() if (node is None or node_id == node) and (n.device == "cuda") == gpus]
    return Pool((max(1, min(len(pool), shards)), max(1, sum(n.actors for n in pool))), gpus,
                max([n.threads for n in pool if n.device == "cpu"] + [1]), node)


def embed_rows(work_at: str, shards: list[int], spec: EncoderSpec, pool: Pool, *, batch_size: int,
               written: Callable[[int, int, int], None], stop: threading.Event | None = None) -> dict:
    """Embed every row the ``shards`` still need with the actor ``pool``, Ray Data growing it while rows wait; each
    call embeds one block of rows (the encoder in batches of ``batch_size``). The
    least are started before any row is handed out, for at most START_ACTORS_S, and a CPU actor is given two blocks
    at a time (a GPU's four, to keep it fed), so that the rows spread over them; a cluster that cannot start them by
    then embeds with a pool that starts from one. ``written(shard, rows, dimension)`` is called on this thread as
    each block's vectors are written; ``stop``, once set, ends the pipeline at the next block (the build failed
    meanwhile, and will not read what it writes). Returns the stage's report."""
    ctx = ray.data.DataContext.get_current()
    before = ctx.wait_for_min_actors_s
    ctx.wait_for_min_actors_s = START_ACTORS_S if pool.actors[0] > 1 else -1
    try:
        try:
            ds = _pipeline(work_at, shards, spec, pool, batch_size)
            batches = iter(ds.iter_batches(batch_size=None, batch_format="pyarrow"))
            first = next(batches, None)
        except ray.exceptions.GetTimeoutError:
            ctx.wait_for_min_actors_s = -1
            ds = _pipeline(work_at, shards, spec, replace(pool, actors=(1, pool.actors[1])), batch_size)
            batches = iter(ds.iter_batches(batch_size=None, batch_format="pyarrow"))
            first = next(batches, None)
        total = vector_bytes = 0
        for batch in itertools.chain([first] if first is not None else [], batches):
            if stop is not None and stop.is_set():
                batches.close()  # Ray Data shuts the pipeline down: its tasks and actors stop
                return {}
            for shard, rows, dimension in zip(batch["shard"].to_pylist(), batch["rows"].to_pylist(),
                                              batch["dimension"].to_pylist(), strict=True):
                written(shard, rows, dimension)
                total += rows
                vector_bytes += rows * dimension * 4
    finally:
        ctx.wait_for_min_actors_s = before
    report = stage_report(ds)
    for name, stage in report.items():
        if "EmbedRows" in name:  # its output is a count a block: its rows are the vectors written
            stage |= {"rows": total, "bytes": vector_bytes}
    return {f"embed: {name}": stage for name, stage in report.items()}


def _pipeline(work_at: str, shards: list[int], spec: EncoderSpec, pool: Pool, batch_size: int):
    where = placement(pool.node)
    gpus, actors = pool.gpus, pool.actors
    # The shards are read in turn, so that they are embedded in turn; reading reserves no CPU: the actors may hold
    # every CPU of their nodes.
    ds = ray.data.read_datasource(rows_to_embed(work_at, shards), override_num_blocks=len(shards), num_cpus=0,
                                  concurrency=1, **where)
    return ds.map_batches(EmbedRows, fn_constructor_args=(spec, "cuda" if gpus else "cpu", batch_size,
                                                          0 if gpus else pool.threads, work_at),
                          batch_size=EMBED_BLOCK, batch_format="pyarrow",
                          compute=ray.data.ActorPoolStrategy(min_size=actors[0], max_size=max(actors),
                                                             max_tasks_in_flight_per_actor=4 if gpus else 2),
                          num_cpus=0 if gpus or not pool.reserve_cpus else 1, num_gpus=1 if gpus else 0, **where)
