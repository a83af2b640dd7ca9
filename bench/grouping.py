"""Results shaped for RAG on a BEIR corpus: ``group_by: doc_id`` against today's chunk ranking.

    python -m bench.grouping --index /work/out/fields/minilm --data /work/shared/data/scifact \
        [--method hybrid] [--limit 10] [--queries 300] --out bench/results/grouping.json
    python -m bench.grouping --url http://127.0.0.1:8000 --data /work/shared/data/scifact ...

For each judged test query, one page of ``--limit`` results, searched twice, without reranker: through the request
pipeline in process (``--index``, ``deployments.search.inprocess``: the router's own code, real Lucene and FAISS, no
HTTP), or through a served app over HTTP (``--url``, the client's ``SearchClient``; the service's settings apply):
as chunks (today) and with ``group_by: doc_id``. Per page: nDCG@limit of the documents it shows (a document at its
first result, as a RAG context or a result list gets them: a second chunk of a document adds no document), and how
many distinct documents it holds. Both searches rank the same candidates (depths follow ``limit``); grouping only
folds.
Writes a JSON record (machine, git sha, config, figures) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from bench.common import load_beir, machine, write_record
from relevance.metrics import ndcg_at


def page_docs(search, text: str, method: str, limit: int, group_by: str | None) -> list[str]:
    """The documents of one page of results, in order of their first result (repeats kept out)."""
    answer = search(dict(query=text, method=method, limit=limit, group_by=group_by, include_citations=False,
                         rerank=False))
    return [r.doc_id for r in answer.results]


def in_process(index: Path):
    from deployments.edge.schemas import SearchRequest
    from deployments.search.inprocess import inprocess_pipeline

    pipeline = inprocess_pipeline({"main": index})
    return lambda fields: asyncio.run(pipeline.search(SearchRequest(**fields)))


def over_http(url: str):
    from raysearch_client import SearchClient

    client = SearchClient(url)
    return lambda fields: client.search(fields)


def measure(search, queries: dict[str, str], qrels: dict, method: str, limit: int, group_by: str | None) -> dict:
    t = time.perf_counter()
    ndcg = distinct = 0.0
    for qid, text in queries.items():
        shown = page_docs(search, text, method, limit, group_by)
        docs = list(dict.fromkeys(shown))
        ndcg += ndcg_at(docs, qrels[qid], limit)
        distinct += len(docs)
    n = len(queries) or 1
    return {f"nDCG@{limit}": round(ndcg / n, 4), f"distinct_docs@{limit}": round(distinct / n, 2),
            "seconds": round(time.perf_counter() - t, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", type=Path, help="an index root (or version folder), searched in process")
    where.add_argument("--url", help="a served app, searched over HTTP")
    parser.add_argument("--data", type=Path, required=True, help="BEIR folder with queries.jsonl and qrels/test.tsv")
    parser.add_argument("--method", default="hybrid", choices=["hybrid", "keyword", "vector"])
    parser.add_argument("--limit", type=int, default=10, help="results per page (the k of the figures)")
    parser.add_argument("--queries", type=int, default=None, help="the first N judged test queries (default: all)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    search = in_process(args.index) if args.index is not None else over_http(args.url)
    queries, qrels = load_beir(args.data, "test")
    if args.queries:
        queries = dict(list(queries.items())[:args.queries])
    figures = {}
    for name, group_by in (("chunks", None), ("group_by_doc_id", "doc_id")):
        figures[name] = measure(search, queries, qrels, args.method, args.limit, group_by)
        print(f"{name:<16} {figures[name]}", flush=True)
    write_record(args.out, {"bench": "grouping", "machine": machine(),
                            "config": {"index": str(args.index) if args.index else None, "url": args.url,
                                       "path": "in process" if args.index else "HTTP", "data": str(args.data),
                                       "method": args.method, "limit": args.limit, "queries": len(queries)},
                            "figures": figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
