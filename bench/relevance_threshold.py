"""What a relevance_score threshold keeps, on each scale: precision and recall of ``score >= t`` over the results
of judged queries, and how often a nonsense query still has a result above it.

Searches ``--index`` in-process (its active version, hybrid, ``--limit`` results) for the judged queries of
``--split`` and for ``--nonsense`` made-up queries (random letter strings: nothing in any corpus is relevant to
them), three times each: ``relevance_scale: minmax``; ``absolute`` without a calibration (the dense cosine); and
``absolute`` with the root's calibration (``python -m relevance.calibrate``, fitted on another split: it must
exist). For each threshold: precision (the share of results at or above it whose document is judged relevant),
recall (the share of the judged-relevant results returned that are at or above it), and the share of nonsense
queries with a result at or above it; and each scale read as probabilities (log loss, Brier score, expected
calibration error: ``relevance.calibrate.scale_figures``). An unjudged document counts as not relevant.

    python -m relevance.calibrate --index ROOT --data ../shared/data/scifact          # fitted on qrels/train.tsv
    python -m bench.relevance_threshold --index ROOT --data ../shared/data/scifact    # measured on qrels/test.tsv
"""

from __future__ import annotations

import argparse
import asyncio
import random
import string
import sys
import time
from pathlib import Path

from bench.common import load_beir, machine, write_record

THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def nonsense_queries(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(4, 9))) for _ in range(rng.randint(2, 5)))
            for _ in range(n)]


def threshold_table(judged: list[list[tuple[float, bool]]], nonsense: list[list[float]]) -> list[dict]:
    """Per threshold: precision and recall over the judged queries' results, and the share of nonsense queries
    with a result at or above it."""
    results = [r for q in judged for r in q]
    relevant = sum(rel for _, rel in results)
    rows = []
    for t in THRESHOLDS:
        kept = [rel for score, rel in results if score >= t]
        rows.append({"threshold": t, "kept": len(kept),
                     "precision": round(sum(kept) / len(kept), 4) if kept else None,
                     "recall": round(sum(kept) / relevant, 4) if relevant else None,
                     "nonsense_with_a_result": round(sum(any(s >= t for s in q) for q in nonsense) / len(nonsense), 4)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.relevance_threshold", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="an index root with a calibration")
    ap.add_argument("--data", type=Path, required=True, help="a BEIR folder")
    ap.add_argument("--split", default="test", help="the judged queries measured (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--nonsense", type=int, default=100, help="made-up queries (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/relevance_threshold.json"))
    args = ap.parse_args(argv)

    from index_format.process import configure_process

    configure_process()
    from deployments.config import RouterSettings
    from deployments.edge.schemas import SearchRequest
    from deployments.search.inprocess import inprocess_pipeline
    from relevance.calibrate import scale_figures

    pipeline = inprocess_pipeline({"default": args.index}, RouterSettings(cache_size=0))
    calibration = pipeline.calibrations.get("default")
    if calibration is None:
        raise SystemExit(f"{args.index} has no calibration: python -m relevance.calibrate --index {args.index} ...")
    queries, qrels = load_beir(args.data, args.split)
    if f"qrels/{args.split}.tsv" in calibration.fitted.get("source", ""):
        raise SystemExit(f"the calibration was fitted on {args.split}'s judgments: measure another split")
    made_up = nonsense_queries(args.nonsense)

    async def scores(text: str, scale: str) -> list[tuple[str, float]]:
        answer = await pipeline.search(SearchRequest(query=text, limit=args.limit, relevance_scale=scale))
        return [(r.doc_id, r.relevance_score) for r in answer.results], answer.relevance_scales["default"]

    async def measure(name: str, scale: str) -> dict:
        judged, nonsense, named = [], [], set()
        for qid, text in queries.items():
            got, used = await scores(text, scale)
            named.add(used)
            judged.append([(s, qrels[qid].get(doc, 0) > 0) for doc, s in got])
        for text in made_up:
            got, used = await scores(text, scale)
            nonsense.append([s for _, s in got])
        best = sorted(q[0] for q in nonsense if q)
        results = [r for q in judged for r in q]
        return {"scale": name, "relevance_scales": sorted(named), "table": threshold_table(judged, nonsense),
                "as_probabilities": scale_figures([s for s, _ in results], [int(rel) for _, rel in results]),
                "nonsense_best_median": round(best[len(best) // 2], 4) if best else None,
                "judged_best_median": round(sorted(q[0][0] for q in judged if q)[len(judged) // 2], 4)}

    started = time.time()
    runs = [asyncio.run(measure("minmax", "minmax")), asyncio.run(measure("calibrated", "absolute"))]
    pipeline.calibrations.clear()
    runs.insert(1, asyncio.run(measure("cosine (absolute, uncalibrated)", "absolute")))
    record = {"bench": "relevance_threshold", "machine": machine(), "index": str(args.index),
              "data": str(args.data), "split": args.split, "queries": len(queries), "limit": args.limit,
              "nonsense_queries": len(made_up), "calibration": calibration.fitted, "runs": runs,
              "seconds": round(time.time() - started, 1)}
    write_record(args.out, record)
    for run in runs:
        print(f"\n{run['scale']} ({', '.join(run['relevance_scales'])}): best result's median score "
              f"{run['judged_best_median']} judged, {run['nonsense_best_median']} nonsense; read as probabilities: "
              f"{run['as_probabilities']}")
        print("| threshold | kept | precision | recall | nonsense queries with a result |")
        for row in run["table"]:
            print(f"| {row['threshold']} | {row['kept']} | {row['precision']} | {row['recall']} | "
                  f"{row['nonsense_with_a_result']} |")
    print(f"\nwritten to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
