"""The experiments behind the service's fusion defaults: tuned on SciFact train, confirmed elsewhere.

    python -m bench.defaults --data ../shared/data \\
        --index scifact-whole=bench/out/indexes/scifact-4 --index scifact-c128=bench/out/indexes/scifact-c128 \\
        --index cranfield-whole=bench/out/indexes/cranfield-4 --index cranfield-c128=bench/out/indexes/cranfield-c128

Titles, at the default setting only:

    python -m bench.defaults --data ../shared/data --fusions weighted --dense-weights 0.5 --candidates 200 \
        --index scifact-c128=... --index scifact-c128notitle=... --index cranfield-whole=... \
        --index cranfield-wholenotitle=... --out bench/out/defaults-titles.json

For each index (NAME=PATH; the dataset is NAME's part before the first '-'), the service is started,
every judged query of every split is searched once over HTTP with ``debug: true`` at the deepest
candidate depth, and both recorded legs are kept under ``bench/out/legs/``. Every setting (fusion
method, RRF k, dense weight, candidates per leg, and how a document's chunks rank it) is then
replayed with the router's fusion code and scored by nDCG@10 on every split. The choice is made on
SciFact *train* of the default (128-word chunk) index alone; the table reports the other columns beside it.

How a document is ranked from chunk results ("aggregate"):
  chunk-max   fuse chunks, a document at its best fused chunk (what the service returns)
  chunk-sum   fuse chunks, a document by the sum of its chunks' fused scores
  doc-max     each leg collapsed to documents (best chunk) first, then fused
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm import tqdm

from bench.common import load_beir, machine, served
from relevance.tune import Service
from relevance.tuning import AGGREGATES, Legs, grid, mean, per_query_ndcg


def record(name: str, index: Path, data: Path, depth: int, port: int, out: Path) -> dict:
    path = out / f"{name}-{depth}.json"
    if path.is_file():
        return json.loads(path.read_text())
    dataset = name.split("-")[0]
    splits = sorted(p.stem for p in (data / dataset / "qrels").glob("*.tsv"))
    texts: dict[str, str] = {}
    for split in splits:
        queries, _ = load_beir(data / dataset, split)
        texts |= queries
    with served(index, port, ["--router.cache-size", "0"]) as base:
        legs = Service(base, {}, None, workers=2, progress=True).record_legs(texts, depth)
    payload = {q: {"dense": leg.dense, "keyword": leg.keyword} for q, leg in legs.items()}
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.defaults", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="folder of BEIR datasets (scifact, cranfield)")
    ap.add_argument("--index", action="append", required=True, metavar="NAME=PATH",
                    help="an index to serve; NAME starts with the dataset (scifact-whole=...)")
    ap.add_argument("--depth", type=int, default=1000, help="candidates per leg recorded (the deepest tried)")
    ap.add_argument("--candidates", nargs="+", type=int, default=[50, 100, 200, 400, 1000])
    ap.add_argument("--fusions", nargs="+", default=["rrf", "weighted"], choices=["rrf", "weighted"])
    ap.add_argument("--dense-weights", nargs="+", type=float, default=[round(0.1 * i, 1) for i in range(1, 10)])
    ap.add_argument("--train", default="scifact-c128:train", help="INDEX:SPLIT the defaults are chosen on")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--legs", type=Path, default=Path("bench/out/legs"))
    ap.add_argument("--out", type=Path, default=Path("bench/out/defaults.json"))
    args = ap.parse_args(argv)

    indexes = dict(spec.split("=", 1) for spec in args.index)
    columns = []  # (index name, split, qrels, legs)
    for name, index in indexes.items():
        legs_raw = record(name, Path(index), args.data, args.depth, args.port, args.legs)
        legs = {q: Legs(tuple(map(tuple, v["dense"])), tuple(map(tuple, v["keyword"]))) for q, v in legs_raw.items()}
        dataset = name.split("-")[0]
        for split in sorted(p.stem for p in (args.data / dataset / "qrels").glob("*.tsv")):
            _, qrels = load_beir(args.data / dataset, split)
            columns.append((name, split, qrels, legs))

    settings = grid(fusions=args.fusions, dense_weights=args.dense_weights, candidates=args.candidates)
    rows = []
    for setting in tqdm(settings, desc="replaying"):
        for aggregate in AGGREGATES:
            row = {"setting": setting.label(), "aggregate": aggregate, **setting.__dict__}
            for name, split, qrels, legs in columns:
                row[f"{name}:{split}"] = mean(per_query_ndcg(legs, qrels, setting, aggregate=aggregate).values())
            rows.append(row)
    train_key = args.train
    best = max((r for r in rows if r["aggregate"] == "chunk-max"), key=lambda r: r[train_key])  # what the service does
    reference = {"rrf k=60": lambda r: r["fusion"] == "rrf" and r["rrf_k"] == 60,
                 "weighted 0.5": lambda r: r["fusion"] == "weighted" and r["dense_weight"] == 0.5}
    keys = [f"{n}:{s}" for n, s, *_ in columns]
    print(f"\nchosen on {train_key}: {best['setting']}, {best['aggregate']}")
    print("| setting | aggregate | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    shown = sorted(rows, key=lambda r: -r[train_key])[:10]
    for pick in reference.values():
        shown += [r for r in rows if pick(r) and r["candidates"] == 1000 and r["aggregate"] == "chunk-max"]
    for r in shown:
        print(f"| {r['setting']} | {r['aggregate']} | " + " | ".join(f"{r[k]:.4f}" for k in keys) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine(), "train": train_key, "chosen": best, "rows": rows},
                                   indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
