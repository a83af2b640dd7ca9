"""What a 10,000-character query costs against a short one: process CPU per query (every thread: the encoder, the
JVM's BM25, Python) and wall time, searched in-process over ``--index`` (hybrid, ``--limit`` results), and what the
responses said each leg left out.

Short queries are the dataset's own (``--split``); each long one is a short one followed by the texts of corpus
documents drawn at random until it is ``--chars`` long: a question pasted with its context, as a RAG user sends it.
Both sets are searched once to warm up, then ``--rounds`` times, alternating, one query at a time.

    python -m bench.long_queries --index ROOT --data ../shared/data/scifact
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import Counter
from pathlib import Path

from bench.common import load_beir, machine, write_record


def long_queries(short: list[str], corpus: Path, chars: int, seed: int = 0) -> list[str]:
    texts = []
    with open(corpus) as f:
        for line in f:
            if line.strip():
                texts.append(json.loads(line)["text"])
    rng = random.Random(seed)
    out = []
    for q in short:
        text = q
        while len(text) < chars:
            text += " " + rng.choice(texts)
        out.append(text[:chars])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.long_queries", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True, help="a BEIR folder (queries, qrels/SPLIT.tsv, corpus.jsonl)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--chars", type=int, default=10_000)
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench/results/long_queries.json"))
    args = ap.parse_args(argv)

    from index_format.process import configure_process

    configure_process()
    from deployments.config import RouterSettings
    from deployments.edge.schemas import SearchRequest
    from deployments.search.inprocess import inprocess_pipeline

    pipeline = inprocess_pipeline({"default": args.index}, RouterSettings(cache_size=0, max_query_chars=args.chars))
    short = list(load_beir(args.data, args.split)[0].values())[: args.queries]
    long = long_queries(short, args.data / "corpus.jsonl", args.chars)

    async def run(queries: list[str], warnings: Counter) -> tuple[float, list[float]]:
        cpu, walls = time.process_time(), []
        for q in queries:
            t = time.perf_counter()
            answer = await pipeline.search(SearchRequest(query=q, limit=args.limit))
            walls.append(time.perf_counter() - t)
            warnings.update(w.split(":")[0] for w in answer.warnings)
        return (time.process_time() - cpu) / len(queries), walls

    seen = {"short": Counter(), "long": Counter()}
    asyncio.run(run(short, Counter()))
    asyncio.run(run(long, Counter()))
    cpu = {"short": [], "long": []}
    wall = {"short": [], "long": []}
    for _ in range(args.rounds):
        for name, queries in (("short", short), ("long", long)):
            per_query, walls = asyncio.run(run(queries, seen[name]))
            cpu[name].append(per_query)
            wall[name] += walls
    rows = {name: {"queries": len(short), "chars_median": statistics.median(len(q) for q in qs),
                   "cpu_ms_per_query": [round(c * 1000, 2) for c in cpu[name]],
                   "wall_p50_ms": round(statistics.median(wall[name]) * 1000, 2),
                   "warnings": dict(seen[name])}
            for name, qs in (("short", short), ("long", long))}
    record = {"bench": "long_queries", "machine": machine(), "index": str(args.index), "chars": args.chars,
              "limit": args.limit, "rounds": args.rounds, "runs": rows}
    write_record(args.out, record)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
