"""Score normalizations other than min-max, replayed over the legs ``bench.defaults`` recorded.

    python -m bench.normalizations --data ../shared/data --legs bench/out/legs/scifact-c128-1000.json

Weighted fusion adds each leg's normalized scores; min-max is what the service does. This tries z-score
(mean 0, standard deviation 1 per leg) and dividing by the leg's maximum, at a few dense weights, and prints
nDCG@10 on each split next to min-max. A chunk absent from a leg gets nothing from it, as in the service.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.common import load_beir
from relevance.metrics import ndcg_at
from relevance.tuning import doc_ranking


def normalized(leg: list[list], how: str) -> dict[str, float]:
    scores = [s for _, s in leg]
    if not scores:
        return {}
    if how == "z":
        mu, sd = statistics.fmean(scores), statistics.pstdev(scores) or 1.0
        return {c: (s - mu) / sd for c, s in leg}
    if how == "max":
        return {c: s / max(scores) for c, s in leg}
    lo, hi = min(scores), max(scores)
    return {c: 1.0 if hi == lo else (s - lo) / (hi - lo) for c, s in leg}


def ndcg(legs: dict, qrels: dict, how: str, depth: int, dense_weight: float) -> float:
    total = 0.0
    for qid, judged in qrels.items():
        fused: dict[str, float] = {}
        for name, w in (("dense", dense_weight), ("keyword", 1 - dense_weight)):
            for c, s in normalized(legs[qid][name][:depth], how).items():
                fused[c] = fused.get(c, 0.0) + w * s
        ranked = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))
        total += ndcg_at(doc_ranking(ranked, limit=10), judged, 10)
    return total / len(qrels)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.normalizations", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--dataset", default="scifact")
    ap.add_argument("--legs", type=Path, required=True, help="a legs file written by bench.defaults")
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--dense-weights", nargs="+", type=float, default=[0.4, 0.5, 0.6, 0.7])
    args = ap.parse_args(argv)
    legs = json.loads(args.legs.read_text())
    splits = sorted(p.stem for p in (args.data / args.dataset / "qrels").glob("*.tsv"))
    qrels = {split: load_beir(args.data / args.dataset, split)[1] for split in splits}
    print("| normalization | dense weight | " + " | ".join(splits) + " |\n|---|---|" + "---|" * len(splits))
    for how in ("min-max", "z", "max"):
        for w in args.dense_weights:
            cells = " | ".join(f"{ndcg(legs, qrels[s], how, args.candidates, w):.4f}" for s in splits)
            print(f"| {how} | {w} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
