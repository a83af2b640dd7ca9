"""BM25 per field on a BEIR corpus: the title weight chosen on the TRAIN queries, measured once on the test queries.

    python -m bench.fields --index /work/out/fields/h384 --data /work/shared/data/scifact \
        [--hybrid-index /work/out/fields/minilm] --out /work/out/fields/fields.json

1. On the train split's judged queries, the keyword leg (``method: keyword``) is searched with
   ``field_weights = {contents: 1, title: w}`` for each w of ``--grid`` (0: contents alone, as before fields); the
   w with the best mean nDCG@10 is chosen (ties: the smaller w).
2. On the test split, once: nDCG@10 and R@100 of BM25 alone and (with ``--hybrid-index``, an index built with a
   real encoder) of the default hybrid search, each without and with the chosen title weight.
3. With ``--hybrid-index``, the title weight is also chosen for hybrid search on the train split (``--hybrid-grid``);
   its test figure is measured only when that weight differs from 0 and from BM25's (else it is a row above).

Searches run through the request pipeline in process (``deployments.search.inprocess``: the router's own code,
real Lucene and FAISS, no reranker, no HTTP); a document ranks at its best chunk. The indexes must be built with
``--bm25-fields title``. Writes a JSON record (machine, git sha, config, figures) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from bench.common import load_beir, machine, write_record
from deployments.edge.schemas import SearchRequest
from deployments.search.inprocess import inprocess_pipeline
from relevance.metrics import evaluate

GRID = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)


def weights_of(title: float) -> dict[str, float] | None:
    return {"contents": 1.0, "title": title} if title else None


def run(pipeline, queries: dict[str, str], method: str, weights: dict[str, float] | None) -> dict[str, dict]:
    """query id -> {doc id: score encoding the rank} (a document at its best chunk)."""
    out = {}
    for qid, text in queries.items():
        answer = asyncio.run(pipeline.search(SearchRequest(query=text, method=method, limit=100,
                                                           include_citations=False, field_weights=weights)))
        docs: list[str] = []
        for r in answer.results:
            if r.doc_id not in docs:
                docs.append(r.doc_id)
        out[qid] = {d: float(len(docs) - i) for i, d in enumerate(docs)}
    return out


def measure(pipeline, queries, qrels, method: str, title: float) -> dict[str, float]:
    t = time.perf_counter()
    figures = evaluate(run(pipeline, queries, method, weights_of(title)), qrels)
    return {k: round(v, 4) for k, v in figures.items()} | {"seconds": round(time.perf_counter() - t, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True, help="index root built with --bm25-fields title")
    parser.add_argument("--data", type=Path, required=True, help="BEIR folder with qrels/train.tsv and qrels/test.tsv")
    parser.add_argument("--hybrid-index", type=Path, help="an index root built with a real encoder, for hybrid")
    parser.add_argument("--grid", type=float, nargs="+", default=list(GRID), help="title weights tried on train")
    parser.add_argument("--hybrid-grid", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.2, 0.3, 0.5],
                        help="title weights tried on train for hybrid search")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    bm25 = inprocess_pipeline({"main": args.index})
    train_q, train_qrels = load_beir(args.data, "train")
    test_q, test_qrels = load_beir(args.data, "test")
    train = {}
    for w in args.grid:
        train[w] = measure(bm25, train_q, train_qrels, "keyword", w)
        print(f"train  bm25 title={w:<5} {train[w]}", flush=True)
    best = max(args.grid, key=lambda w: (train[w]["nDCG@10"], -w))
    print(f"chosen title weight (train nDCG@10): {best}", flush=True)
    test = {"bm25": measure(bm25, test_q, test_qrels, "keyword", 0.0),
            "bm25+title": measure(bm25, test_q, test_qrels, "keyword", best)}
    hybrid_train, hybrid_best = {}, None
    if args.hybrid_index is not None:
        hybrid = inprocess_pipeline({"main": args.hybrid_index})
        test |= {"hybrid": measure(hybrid, test_q, test_qrels, "hybrid", 0.0),
                 "hybrid+title": measure(hybrid, test_q, test_qrels, "hybrid", best)}
        for w in args.hybrid_grid:
            hybrid_train[w] = measure(hybrid, train_q, train_qrels, "hybrid", w)
            print(f"train  hybrid title={w:<5} {hybrid_train[w]}", flush=True)
        hybrid_best = max(args.hybrid_grid, key=lambda w: (hybrid_train[w]["nDCG@10"], -w))
        print(f"chosen title weight for hybrid (train nDCG@10): {hybrid_best}", flush=True)
        if hybrid_best not in (0.0, best):
            test[f"hybrid+title({hybrid_best})"] = measure(hybrid, test_q, test_qrels, "hybrid", hybrid_best)
    for name, figures in test.items():
        print(f"test   {name:<13} {figures}", flush=True)
    write_record(args.out, {"bench": "fields", "machine": machine(), "index": str(args.index),
                            "hybrid_index": str(args.hybrid_index) if args.hybrid_index else None,
                            "train_queries": len(train_q), "test_queries": len(test_q), "grid": args.grid,
                            "train": {str(w): f for w, f in train.items()}, "chosen_title_weight": best,
                            "hybrid_train": {str(w): f for w, f in hybrid_train.items()},
                            "chosen_title_weight_hybrid": hybrid_best,
                            "test": test})
    print(json.dumps({"chosen_title_weight": best, "test": test}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
