"""What was learned from judgments is worth: nDCG@10 on held-out queries for hybrid search over the shipped
encoder and over a fine-tuned one, each without and with a trained reranker at several depths.

Every index is searched in-process with the service's own pipeline and default settings (hybrid,
weighted 0.5/0.5 over 200 candidates, ``limit`` 100, cache off); a document ranks at its best chunk; the
held-out split's qrels judge it. With ``--reranker``, the same pipeline reranks the best ``depth`` fused
candidates with that cross-encoder (on this machine's CPU unless a GPU is present), over the first
``--rerank-queries`` queries (every row of one index is scored over the same queries, the no-rerank row
included), and the mean rerank time per query is recorded.

    python -m bench.learned --data ../shared/data --dataset scifact \\
        --index shipped=bench/out/indexes/scifact-3 --index tuned=bench/out/indexes/scifact-tuned \\
        --reranker bench/out/models/reranker-scifact --depths 20 40 100 --rerank-queries 100
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from bench.common import load_beir, machine, write_record
from relevance.metrics import evaluate


def run_queries(pipeline, queries: dict[str, str], limit: int = 100, **request) -> tuple[dict, float]:
    """(query id -> document -> score by rank, mean ms of the rerank stage). The service reranks at least
    the page it returns (``max(rerank_depth, limit)``), so a rerank at depth d asks for ``limit=d``."""
    from deployments.edge.schemas import SearchRequest

    run, rerank_ms = {}, []

    async def go():
        for qid, text in queries.items():
            response = await pipeline.search(SearchRequest(query=text, limit=limit, include_citations=False,
                                                           **request))
            best: list[str] = []
            for r in response.results:
                if r.doc_id not in best:
                    best.append(r.doc_id)
            run[qid] = {d: float(len(best) - i) for i, d in enumerate(best)}
            if "rerank" in response.timings_ms:
                rerank_ms.append(response.timings_ms["rerank"])

    asyncio.run(go())
    return run, (sum(rerank_ms) / len(rerank_ms) if rerank_ms else 0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.learned", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--dataset", default="scifact")
    ap.add_argument("--test-split", default="test", metavar="SPLIT", help="the held-out qrels split that judges")
    ap.add_argument("--index", action="append", required=True, metavar="LABEL=PATH")
    ap.add_argument("--methods", nargs="*", default=["hybrid"], help="methods scored without a reranker")
    ap.add_argument("--candidates", type=int, nargs="*", default=[0],
                    help="candidate depths tried for hybrid rows (0: the service's default rule)")
    ap.add_argument("--reranker", default=None, help="a trained cross-encoder folder")
    ap.add_argument("--depths", type=int, nargs="*", default=[20, 40, 100])
    ap.add_argument("--rerank-queries", type=int, default=100)
    ap.add_argument("--held-out-from", type=Path, default=None,
                    help="a trained model folder whose training.json (or ranker.json) lists held-out query ids: judge "
                         "only those")
    ap.add_argument("--ranking-models", nargs="*", default=[], metavar="ID",
                    help="ranking models published under the --index roots, each scored over the same queries as "
                         "if it were active (a row each), beside the active one, on the root that holds it")
    ap.add_argument("--out", type=Path, default=Path("bench/results/learned.json"))
    args = ap.parse_args(argv)

    from deployments.config import RouterSettings
    from deployments.search.inprocess import InProcessReranker, inprocess_pipeline
    from index_format.rankers import list_rankers
    from relevance.rankers import load_model

    published = {spec: set(list_rankers(spec.split("=", 1)[1])) if args.ranking_models else set() for spec in args.index}
    unknown = set(args.ranking_models) - set().union(*published.values())
    if unknown:
        raise SystemExit(f"--ranking-models: {', '.join(sorted(unknown))} published under none of the --index roots")
    queries, qrels = load_beir(args.data / args.dataset, args.test_split)
    if args.held_out_from is not None:
        import json

        written = args.held_out_from / "training.json"  # an encoder's or a reranker's; a ranking model's otherwise
        written = written if written.is_file() else args.held_out_from / "ranker.json"
        held = json.loads(written.read_text())["data"]["held_out_query_ids"]
        queries = {q: t for q, t in queries.items() if q in set(held)}
    record: dict = {"machine": machine(), "dataset": args.dataset, "split": args.test_split, "queries": len(queries),
                    "held_out_from": str(args.held_out_from) if args.held_out_from else None,
                    "reranker": args.reranker, "rows": []}
    scorer = None
    if args.reranker:
        from deployments.search.reranking import CrossEncoderScorer

        scorer = CrossEncoderScorer(args.reranker, max_length=256)
    subset = dict(list(queries.items())[: args.rerank_queries])
    for spec in args.index:
        label, path = spec.split("=", 1)
        settings = RouterSettings(cache_size=0, rerank_timeout_s=600, request_timeout_s=3600)
        pipeline = inprocess_pipeline({"default": Path(path)}, settings,
                                      reranker=InProcessReranker(scorer) if scorer else None)
        for method in args.methods:
            for candidates in (args.candidates if method == "hybrid" else [0]):
                t = time.perf_counter()
                extra = {"candidates": candidates} if candidates else {}
                other, _ = run_queries(pipeline, queries, rerank=False, method=method, ranking_model=False, **extra)
                row = {"index": label, "path": path, "method": method, "candidates": candidates or "default",
                       "rerank_depth": 0, "queries": len(queries), **evaluate(other, {q: qrels[q] for q in queries}),
                       "seconds": round(time.perf_counter() - t, 1)}
                record["rows"].append(row)
                print(row, flush=True)
        active = pipeline.models.get("default")
        others = [load_model(path, m)[1] for m in args.ranking_models
                  if m in published[spec] and (active is None or m != active.id)]
        for model in ([active] if active is not None else []) + others:  # each as if active, the same queries
            pipeline.models["default"] = model
            t = time.perf_counter()
            ranked, _ = run_queries(pipeline, queries, rerank=False, ranking_model=True)
            row = {"index": label, "path": path, "method": "hybrid", "candidates": "default", "rerank_depth": 0,
                   "ranking_model": model.id, "active": model is active, "queries": len(queries),
                   **evaluate(ranked, {q: qrels[q] for q in queries}), "seconds": round(time.perf_counter() - t, 1)}
            record["rows"].append(row)
            print(row, flush=True)
        if active is not None:
            pipeline.models["default"] = active
        run, _ = run_queries(pipeline, queries, rerank=False, ranking_model=False)
        if scorer is None:
            continue
        plain_subset = evaluate({q: run[q] for q in subset}, {q: qrels[q] for q in subset})
        record["rows"].append({"index": label, "method": "hybrid", "candidates": "default", "rerank_depth": 0,
                               "queries": len(subset), **plain_subset})
        for depth in args.depths:
            sub_run, ms = run_queries(pipeline, subset, limit=depth, rerank=True, rerank_depth=depth, ranking_model=False)
            # Only the reranked top `depth` come back: recall at 100 would be recall at the depth.
            row = {"index": label, "method": "hybrid", "candidates": "default", "rerank_depth": depth,
                   "queries": len(subset), **evaluate(sub_run, {q: qrels[q] for q in subset}) | {"R@100": None},
                   "rerank_ms_per_query": round(ms, 1)}
            record["rows"].append(row)
            print(row, flush=True)
    write_record(args.out, record)
    print("| index | method | candidates | rerank depth | queries | nDCG@10 | R@100 | rerank ms/query |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in record["rows"]:
        print(f"| {r['index']} | {r['method']}{' + ranking model ' + r['ranking_model'] if r.get('ranking_model') else ''} | {r['candidates']} | {r['rerank_depth'] or '-'} | {r['queries']} | "
              f"{r['nDCG@10']:.4f} | {'-' if r['R@100'] is None else format(r['R@100'], '.4f')} | "
              f"{r.get('rerank_ms_per_query', '-')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
