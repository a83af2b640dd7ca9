"""A check of the ranking model's activation guard itself: over repeated splits of a collection's judged queries,
how often a model the guard accepts then lowers nDCG@10 on queries it never saw, with the guard before this change
(activate when not worse on the held-out queries) and with ``relevance.guard`` (a gain above 0 with 95%
confidence, on at least 50 held-out queries).

Each split draws the judged queries apart as a user holding new queries back would (``--new-share`` of them new,
by a hash of the query id salted with the split's number), then trains as ``relevance.train_ranker`` does on the
rest: a ``--validation-share`` of it held out, the remainder cross-validated (5 folds choose the trees) and fitted.
Both guards judge the model on the held-out queries against the order without a model; the new queries say what
activating it would have done. Every query's candidates and features are collected once (``--candidates FILE``
keeps them for another run).

    python -m bench.guard_check --index ROOT --data ../shared/data/scifact --split train --splits 20
    python -m bench.guard_check --index ROOT --data ../shared/data/cranfield --split test --test-split none
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

from bench.common import machine, write_record

HARM = 0.005  # the line: no accepted model may lower new-query nDCG@10 by more than this
# Other rules measured beside the guard's own, on the same models: (least held-out queries, one-sided confidence).
VARIANTS = ((30, 0.95), (30, 0.99), (50, 0.95), (50, 0.99))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.guard_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--split", default="train")
    ap.add_argument("--test-split", default="test", help="queries it also judges are left out ('none': none)")
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--new-share", type=float, default=0.5)
    ap.add_argument("--validation-share", type=float, default=0.2)
    ap.add_argument("--depth", type=int, default=200)
    ap.add_argument("--candidates", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from index_format.process import configure_process

    configure_process()
    from relevance.guard import decide
    from relevance.ranking_data import collect, ndcg_per_query, open_pipeline
    from relevance.train_ranker import cross_validate, feature_names, fit, scorer
    from relevance.training import beir_judgments
    from relevance.tuning import split_queries

    judged = beir_judgments(args.data, args.split, args.test_split)
    queries = {q: t for q, t in judged.queries.items() if any(g > 0 for g in judged.qrels[q].values())}
    started = time.time()
    if args.candidates is not None and args.candidates.is_file():
        data = pickle.loads(args.candidates.read_bytes())
    else:
        data = collect(open_pipeline(args.index, args.depth), queries, judged.qrels)
        if args.candidates is not None:
            args.candidates.write_bytes(pickle.dumps(data))
    collected_s = time.time() - started
    by_id = {q.query_id: q for q in data}
    names = feature_names(data)
    rows = []
    for r in range(args.splits):
        training, new = split_queries(queries, args.new_share, seed=f"guard-check-{r}")
        fit_ids, held_ids = split_queries(training, args.validation_share, seed=f"ranker-{r}")
        fit_data, held, fresh = ([by_id[q] for q in ids] for ids in (fit_ids, held_ids, new))
        trees = cross_validate(fit_data, judged.qrels, names, 5)["trees"]
        model = scorer(fit(fit_data, names, trees), names)
        held_model, held_plain = ndcg_per_query(held, judged.qrels, model), ndcg_per_query(held, judged.qrels)
        new_model, new_plain = ndcg_per_query(fresh, judged.qrels, model), ndcg_per_query(fresh, judged.qrels)
        verdict = decide(held_model, held_plain, share=args.validation_share)
        variants = {f"{n}q@{c:g}": decide(held_model, held_plain, min_queries=n, confidence=c)["accept"]
                    for n, c in VARIANTS}
        held_gain = (sum(held_model.values()) - sum(held_plain.values())) / len(held)
        rows.append({"split": r, "fit": len(fit_data), "held_out": len(held), "new": len(fresh), "trees": trees,
                     "held_out_gain": round(held_gain, 4),
                     "new_gain": round((sum(new_model.values()) - sum(new_plain.values())) / len(fresh), 4),
                     "before_accepts": held_gain >= 0, "after_accepts": verdict["accept"],
                     "gain_low": verdict.get("gain_low"), "why": verdict["why"], "variants": variants})
        row = rows[-1]
        print(f"split {r}: held-out {row['held_out']} gain {row['held_out_gain']:+.4f} (low {row['gain_low']}), new "
              f"{row['new']} gain {row['new_gain']:+.4f}; before {'accepts' if row['before_accepts'] else 'refuses'}"
              f", after {'accepts' if row['after_accepts'] else 'refuses'}", file=sys.stderr)

    def summary(key: str) -> dict:
        accepted = [r for r in rows if r[key]]
        return {"accepted": len(accepted), "lowered_new_ndcg": sum(r["new_gain"] < 0 for r in accepted),
                f"lowered_by_more_than_{HARM}": sum(r["new_gain"] < -HARM for r in accepted),
                "worst_new_gain": min((r["new_gain"] for r in accepted), default=None),
                "mean_new_gain_of_accepted": round(sum(r["new_gain"] for r in accepted) / len(accepted), 4)
                if accepted else None}

    for name in rows[0]["variants"] if rows else ():
        for r in rows:
            r[f"variant {name}"] = r["variants"][name]
    record = {"bench": "guard_check", "machine": machine(), "index": args.index, "data": str(args.data),
              "split": args.split, "queries": len(queries), "splits": args.splits, "new_share": args.new_share,
              "validation_share": args.validation_share, "features": names, "collect_s": round(collected_s, 1),
              "seconds": round(time.time() - started, 1), "before": summary("before_accepts"),
              "after": summary("after_accepts"),
              "variants": {name: summary(f"variant {name}") for name in (rows[0]["variants"] if rows else ())},
              "rows": rows}
    out = args.out or Path(f"bench/results/guard_check_{args.data.name}.json")
    write_record(out, record)
    print(json.dumps({"before": record["before"], "after": record["after"], "variants": record["variants"]},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
