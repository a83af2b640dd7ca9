"""Evaluate a running service against judgments: one command, one table.

    python -m relevance.evaluate --url http://127.0.0.1:8000 --data path/to/beir/scifact
    python -m relevance.evaluate --url ... --queries q.jsonl --qrels judged.tsv --method keyword

Sends every judged query to ``POST /search`` (``limit`` 100, so Recall@100 means something), ranks each
document at its best chunk, and prints nDCG@10, Recall@100 and MRR@10, plus context precision and
recall at k: how much of what a RAG prompt would receive (the first k chunks) comes from relevant
documents, and how many relevant documents it covers. The judgments can be any BEIR qrels file, or
the service's own (``GET /feedback/qrels``, ``python -m deployments.judgments export``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from raysearch_client import SearchClient, SearchServiceError
from raysearch_client.models import SearchRequest, SearchResponse
from tqdm import tqdm

from deployments.edge import schemas
from index_format.process import configure_process
from relevance.metrics import evaluate
from relevance.qrels import read_qrels


def read_queries(path: Path) -> dict[str, str]:
    with open(path, encoding="utf-8") as f:
        return {str(q["_id"]): q["text"] for q in map(json.loads, filter(str.strip, f))}


def partial(answer: SearchResponse) -> bool:
    return bool(answer.coverage.degraded or answer.warnings)


def search_all(client: SearchClient, queries: dict[str, str], body: dict, workers: int, progress: bool):
    """(run: qid -> doc -> score, chunk runs: qid -> document of each returned chunk, failures)."""
    run: dict[str, dict[str, float]] = {}
    chunks: dict[str, list[str]] = {}
    failures: list[str] = []

    def one(item):
        # A partial answer (a shard or the encoder late: coverage degraded, or a warning) is asked again; one
        # that stays partial is counted as failed, so the figures never quietly include it. The client itself
        # sends a 503 with Retry-After again.
        qid, text = item
        for attempt in range(3):
            try:
                answer = client.search(SearchRequest(query=text, limit=100, include_citations=False, **body))
            except SearchServiceError as e:
                return qid, e
            if not partial(answer):
                break
            time.sleep(1 + attempt)
        return qid, answer

    with ThreadPoolExecutor(workers) as pool, tqdm(total=len(queries), desc="queries", disable=not progress) as bar:
        for qid, answer in pool.map(one, queries.items()):
            bar.update(1)
            if isinstance(answer, SearchServiceError):
                failures.append(f"{qid}: {answer}")
                continue
            if partial(answer):
                failures.append(f"{qid}: a partial answer: {answer.warnings or answer.coverage}")
                continue
            chunks[qid] = [hit.doc_id for hit in answer.results]
            best: dict[str, float] = {}
            for rank, hit in enumerate(answer.results):
                best.setdefault(hit.doc_id, float(len(answer.results) - rank))  # the order the service gave
            run[qid] = best
    return run, chunks, failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m relevance.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the running service")
    ap.add_argument("--data", type=Path, help="a BEIR folder (queries.jsonl, qrels/SPLIT.tsv)")
    ap.add_argument("--test-split", default="test", metavar="SPLIT",
                    help="with --data: the qrels split measured (default: %(default)s)")
    ap.add_argument("--queries", type=Path, help="queries.jsonl (instead of --data)")
    ap.add_argument("--qrels", type=Path, help="qrels TSV (instead of --data)")
    ap.add_argument("--collection", help="search this collection (default: the service's default)")
    ap.add_argument("--method", choices=["hybrid", "vector", "keyword"], default="hybrid")
    ap.add_argument("--k", type=int, default=10, help="cut-off of nDCG, MRR and the context measures")
    ap.add_argument("--request", type=json.loads, default={}, metavar="JSON",
                    help='more request fields, e.g. \'{"rerank": true, "fusion": "weighted"}\'')
    ap.add_argument("--api-key", help="sent as a bearer token when the service has keys on")
    ap.add_argument("--workers", type=int, default=2, help="requests in flight")
    ap.add_argument("--out", type=Path, help="also write the figures here as JSON")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    configure_process()

    queries_path = args.queries or (args.data / "queries.jsonl" if args.data else None)
    qrels_path = args.qrels or (args.data / "qrels" / f"{args.test_split}.tsv" if args.data else None)
    if queries_path is None or qrels_path is None:
        ap.error("give --data, or both --queries and --qrels")
    try:
        qrels = read_qrels(qrels_path)
        queries = {q: t for q, t in read_queries(queries_path).items() if q in qrels}
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not queries:
        print(f"error: no query of {queries_path} has judgments in {qrels_path}", file=sys.stderr)
        return 1
    body = {"method": args.method} | ({"collections": [args.collection]} if args.collection else {}) | args.request
    try:
        schemas.SearchRequest(query="checked", **body)  # the server's every rule, before any search is sent
    except (ValueError, TypeError) as e:
        print(f"error: --request makes no valid search: {e}", file=sys.stderr)
        return 1
    try:
        with SearchClient(args.url, api_key=args.api_key, timeout=300) as client:
            run, chunks, failures = search_all(client, queries, body, args.workers, not args.no_progress)
    except httpx.HTTPError as e:
        print(f"error: cannot reach {args.url}: {e}", file=sys.stderr)
        return 1
    figures = evaluate(run, {q: qrels[q] for q in queries}, chunks, k=args.k)  # a failed query counts 0
    print(f"\n{len(queries)} judged queries, {len(failures)} failed, request {json.dumps(body)}")
    for name, value in figures.items():
        print(f"  {name:24} {value:.4f}" if name != "queries" else f"  {'queries evaluated':24} {value}")
    for line in failures[:5]:
        print(f"  failed: {line}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"request": body, "figures": figures, "failures": failures}, indent=2))
    return 0 if not failures else 2


if __name__ == "__main__":
    raise SystemExit(main())
