"""What the learned ranking stage costs a query: the model alone over a query's 200 candidates (its compiled trees
against LightGBM's ``predict``); the shards' BM25 of each field and term masks for them, in one pass over the
postings against the ways before it; the whole stage in-process (the shards' features and the model) and the
server CPU over HTTP, each against the same searches without the model (``ranking_model: false``) in the same run.

    python -m bench.ranking --index ROOT --queries DATA/scifact/queries.jsonl --out bench/results/ranking.json

``ROOT`` must have an active ranking model (``python -m relevance.train_ranker ... --activate``). CPU is process
time (user + system): in-process, this process's; over HTTP, the machine's busy time less the load generator's
(``bench.cpu``), per answered search, and the router replica's own (where the stage runs, with the shards the router
holds on one node). Over HTTP each side is measured at its own capacity (closed loops) and at one fixed rate
(``--http-rate``), where Ray's and Serve's steady background weighs the same on every request of both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from pathlib import Path

from bench.common import machine, served, write_record
from bench.cpu import own_cpu_s


def read_queries(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()][:n]


def model_alone(pipeline, texts: list[str], repeats: int) -> dict:
    """The model over each query's candidates (made once, before timing), on one thread, two ways alternating in
    one run: its trees compiled to native code (``RankingModel.score``, what serving does) and LightGBM's
    ``predict`` (what it did before). Asserts both give the same scores."""
    import numpy as np

    from deployments.edge.schemas import SearchRequest

    model = pipeline.models["default"]
    tables = [asyncio.run(pipeline.ranking_features(SearchRequest(query=t))) for t in texts]
    matrices = [table.matrix(model.features) for table in tables]
    ways = {"compiled": model.score,
            "lightgbm": lambda table: model.booster.predict(table.matrix(model.features), num_threads=1)}
    if model.compiled is None:
        raise SystemExit(f"ranking model {model.id}: its trees did not compile (see the log)")
    for table, matrix in zip(tables, matrices, strict=True):
        assert np.allclose(model.score(table), model.booster.predict(matrix, num_threads=1), rtol=0, atol=1e-9)
    cpu = dict.fromkeys(ways, 0.0)
    for how in ways.values():
        for table in tables[:20]:
            how(table)
    for _ in range(repeats):
        for label, how in ways.items():
            c = time.process_time()
            for table in tables:
                how(table)
            cpu[label] += time.process_time() - c
    n = repeats * len(tables)
    return {"model": model.id, "trees": model.booster.num_trees(), "features": len(model.features),
            "candidates_per_query": sum(len(t.hits) for t in tables) / len(tables),
            "cpu_ms_per_query": 1000 * cpu["compiled"] / n, "cpu_ms_per_query_lightgbm": 1000 * cpu["lightgbm"] / n}


def field_scoring(index: Path, texts: list[str], per_shard: int, repeats: int, warm: int = 10) -> dict:
    """The shards' BM25 of each field and term masks (coverage) for ``per_shard`` chosen rows of each shard (half
    the shard's BM25 top, half drawn at random: a fused pool holds chunks the keyword leg never returned), three
    ways alternating in one run: one pass over the postings for every field and the masks, all shards in one call
    (a ``lucene.FactsReader`` over them, what a shard group does); each field by advancing its query's scorer to the rows'
    Lucene doc numbers (``scores_of``) and the masks apart (``term_masks``), what it did before; each field by a
    search filtered to the rows' ids (a ``TermInSetQuery``) and the masks apart, before that. Asserts all three
    give the same scores and masks."""
    import numpy as np

    from deployments.shard.lucene import FactsReader
    from deployments.shard.service import ShardService, open_version

    version_dir, manifest, stats, df, expect = open_version(index)
    shards = [ShardService(version_dir / "shards" / name, stats, df, expect, verify_checksums=False)
              for name in manifest.shards]
    rng = np.random.default_rng(0)
    work = []
    for text in texts:
        terms = shards[0].analyze(text)  # one analyzer for every shard of a version
        rows = []
        for shard in shards:
            top = shard.keyword_leg(terms, per_shard // 2)[0]
            rows.append(np.unique(np.concatenate([top, rng.integers(0, shard.chunks, per_shard - len(top))])))
        work.append((terms, rows, sorted(set(terms))[:64]))

    reader = FactsReader([s.lucene for s in shards])

    def one_pass(terms, rows, distinct):  # every shard in one call, as a shard group does
        fields, masks = reader.read(rows, terms, distinct)[:2]
        bounds = np.cumsum([0] + [len(r) for r in rows])
        return [({f: v[a:b] for f, v in fields.items()}, masks[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def by_docs(terms, rows, distinct):
        return [({f: shard.lucene.scores_of(terms, r, {f: 1.0}) for f in shard.lucene.fields},
                 shard.lucene.term_masks(distinct, r)) for shard, r in zip(shards, rows, strict=True)]

    def by_filter(terms, rows, distinct):
        out = []
        for shard, r in zip(shards, rows, strict=True):
            fields = {}
            for f in shard.lucene.fields:
                scores = np.zeros(len(r), dtype=np.float32)
                hit_rows, hit_scores = shard.lucene.search_rows(terms, len(r), r.tolist(), weights={f: 1.0})
                scores[np.searchsorted(r, hit_rows)] = hit_scores
                fields[f] = scores
            out.append((fields, shard.lucene.term_masks(distinct, r)))
        return out

    ways = {"one_pass": one_pass, "by_doc_number": by_docs, "by_filter": by_filter}
    for item in work:
        for (a, a_masks), (b, b_masks), (c, _) in zip(*(how(*item) for how in ways.values()), strict=True):
            assert a_masks.tolist() == b_masks.tolist(), "the masks disagree"
            for f in a:
                assert np.allclose(a[f], b[f], rtol=1e-5, atol=1e-6) and np.allclose(b[f], c[f], rtol=1e-5,
                                                                                     atol=1e-6), "the ways disagree"
    cpu = dict.fromkeys(ways, 0.0)
    for _ in range(warm):  # the JIT compiles each path: the first rounds cost 2-4x the later ones
        for how in ways.values():
            for item in work:
                how(*item)
    for _ in range(repeats):
        for label, how in ways.items():
            c = time.process_time()
            for item in work:
                how(*item)
            cpu[label] += time.process_time() - c
    n = repeats * len(texts)
    for shard in shards:
        shard.close()
    return {"shards": len(shards), "fields": sorted(shards[0].lucene.fields), "rows_per_shard": per_shard,
            "helper": shards[0].lucene.fast,
            **{f"cpu_ms_per_query_{label}": 1000 * total / n for label, total in cpu.items()}}


def in_process(pipeline, texts: list[str], rounds: int, warm_rounds: int) -> dict:
    """Searches alternating with and without the model, each side's CPU summed apart, after ``warm_rounds`` rounds
    unmeasured: the JVM's compiler threads count in process CPU, and they go on compiling the search and feature
    paths for the first few hundred searches (on the 2-core Xeon, 1.9 s over each of the first two rounds of 100
    queries a side, 0.07 s over the fourth); the record says what they and the JVM's collector threads spent over
    the measured rounds. Run first, before the parts that open the shards a second time. Python's collector is
    settled after the warm-up as a served replica settles it (``settle_heap``): with the interpreter's defaults, a
    search with the model set off a young collection every time and a full one every few hundred searches, about 0.2
    ms a search that no replica pays."""
    from bench.cpu import threads_cpu_s
    from deployments.edge.schemas import SearchRequest
    from deployments.serve.heap import settle_heap

    cpu = {"with": 0.0, "without": 0.0}
    stage_ms: list[float] = []

    async def one(text: str, side: str) -> None:
        c = time.process_time()
        r = await pipeline.search(SearchRequest(query=text, limit=10, ranking_model=side == "with"))
        cpu[side] += time.process_time() - c
        if side == "with":
            stage_ms.append(r.timings_ms.get("rank", 0.0))

    async def go(k: int) -> None:
        for _ in range(k):
            for text in texts:
                await one(text, "with")
                await one(text, "without")

    asyncio.run(go(warm_rounds))  # warm: the JVM compiles Lucene's and the helper's paths, the caches fill
    settle_heap()
    cpu = {"with": 0.0, "without": 0.0}
    stage_ms.clear()
    jvm = {"compiler": ("Compiler",), "gc": ("GC Thread", "G1 ")}
    before = {kind: threads_cpu_s(*names) for kind, names in jvm.items()}
    collections = [g["collections"] for g in gc.get_stats()]
    asyncio.run(go(rounds))
    collections = [g["collections"] - c for g, c in zip(gc.get_stats(), collections, strict=True)]
    spent = {kind: None if before[kind] is None else threads_cpu_s(*jvm[kind]) - before[kind] for kind in jvm}
    n = rounds * len(texts)
    return {"searches_per_side": n, "warm_rounds": warm_rounds, "jit_compiler_cpu_s_measured": spent["compiler"],
            "jvm_gc_cpu_s_measured": spent["gc"], "python_gc_collections_measured": collections,
            "cpu_ms_per_query_with": 1000 * cpu["with"] / n,
            "cpu_ms_per_query_without": 1000 * cpu["without"] / n,
            "stage_cpu_ms_per_query": 1000 * (cpu["with"] - cpu["without"]) / n,
            "stage_wall_ms_mean": sum(stage_ms) / len(stage_ms)}


def over_http(index: Path, texts: list[str], seconds: float, clients: int, port: int, rounds: int,
              warm_seconds: float, rate: float) -> dict:
    """Levels of ``seconds`` each, without and with the model, alternating ``rounds`` times on one served app (the
    machine's load drifts over minutes: one level a side would compare two moments), and each side's mean; each side
    first searched ``warm_seconds`` unmeasured, so the shard replicas' JVM has compiled both paths. Two kinds of
    level: ``clients`` closed loops (each side at its own capacity), then, with ``rate``, both sides at that many
    requests a second (``serving.level``): the same throughput, so what the machine spends per second whatever the
    load is shared by as many requests on each side, and the difference is the stage's own."""
    from bench.loadgen import closed_loop
    from bench.serving import level

    bodies = {"without": {"limit": 10, "ranking_model": False}, "with": {"limit": 10}}
    kinds = {"closed_loop": None} | ({"fixed_rate": rate} if rate else {})
    levels = []
    with served(index, port, ["--router.cache-size", "0"]) as base:
        for body in bodies.values():
            closed_loop(base, "/search", [{"query": t} | body for t in texts], clients, warm_seconds)
        for kind, at in kinds.items():
            for i in range(rounds):
                for side, body in bodies.items():
                    levels.append({"kind": kind, "side": side, "round": i,
                                   **level(base, texts, body, clients, seconds, rate=at)})
    for row in levels:  # the router replica alone: the stage runs there (the shards too, placed in the router)
        row["router_cpu_ms_per_query"] = row["cpu_ms_per_query_by_process"].get("replica router")
    out: dict = {"levels": levels}
    keys = ("qps", "p50_ms", "p99_ms", "server_cpu_ms_per_query", "router_cpu_ms_per_query")
    for kind in kinds:
        rows = {side: [r for r in levels if r["side"] == side and r["kind"] == kind] for side in bodies}
        means = {side: {key: None if any(r[key] is None for r in got) else sum(r[key] for r in got) / len(got)
                        for key in keys} for side, got in rows.items()}
        out[kind] = {"means": means} | {
            f"stage_{key}": None if means["with"][key] is None else means["with"][key] - means["without"][key]
            for key in ("server_cpu_ms_per_query", "router_cpu_ms_per_query")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ranking", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="an index root with an active ranking model")
    ap.add_argument("--queries", type=Path, required=True, help="a BEIR queries.jsonl")
    ap.add_argument("--n", type=int, default=200, help="queries used (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rows-per-shard", type=int, default=67,
                    help="candidates a shard scores in the field-scoring part (200 over 3 shards: %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="in-process rounds over the queries")
    ap.add_argument("--warm-rounds", type=int, default=6,
                    help="in-process rounds over the queries before measuring (default: %(default)s)")
    ap.add_argument("--http-seconds", type=float, default=30, help="0: no HTTP measurement")
    ap.add_argument("--http-rounds", type=int, default=3, help="levels a side over HTTP, alternating")
    ap.add_argument("--http-warm-seconds", type=float, default=30,
                    help="each side searched unmeasured over HTTP first (default: %(default)s)")
    ap.add_argument("--http-rate", type=float, default=50,
                    help="requests a second of the fixed-rate levels over HTTP, below both sides' capacity; 0: closed "
                         "loops only (default: %(default)s)")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--port", type=int, default=18480)
    ap.add_argument("--out", type=Path, default=Path("bench/results/ranking.json"))
    args = ap.parse_args(argv)
    from deployments.config import RouterSettings
    from deployments.search.inprocess import inprocess_pipeline
    from index_format.process import configure_process

    configure_process()
    texts = read_queries(args.queries, args.n)
    pipeline = inprocess_pipeline({"default": args.index}, RouterSettings(cache_size=0))
    if "default" not in pipeline.models:
        raise SystemExit(f"{args.index} has no active ranking model (python -m relevance.rankers list {args.index})")
    record = {"machine": machine(), "index": str(args.index), "queries": len(texts),
              "in_process": in_process(pipeline, texts, args.rounds, args.warm_rounds)}
    print(json.dumps(record["in_process"]), flush=True)
    record["model_alone"] = model_alone(pipeline, texts, args.repeats)
    print(json.dumps(record["model_alone"]), flush=True)
    record["field_scoring"] = field_scoring(args.index, texts, args.rows_per_shard, args.repeats)
    print(json.dumps(record["field_scoring"]), flush=True)
    if args.http_seconds > 0:
        record["http"] = over_http(args.index, texts, args.http_seconds, args.clients, args.port, args.http_rounds,
                                   args.http_warm_seconds, args.http_rate)
        for row in record["http"]["levels"]:
            print(row["kind"], row["side"], {k: row[k] for k in ("qps", "p50_ms", "p99_ms", "server_cpu_ms_per_query",
                                                                 "router_cpu_ms_per_query")}, flush=True)
        for kind in ("closed_loop", "fixed_rate"):
            if kind in record["http"]:
                got = record["http"][kind]
                print(f"stage over HTTP ({kind}), CPU ms a query: server {got['stage_server_cpu_ms_per_query']}, "
                      f"the router replica {got['stage_router_cpu_ms_per_query']}", flush=True)
    record["own_cpu_s"] = own_cpu_s()
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
