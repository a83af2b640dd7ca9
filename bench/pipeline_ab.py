"""Two versions of the search pipeline in one process, asked the same queries in turn: the CPU a query each spends.

    python -m bench.pipeline_ab --before ../before --index INDEX --data ../shared/data/scifact [--processes 4]

``--before`` is another checkout (``git worktree add ../before HEAD~1``): its ``deployments`` package is copied
under another name (``before_deployments``, its imports rewritten) and loaded beside this checkout's. Every other
package (``index_format``, the engines) is this checkout's, so a change outside ``deployments`` is not compared.

Each query is embedded once and its vector handed to both (the query encoder is left out), then asked of one version
and of the other, which goes first alternating, the response rendered as the service renders it; each one's main-
thread CPU (``time.thread_time``) is summed over the queries. On a shared machine CPU speed moves by tens of percent
within minutes; asked in turn, both versions meet the same moments, so their ratio holds where two runs minutes apart
say nothing. The collector is set as a replica sets it (``settle_heap``). The first round also checks that both
answer every page with the same results and scores.

Within one process the two versions are not on equal terms, whatever the code: asked of the same commit on both sides
(an A/A run), one process read -5.4% to -2.8% in each of its rounds and another +2.4% to +3.6% (bench/README.md, "The
A/B tool against itself"), steady within a process and not across them (where each side's objects and mappings land in
memory). So a run is ``--processes`` processes (4 by default), each side built first in every other one, and the
change is read as the median of the processes' medians, with their range beside it: a change inside that range of an
A/A run is none.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

PACKAGE = "deployments"
RENAMED = "before_deployments"


def load_before(checkout: Path, into: Path):
    """``checkout``'s deployments package, importable as ``before_deployments``."""
    shutil.copytree(checkout / PACKAGE, into / RENAMED, ignore=shutil.ignore_patterns("__pycache__"))
    pattern = re.compile(rf"\b(from|import) {PACKAGE}\b|(['\"]){PACKAGE}\.")
    for path in (into / RENAMED).rglob("*.py"):
        text = path.read_text()
        path.write_text(pattern.sub(lambda m: f"{m.group(1)} {RENAMED}" if m.group(1) else f"{m.group(2)}{RENAMED}.",
                                    text))
    sys.path.insert(0, str(into))


def pipelines(index: Path, first: str = "before"):
    """(before, after): each a pipeline over ``index`` with the modules to ask it (request model, response JSON);
    ``first``: the side built first (see the module)."""
    import importlib

    built = {}
    for side, package in sorted((("before", RENAMED), ("after", PACKAGE)), key=lambda s: s[0] != first):
        inprocess = importlib.import_module(f"{package}.search.inprocess")
        schemas = importlib.import_module(f"{package}.edge.schemas")
        config = importlib.import_module(f"{package}.config")
        pipeline = inprocess.inprocess_pipeline({"default": index}, settings=config.RouterSettings(cache_size=0))
        built[side] = (pipeline, schemas.SearchRequest, schemas.response_json)
    return [built["before"], built["after"]]


async def ask(side, query: str, vector, limit: int) -> tuple[float, dict]:
    pipeline, request, to_json = side
    embedded = {(id(pipeline.collections["default"].encoder), query): vector}
    t = time.thread_time()
    body = to_json(await pipeline.search(request(query=query, limit=limit), rendered=True, embedded=embedded))
    return time.thread_time() - t, body


async def one_round(sides, queries, vectors, limit: int, check: bool) -> tuple[list[float], int]:
    spent, same = [0.0, 0.0], 0
    for i, (query, vector) in enumerate(zip(queries, vectors, strict=True)):
        bodies: list = [None, None]
        for side in ((0, 1) if i % 2 else (1, 0)):
            seconds, bodies[side] = await ask(sides[side], query, vector, limit)
            spent[side] += seconds
        if check:
            # Every field of every result (scores, relevance_score, texts), the total and the scales; not the cursor,
            # which holds when it was made.
            pages = [{k: v for k, v in json.loads(b).items() if k in ("results", "total", "relevance_scales")}
                     for b in bodies]
            same += pages[0] == pages[1]
    return spent, same


def one_process(args) -> dict:
    """Every round of one process: each round's CPU a query for both sides, and how many pages were the same."""
    with tempfile.TemporaryDirectory() as tmp:
        load_before(args.before.resolve(), Path(tmp))
        from deployments.serve.heap import settle_heap

        sides = pipelines(args.index, args.first)
        with open(args.data / "queries.jsonl") as f:
            queries = [json.loads(line)["text"] for line in f][:args.queries]
        vectors = asyncio.run(sides[1][0].collections["default"].encoder.embed_many(queries))
        settle_heap()
        asyncio.run(one_round(sides, queries, vectors, args.limit, False))  # warm-up
        rounds, identical = [], 0
        for r in range(args.rounds):
            (before, after), same = asyncio.run(one_round(sides, queries, vectors, args.limit, r == 0))
            before, after = before / len(queries) * 1000, after / len(queries) * 1000
            rounds.append({"before_ms": round(before, 3), "after_ms": round(after, 3),
                           "change": round((after - before) / before, 4)})
            if r == 0:
                identical = same
    return {"first": args.first, "rounds": rounds, "identical_pages": identical, "queries": len(queries)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (its deployments package)")
    parser.add_argument("--index", type=Path, required=True, help="index root built by index_build")
    parser.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder (its queries.jsonl)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="rounds a process, after one of warm-up")
    parser.add_argument("--processes", type=int, default=4,
                        help="processes, one after another, each side built first in every other one (see above)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--first", choices=("before", "after"), default="before", help=argparse.SUPPRESS)
    parser.add_argument("--one-process", type=Path, help=argparse.SUPPRESS)  # a child: its figures to this file
    args = parser.parse_args(argv)
    if args.one_process:
        args.one_process.write_text(json.dumps(one_process(args)))
        return

    processes = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in range(args.processes):
            first = ("before", "after")[p % 2]
            out = Path(tmp) / f"{p}.json"
            done = subprocess.run([sys.executable, "-m", "bench.pipeline_ab", "--before", str(args.before), "--index",
                            str(args.index), "--data", str(args.data), "--queries", str(args.queries), "--limit",
                            str(args.limit), "--rounds", str(args.rounds), "--first", first, "--one-process",
                            str(out)], capture_output=True, text=True)
            if done.returncode:  # the child's own error, not only its exit status (its stderr is Lucene's chatter)
                raise SystemExit(f"process {p} failed:\n{done.stderr[-3000:]}")
            got = json.loads(out.read_text())
            got["median_change"] = median([r["change"] for r in got["rounds"]])
            processes.append(got)
            rounds = ", ".join(f"{r['before_ms']:.2f} -> {r['after_ms']:.2f} ms ({r['change']:+.1%})"
                               for r in got["rounds"])
            print(f"process {p} ({first} built first): {rounds}; pages the same: "
                  f"{got['identical_pages']}/{got['queries']}", flush=True)
    medians = [p["median_change"] for p in processes]
    change = median(medians)
    print(f"change: {change:+.1%} (median of {len(processes)} processes' medians; they ranged {min(medians):+.1%} to "
          f"{max(medians):+.1%}); every field of every page the same in each process: "
          f"{all(p['identical_pages'] == p['queries'] for p in processes)}")
    if args.out:
        from bench.common import machine

        args.out.write_text(json.dumps({"before": str(args.before), "index": str(args.index), "limit": args.limit,
                                        "machine": machine(), "processes": processes, "median_change": change,
                                        "range": [min(medians), max(medians)]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
