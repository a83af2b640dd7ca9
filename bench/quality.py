"""Retrieval quality through the HTTP API, next to Pyserini's own single-index BM25 on the same data.

For each BEIR dataset: the test queries are sent to ``POST /search`` of a running service (started
here from ``--index`` unless ``--url`` is given), once per method (keyword, vector, hybrid RRF, hybrid
weighted, each with and without MMR); chunk results become document rankings (a document ranks at its
best chunk); ir_measures scores nDCG@10, R@100 and RR@10 (MRR@10). The reference row is Pyserini's
``LuceneSearcher`` BM25 (k1=0.9, b=0.4) over one unsharded index of the same title+text documents.

    python -m bench.quality --data ../shared/data --dataset scifact --index bench/out/indexes/scifact-4

With ``--reranker MODEL`` the service also deploys that cross-encoder, and rows "hybrid rrf + rerank@D"
rerank the best D fused candidates for each ``--rerank-depths`` D (those rows return D results, so their
R@100 is not comparable); each row records the mean server-side rerank time per query. ``--reranker
minilm-l6-arch`` serves ms-marco-MiniLM-L-6-v2's architecture with random weights: its latency is the real
model's, its quality is meaningless.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import ir_measures
from ir_measures import RR, R, nDCG

from bench.common import RERANKER_CPUS, load_beir, machine, served
from relevance.evaluate import partial

MEASURES = [nDCG @ 10, R @ 100, RR @ 10]
CONFIGS = {
    "keyword": {"method": "keyword"},
    "vector": {"method": "vector"},
    "hybrid (defaults)": {"method": "hybrid"},  # the service's own settings: nothing else in the request
    "hybrid rrf k=60": {"method": "hybrid", "fusion": "rrf", "rrf_k": 60},
    "hybrid weighted 0.7/0.3": {"method": "hybrid", "fusion": "weighted", "weights": {"dense": 0.7, "keyword": 0.3}},
}
MMR_LAMBDA = 0.7


def rank_run(scored: list[tuple[str, float]]) -> dict[str, float]:
    """Scores that encode the given order (trec_eval would re-break score ties by doc id)."""
    return {d: float(len(scored) - i) for i, (d, _) in enumerate(scored)}


def run_config(base: str, queries: dict[str, str], body: dict, workers: int = 4):
    """(run by rank, raw document scores per query, seconds, errors, stage timings per query).

    A partial answer (a shard or the query encoder late under load: coverage degraded, or a warning) is
    asked again up to twice; one still partial counts as an error, so a figure never hides it."""
    errors = 0
    raw: dict[str, list[tuple[str, float]]] = {}
    stage_ms: list[dict[str, float]] = []

    def one(item):
        nonlocal errors
        qid, text = item
        for _ in range(3):
            r = httpx.post(f"{base}/search", json={"query": text, "limit": 100, "include_citations": False} | body,
                           timeout=120)
            if r.status_code != 200 or not partial(r.json()):
                break
        if r.status_code != 200 or partial(r.json()):
            errors += 1
            if r.status_code != 200:
                return qid, {}
        best: dict[str, float] = {}
        stage_ms.append(r.json()["timings_ms"] | {"reranked": r.json().get("reranked", False)})
        for hit in r.json()["results"]:
            best.setdefault(hit["doc_id"], hit["score"])  # a document ranks at its best chunk
        raw[qid] = list(best.items())
        return qid, rank_run(raw[qid])

    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        run = dict(pool.map(one, queries.items()))
    return run, raw, time.perf_counter() - t, errors, stage_ms


def pyserini_reference(corpus: Path, queries: dict[str, str], work: Path) -> dict:
    from index_format.lucene import boot, build_lucene_index, write_collection

    boot()
    from pyserini.search.lucene import LuceneSearcher

    index = work / "pyserini-flat"
    if not index.exists():
        rows = []
        with open(corpus) as f:
            for line in f:
                d = json.loads(line)
                rows.append((d["_id"], f"{d.get('title', '')}\n{d.get('text', '')}".strip()))
        write_collection(rows, work / "pyserini-coll")
        build_lucene_index(work / "pyserini-coll", index, threads=2)
    searcher = LuceneSearcher(str(index))
    searcher.set_bm25(0.9, 0.4)
    return {qid: [(h.docid, h.score) for h in searcher.search(text, k=100)] for qid, text in queries.items()}


def evaluate(qrels, run) -> dict[str, float]:
    return {str(m): v for m, v in ir_measures.calc_aggregate(MEASURES, qrels, run).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--index", type=Path, help="index to serve (started and stopped here)")
    parser.add_argument("--url", help="an already running service instead of --index")
    parser.add_argument("--port", type=int, default=8400)
    parser.add_argument("--test-split", default="test", metavar="SPLIT", help="the qrels split measured")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reranker", help="deploy this cross-encoder (or minilm-l6-arch) and add rerank rows")
    parser.add_argument("--rerank-depths", type=int, nargs="+", default=[20, 40, 100])
    parser.add_argument("--max-queries", type=int, help="the first N queries only (for slow rerank runs)")
    parser.add_argument("--only-rerank", action="store_true", help="skip the rows without reranking")
    parser.add_argument("--no-mmr", action="store_true", help="skip the MMR rows")
    args = parser.parse_args(argv)
    folder = args.data / args.dataset
    queries, qrels = load_beir(folder, args.test_split)
    if args.max_queries:
        queries = dict(list(queries.items())[: args.max_queries])
        qrels = {q: qrels[q] for q in queries}
    extra = ["--router.cache-size", "0"]
    reranker = args.reranker
    if reranker == "minilm-l6-arch":
        from bench.reranker_throughput import build_minilm_arch

        reranker = build_minilm_arch(None)
    if reranker:
        extra += ["--reranker.model", reranker, "--router.rerank-timeout-s", "600", *RERANKER_CPUS]  # never fall back
    out = args.out or Path(f"bench/out/quality_{args.dataset}.json")
    out.parent.mkdir(parents=True, exist_ok=True)

    record = {"machine": machine(), "dataset": args.dataset, "split": args.test_split, "queries": len(queries),
              "index": str(args.index), "rows": []}
    ref = pyserini_reference(folder / "corpus.jsonl", queries, out.parent / f"pyserini-{args.dataset}")
    ref_run = {q: rank_run(scored) for q, scored in ref.items()}
    record["rows"].append({"config": "Pyserini LuceneSearcher BM25 (one index)"} | evaluate(qrels, ref_run))
    print(record["rows"][-1], flush=True)

    def measure(base: str) -> None:
        for name, body in ({} if args.only_rerank else CONFIGS).items():
            for mmr in (None,) if args.no_mmr else (None, MMR_LAMBDA):
                full = body | {"rerank": False} | ({"mmr_lambda": mmr} if mmr is not None else {})
                run, raw, seconds, errors, _ = run_config(base, queries, full)
                row = {"config": name + (f" + MMR {mmr}" if mmr is not None else ""), "request": full,
                       "seconds": seconds, "errors": errors} | evaluate(qrels, run)
                if name == "keyword" and mmr is None:  # must equal the reference row: check it score by score
                    diffs = [abs(a[1] - b[1]) for q in queries for a, b in zip(raw.get(q, [])[:10], ref[q][:10], strict=False)]
                    row["max_abs_top10_score_diff_vs_pyserini"] = max(diffs) if diffs else None
                record["rows"].append(row)
                print({k: v for k, v in row.items() if k != "request"}, flush=True)
        for depth in args.rerank_depths if args.reranker else []:
            full = {"method": "hybrid", "rerank": True, "rerank_depth": depth, "limit": depth}
            run, raw, seconds, errors, stage_ms = run_config(base, queries, full, workers=1)
            rerank_ms = [t["rerank"] for t in stage_ms if "rerank" in t]
            row = {"config": f"hybrid + rerank@{depth} ({args.reranker})", "request": full, "seconds": seconds,
                   "errors": errors, "mean_rerank_ms": sum(rerank_ms) / max(len(rerank_ms), 1),
                   "mean_total_ms": sum(t["total"] for t in stage_ms) / max(len(stage_ms), 1),
                   "reranked_responses": sum(t["reranked"] for t in stage_ms)} | evaluate(qrels, run)
            record["rows"].append(row)
            print({k: v for k, v in row.items() if k != "request"}, flush=True)

    if args.url:
        measure(args.url)
    else:
        with served(args.index, args.port, extra) as base:
            measure(base)
    out.write_text(json.dumps(record, indent=2))
    print(f"\n{args.dataset} {args.test_split} ({len(queries)} queries), {record['machine']['date']}, "
          f"{record['machine']['cpu']}, {record['machine']['cores']} cores\n")
    print("| config | nDCG@10 | R@100 | MRR@10 |")
    print("|---|---|---|---|")
    for row in record["rows"]:
        print(f"| {row['config']} | {row['nDCG@10']:.4f} | {row['R@100']:.4f} | {row['RR@10']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
