"""Two versions of the search pipeline in one process, asked the same queries in turn: the CPU a query each spends.

    python -m bench.pipeline_ab --before ../before --index INDEX --data ../shared/data/scifact [--rounds 5]

``--before`` is another checkout (``git worktree add ../before HEAD~1``): its ``deployments`` package is copied
under another name (``before_deployments``, its imports rewritten) and loaded beside this checkout's. Every other
package (``index_format``, the engines) is this checkout's, so a change outside ``deployments`` is not compared.

Each query is embedded once and its vector handed to both (the query encoder is left out), then asked of one version
and of the other, which goes first alternating, the response rendered as the service renders it; each one's main-
thread CPU (``time.thread_time``) is summed over the queries. On a shared machine CPU speed moves by tens of percent
within minutes; asked in turn, both versions meet the same moments, so their ratio holds where two runs minutes apart
say nothing. The collector is set as a replica sets it (``settle_heap``). The first round also checks that both
answer every page with the same results and scores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

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


def pipelines(index: Path):
    """(before, after): each a pipeline over ``index`` with the modules to ask it (request model, response JSON)."""
    import importlib

    out = []
    for package in (RENAMED, PACKAGE):
        inprocess = importlib.import_module(f"{package}.search.inprocess")
        schemas = importlib.import_module(f"{package}.edge.schemas")
        config = importlib.import_module(f"{package}.config")
        pipeline = inprocess.inprocess_pipeline({"default": index}, settings=config.RouterSettings(cache_size=0))
        out.append((pipeline, schemas.SearchRequest, schemas.response_json))
    return out


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (its deployments package)")
    parser.add_argument("--index", type=Path, required=True, help="index root built by index_build")
    parser.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder (its queries.jsonl)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5, help="rounds after one of warm-up")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        load_before(args.before.resolve(), Path(tmp))
        from deployments.serve.heap import settle_heap

        sides = pipelines(args.index)
        with open(args.data / "queries.jsonl") as f:
            queries = [json.loads(line)["text"] for line in f][:args.queries]
        vectors = asyncio.run(sides[1][0].collections["default"].encoder.embed_many(queries))
        settle_heap()
        asyncio.run(one_round(sides, queries, vectors, args.limit, False))  # warm-up
        rounds = []
        for r in range(args.rounds):
            (before, after), same = asyncio.run(one_round(sides, queries, vectors, args.limit, r == 0))
            before, after = before / len(queries) * 1000, after / len(queries) * 1000
            rounds.append({"before_ms": round(before, 3), "after_ms": round(after, 3),
                           "change": round((after - before) / before, 4)})
            if r == 0:
                identical = same
            print(f"round {r}: before {before:.2f} ms, after {after:.2f} ms of main-thread CPU a query "
                  f"({(after - before) / before:+.1%})", flush=True)
    changes = sorted(r["change"] for r in rounds)
    print(f"pages identical (every result field, total, scales): {identical}/{len(queries)}; median change {changes[len(changes) // 2]:+.1%}")
    if args.out:
        args.out.write_text(json.dumps({"before": str(args.before), "index": str(args.index), "queries": len(queries),
                                        "limit": args.limit, "rounds": rounds, "identical_pages": identical,
                                        "median_change": changes[len(changes) // 2]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
