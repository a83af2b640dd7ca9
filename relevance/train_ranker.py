"""Train a collection's ranking model (a learned ranker over its fused candidates) from judgments.

    python -m relevance.train_ranker --index indexes/scifact --data ../shared/data/scifact --train-split train \\
        --out models/ranker-scifact --publish --activate

Judgments: a BEIR folder's qrels of one split (``--data DIR --train-split train``; queries the ``--test-split``
also judges are dropped, so the test split stays unseen) or what a running service collected (``--judgments
ROOT``). Each query is searched in-process as the service searches it (``--index``: the root, URL or version
folder served), and its best ``--depth`` fused candidates get their features (``deployments.search.learned``).
LightGBM's lambdarank learns to order them.

How it is checked, all on the training judgments, never the test split:
- a ``--validation-share`` of the queries (by a stable hash of the query id) is held out of training; the
  model is compared with what the collection serves on them (nDCG@10 of documents at their best chunk), and
  ``--activate`` (and ``python -m relevance.rankers activate``) requires the guard to accept its gain there
  (``relevance.guard``: above 0 with 95% confidence, a paired bootstrap over at least 50 held-out queries);
- the rest is cross-validated by query folds (``--folds``), which chooses the number of trees;
- ``--ablate`` trains once more without each feature group and reports what each was worth.

Writes ``OUT/model.txt`` (LightGBM's) and ``OUT/ranker.json``: the features, the parameters, the data, the folds'
scores, the held-out queries with their judgments, and the comparison.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np

from deployments.search.learned import GROUPS, in_group
from relevance.guard import decide
from relevance.ranking_data import (
    K,
    QueryData,
    collect,
    cross_fit_encoders,
    ndcg_of,
    ndcg_per_query,
    open_pipeline,
)
from relevance.tuning import fold_of

PARAMS = {
    "objective": "lambdarank", "metric": "ndcg", "eval_at": [K], "learning_rate": 0.1, "num_leaves": 15,
    "min_data_in_leaf": 50, "feature_fraction": 0.9, "bagging_fraction": 0.8, "bagging_freq": 1,
    "lambdarank_truncation_level": 30, "verbose": -1, "num_threads": 2, "seed": 0, "deterministic": True,
}
# Trees at most; cross-validation picks fewer. Scoring 200 candidates costs ~2.5-5 us of CPU a tree here, and
# the stage's budget is 1 ms.
MAX_ROUNDS = 200
STEP = 10  # cross-validation reads the held-out score every STEP trees


def usable(data: list[QueryData]) -> list[QueryData]:
    """Queries with a relevant candidate and a non-relevant one: the others teach a pairwise loss nothing."""
    return [q for q in data if q.labels.max() > 0 and q.labels.min() == 0]


def dataset(data: list[QueryData], names: list[str]):
    import lightgbm

    return lightgbm.Dataset(np.vstack([q.matrix(names) for q in data]), np.concatenate([q.labels for q in data]),
                            group=[len(q.chunk_ids) for q in data], feature_name=names, free_raw_data=False)


def fit(data: list[QueryData], names: list[str], rounds: int, params: dict | None = None):
    import lightgbm

    return lightgbm.train(params or PARAMS, dataset(usable(data), names), num_boost_round=rounds)


def scorer(booster, names: list[str]):
    return lambda q: booster.predict(q.matrix(names), num_threads=1)


def cross_validate(data: list[QueryData], qrels, names: list[str], folds: int) -> dict:
    """The number of trees (best mean of the folds' held-out nDCG@10, documents at their best chunk) and each
    fold's figures: the model against the order without one."""
    curves, without = [], []
    for f in range(folds):
        train = [q for q in data if fold_of(q.query_id, folds) != f]
        test = [q for q in data if fold_of(q.query_id, folds) == f]
        booster = fit(train, names, MAX_ROUNDS)
        # The held-out score after every STEP trees: one model per fold, read at each length.
        curves.append([ndcg_of(test, qrels, lambda q, n=n, b=booster: b.predict(q.matrix(names), num_iteration=n))
                       for n in range(STEP, MAX_ROUNDS + 1, STEP)])
        without.append(ndcg_of(test, qrels))
    mean = np.mean(curves, axis=0)
    best = int(np.argmax(mean))
    return {"folds": folds, "trees": STEP * (best + 1), "ndcg_by_trees": {STEP * (i + 1): round(float(v), 4)
                                                                        for i, v in enumerate(mean)},
            "model_ndcg": round(float(mean[best]), 4), "without_model_ndcg": round(float(np.mean(without)), 4),
            "per_fold": [{"model": round(c[best], 4), "without": round(w, 4)} for c, w in zip(curves, without,
                                                                                               strict=True)]}


def feature_names(data: list[QueryData], wanted: list[str] | None = None) -> list[str]:
    """Every feature the data has a value for (or exactly those ``wanted``), in ``learned.FEATURES`` order then
    by name."""
    from deployments.search.learned import FEATURES

    present = {n for q in data for n, v in q.columns.items() if np.isfinite(v).any()}
    names = [n for n in FEATURES if n in present] + sorted(present - set(FEATURES))
    if wanted:
        missing = sorted(set(wanted) - present)
        if missing:
            raise SystemExit(f"--features names {', '.join(missing)}, which the data does not have; it has "
                             f"{', '.join(names)}")
        names = [n for n in names if n in wanted]
    return names


def chosen(names: list[str], args: argparse.Namespace) -> list[str]:
    """``names`` less the ``--without`` groups; exits saying so when nothing is left."""
    kept = [n for n in names if not any(in_group(n, g) for g in args.without)]
    if not kept:
        given = f"--features and --without {' '.join(args.without)} leave" if args.features else \
            f"--without {' '.join(args.without)} leaves"
        raise SystemExit(f"{given} no feature to train on")
    return kept


def ablation(data: list[QueryData], qrels, names: list[str], folds: int) -> list[dict]:
    """Cross-validated nDCG@10 with every feature group, and without each one."""
    rows = [{"without": None, "features": len(names), **_cv_row(cross_validate(data, qrels, names, folds))}]
    for group in GROUPS:
        kept = [n for n in names if not in_group(n, group)]
        if len(kept) == len(names) or not kept:
            continue
        rows.append({"without": group, "features": len(kept), **_cv_row(cross_validate(data, qrels, kept, folds))})
    return rows


def _cv_row(cv: dict) -> dict:
    return {"cv_ndcg": cv["model_ndcg"], "trees": cv["trees"]}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m relevance.train_ranker", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv)")
    source.add_argument("--judgments", metavar="ROOT", help="an index root whose judgments/ POST /feedback wrote")
    ap.add_argument("--train-split", default="train", metavar="SPLIT",
                    help="the qrels split trained on, with --data (default: %(default)s)")
    ap.add_argument("--test-split", default="test", metavar="SPLIT",
                    help="the qrels split never trained on, with --data (default: %(default)s)")
    ap.add_argument("--held-out-share", type=float, default=None, metavar="SHARE",
                    help="with --data whose only split is --train-split: hold out this share of its queries "
                         "(stable hash of the query id) as the test split")
    ap.add_argument("--index", required=True, metavar="ROOT", help="the index searched (root, URL or version folder)")
    ap.add_argument("--out", type=Path, required=True, help="the folder the model is written to")
    ap.add_argument("--name", default="ranker", help="the model id's prefix (default: %(default)s)")
    ap.add_argument("--depth", type=int, default=200, help="fused candidates a query's model orders (the service's "
                    "router.ranking_depth; default: %(default)s)")
    ap.add_argument("--reranker", default=None, metavar="MODEL",
                    help="a cross-encoder (hub name or folder) whose scores become a feature; serve it with the same "
                         "reranker.model and rerank on")
    ap.add_argument("--cross-fit", nargs="+", default=None, metavar="NAME",
                    help="named encoders of the version, each trained with relevance.train_encoder "
                         "--leave-out-fold K/N: a training query is searched with the one that left it out, whose "
                         "cosine stands in for the version's own encoder's (when that encoder was trained on these "
                         "judgments)")
    ap.add_argument("--validation-share", type=float, default=0.2, metavar="SHARE",
                    help="training queries held out to compare the model with what is served (default: %(default)s)")
    ap.add_argument("--folds", type=int, default=5, help="cross-validation folds by query (default: %(default)s)")
    ap.add_argument("--features", nargs="*", default=None, metavar="NAME",
                    help="exactly these features (default: every one the data has)")
    ap.add_argument("--without", nargs="+", default=[], choices=list(GROUPS), metavar="GROUP",
                    help=f"leave out these feature groups ({', '.join(GROUPS)}; as --ablate names them). A model "
                         "reads only what it was trained on, and the shards compute only that: --without bm25 "
                         "coverage gives a model that reads no postings, a cheaper stage for part of the gain "
                         "(bench/README.md, \"What a model reads decides what the stage costs\")")
    ap.add_argument("--candidates", type=Path, default=None, metavar="FILE",
                    help="keep the queries' candidates and features in FILE, and read them from it when it exists "
                         "(the same queries, index and options: for trying other features or parameters quickly)")
    ap.add_argument("--ablate", action="store_true", help="also cross-validate without each feature group")
    ap.add_argument("--publish", action="store_true", help="publish the model under the index root's rankers/")
    ap.add_argument("--activate", action="store_true",
                    help="publish, compare with what is served, and activate if the guard accepts its gain "
                         "(relevance.guard: above 0 with 95%% confidence, on at least 50 held-out queries)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.features:  # refused before minutes of searching when the lists alone leave nothing
        chosen(args.features, args)
    from index_format.process import configure_process

    configure_process()
    from relevance.training import beir_judgments, service_judgments
    from relevance.tuning import split_queries

    judged = (beir_judgments(args.data, args.train_split, args.test_split, args.held_out_share)
              if args.data is not None else service_judgments(args.judgments))
    queries = {q: t for q, t in judged.queries.items() if any(g > 0 for g in judged.qrels[q].values())}
    if len(queries) < 2 * args.folds:
        raise SystemExit(f"{len(queries)} judged queries with a relevant document in {judged.source}: too few to "
                         f"train and cross-validate in {args.folds} folds")
    fit_ids, validation_ids = split_queries(queries, args.validation_share, seed="ranker")
    stand_in = cross_fit_encoders(args.index, args.cross_fit, queries) if args.cross_fit else None
    t0 = time.time()
    pipeline = open_pipeline(args.index, args.depth, args.reranker)
    from tqdm import tqdm

    data = None
    if args.candidates is not None and args.candidates.is_file():
        with open(args.candidates, "rb") as f:
            kept = pickle.load(f)
        if kept["key"] == [str(args.index), args.depth, args.reranker, sorted(queries), args.cross_fit]:
            data = kept["data"]
        else:
            print(f"{args.candidates} holds other queries or options: searching again", file=sys.stderr)
    if data is None:
        with tqdm(total=len(queries), desc="features", unit="query", disable=args.no_progress) as bar:
            data = collect(pipeline, queries, judged.qrels, bar.update, stand_in,
                           **({"rerank": True} if args.reranker else {}))
        if args.candidates is not None:
            with open(args.candidates, "wb") as f:
                pickle.dump({"key": [str(args.index), args.depth, args.reranker, sorted(queries), args.cross_fit],
                             "data": data}, f)
    by_id = {q.query_id: q for q in data}
    fit_data = [by_id[q] for q in fit_ids]
    validation = [by_id[q] for q in validation_ids]
    names = chosen(feature_names(data, args.features), args)
    print(f"features: {', '.join(names)}", file=sys.stderr)
    cv = cross_validate(fit_data, judged.qrels, names, args.folds)
    print(f"cross-validated ({args.folds} folds by query): nDCG@10 {cv['model_ndcg']:.4f} with {cv['trees']} trees, "
          f"{cv['without_model_ndcg']:.4f} without a model", file=sys.stderr)
    booster = fit(fit_data, names, cv["trees"])
    model_text = booster.model_to_string()
    from index_format.rankers import model_id_for

    description = {
        "name": args.name, "features": names, "params": PARAMS, "trees": cv["trees"], "depth": args.depth,
        "reranker": args.reranker, "cross_fit": args.cross_fit or [], "index": str(args.index),
        "data": {"source": judged.source, "held_out": judged.held_out, "queries": len(queries),
                 "validation_share": args.validation_share,
                 "fit_queries": len(fit_data), "usable_fit_queries": len(usable(fit_data)),
                 "validation_queries": len(validation), "held_out_query_ids": judged.held_out_ids},
        "cross_validation": cv,
        "validation": {"queries": {q.query_id: q.text for q in validation},
                       "qrels": {q.query_id: judged.qrels[q.query_id] for q in validation},
                       "model_ndcg": round(ndcg_of(validation, judged.qrels, scorer(booster, names)), 4),
                       "without_model_ndcg": round(ndcg_of(validation, judged.qrels), 4),
                       # The guard's verdict against no model (``rankers compare`` makes it against what is served).
                       "guard": decide(ndcg_per_query(validation, judged.qrels, scorer(booster, names)),
                                       ndcg_per_query(validation, judged.qrels), share=args.validation_share)},
        "trained": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": round(time.time() - t0, 1),
    }
    if args.ablate:
        description["ablation"] = ablation(fit_data, judged.qrels, names, args.folds)
    description["id"] = model_id_for(description, model_text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "model.txt").write_text(model_text)
    (args.out / "ranker.json").write_text(json.dumps(description, indent=1))
    v = description["validation"]
    print(f"held-out training queries ({len(validation)}): nDCG@10 {v['model_ndcg']:.4f} with the model, "
          f"{v['without_model_ndcg']:.4f} without; the guard: {'accepts' if v['guard']['accept'] else 'refuses'} "
          f"({v['guard']['why']}); written to {args.out} as {description['id']}", file=sys.stderr)
    if args.publish or args.activate:
        from index_format.rankers import publish_ranker

        publish_ranker(args.index, args.out)
        print(f"published under {args.index}/rankers/{description['id']}", file=sys.stderr)
    if args.activate:
        from relevance.rankers import activate

        return activate(args.index, description["id"], by="train_ranker", pipeline=pipeline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
