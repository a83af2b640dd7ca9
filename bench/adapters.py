"""What each way of calling the service costs its caller: a raw HTTP POST, the client, and the three framework
adapters, over one served app.

    python -m bench.adapters --index /tmp/scifact-hash [--queries ../shared/data/scifact/queries.jsonl] \
        [--n 3] [--limit 10] --out bench/results/adapters.json
    python -m bench.adapters --url http://127.0.0.1:8000 ...

Five ways of asking the same search (``{"query", "limit"}``, nothing else): (a) ``httpx.Client.post("/search")``
and its JSON decoded, (b) ``SearchClient.search`` (the response as the API's models), (c) the LangChain retriever's
``invoke``, (d) the LlamaIndex retriever's ``retrieve``, (e) the Haystack component's ``run``. Interleaved: each
query is asked all five ways in a rotating order, ``--n`` times over, so drifts of the machine and of the service
fall on every way alike; the first ``--warmup`` queries are not counted. Per way: latency (p50, mean) and the
client process's CPU per query (``time.process_time``: this process's threads, not the service's), whose
difference to (a) is what a layer costs on the caller's side.

``--index`` serves the index (``python -m deployments``, its result cache off so that every way pays a full
search); ``--url`` measures a running service as it is. Writes a JSON record (machine, git sha, config, figures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import httpx

from bench.common import machine, served, write_record

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # no usage events from Haystack's pipelines

BUILT_IN = ["compress a file with gzip", "vitamin D deficiency and bone density", "how do vaccines induce immunity",
            "protein folding in the endoplasmic reticulum", "statins lower cholesterol", "gene expression in cancer",
            "microRNA regulation of T cells", "antibiotic resistance in bacteria"]
WAYS = ["raw_httpx", "client", "langchain", "llamaindex", "haystack"]


def ways(url: str, limit: int) -> dict:
    """Each way as a call of one query, all over the same service; each keeps its own connection pool."""
    from raysearch_client import SearchClient
    from raysearch_client.haystack import RaySearchRetriever as HaystackRetriever
    from raysearch_client.langchain import RaySearchRetriever as LangChainRetriever
    from raysearch_client.llamaindex import RaySearchRetriever as LlamaIndexRetriever

    http, client = httpx.Client(base_url=url, timeout=60), SearchClient(url)
    langchain = LangChainRetriever(url=url, k=limit)
    llamaindex = LlamaIndexRetriever(url, similarity_top_k=limit)
    haystack = HaystackRetriever(url=url, top_k=limit)

    def raw(query: str) -> int:
        r = http.post("/search", json={"query": query, "limit": limit})
        r.raise_for_status()
        return len(r.json()["results"])

    return {"raw_httpx": raw, "client": lambda q: len(client.search(q, limit=limit).results),
            "langchain": lambda q: len(langchain.invoke(q)), "llamaindex": lambda q: len(llamaindex.retrieve(q)),
            "haystack": lambda q: len(haystack.run(q)["documents"])}


def read_queries(path: Path | None, count: int) -> list[str]:
    if path is None:
        return BUILT_IN
    with open(path) as f:
        return [json.loads(line)["text"] for line, _ in zip(f, range(count), strict=False)]


def measure(calls: dict, queries: list[str], n: int, warmup: int) -> dict:
    wall: dict[str, list[float]] = {w: [] for w in WAYS}
    cpu: dict[str, list[float]] = {w: [] for w in WAYS}
    for rep in range(n):
        for i, query in enumerate(queries):
            turn = rep * len(queries) + i
            for way in WAYS[turn % len(WAYS):] + WAYS[:turn % len(WAYS)]:
                c0, t0 = time.process_time(), time.perf_counter()
                found = calls[way](query)
                t1, c1 = time.perf_counter(), time.process_time()
                assert found > 0, (way, query)
                if turn >= warmup:
                    wall[way].append(t1 - t0)
                    cpu[way].append(c1 - c0)
    return {way: {"queries": len(wall[way]), "p50_ms": round(1000 * statistics.median(wall[way]), 2),
                  "mean_ms": round(1000 * statistics.fmean(wall[way]), 2),
                  "client_cpu_ms": round(1000 * statistics.fmean(cpu[way]), 3)} for way in WAYS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", type=Path, help="a built index root (or version folder) to serve")
    where.add_argument("--url", help="a running service instead")
    parser.add_argument("--port", type=int, default=8796, help="where --index is served")
    parser.add_argument("--queries", type=Path, default=None,
                        help="a BEIR queries.jsonl (default: a built-in list of 8 queries)")
    parser.add_argument("--count", type=int, default=100, help="queries read from --queries")
    parser.add_argument("--n", type=int, default=3, help="times each query is asked each way")
    parser.add_argument("--warmup", type=int, default=10, help="first query turns not counted")
    parser.add_argument("--limit", type=int, default=10, help="results asked for")
    parser.add_argument("--out", type=Path, default=Path("bench/results/adapters.json"))
    args = parser.parse_args(argv)

    queries = read_queries(args.queries, args.count)
    serving = (served(args.index, args.port, ["--router.cache-size", "0"]) if args.index is not None
               else nullcontext(args.url.rstrip("/")))
    with serving as url:
        figures = measure(ways(url, args.limit), queries, args.n, args.warmup)
    base = figures["raw_httpx"]["client_cpu_ms"]
    for way, row in figures.items():
        row["client_cpu_ms_over_raw"] = round(row["client_cpu_ms"] - base, 3)
        print(f"{way:<11} p50 {row['p50_ms']:7.2f} ms  mean {row['mean_ms']:7.2f} ms  client CPU "
              f"{row['client_cpu_ms']:6.3f} ms (+{row['client_cpu_ms_over_raw']:.3f})", flush=True)
    write_record(args.out, {"bench": "adapters", "machine": machine(),
                            "config": {"index": str(args.index) if args.index else None, "url": args.url,
                                       "queries": str(args.queries) if args.queries else "built-in",
                                       "distinct_queries": len(queries), "n": args.n, "warmup": args.warmup,
                                       "limit": args.limit, "result_cache": "off" if args.index else "as served"},
                            "figures": figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
