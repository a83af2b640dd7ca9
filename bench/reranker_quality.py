"""Why a cross-encoder trained here ranks worse the deeper it reranks, and what makes it safe: its score as a
ranking model's feature, or blended with the fused score by a weight chosen on training queries.

    python -m bench.reranker_quality --data DATA/scifact --index ROOT --reranker models/reranker-half \\
        --depth 40 --out bench/results/reranker_quality.json

The cross-encoder must have been trained with ``--held-out-share`` (``relevance.train_reranker``): the training
queries it never saw (``training.json``) are the ones the combinations learn from, so its score is not judged on
the queries it was fitted to (a model that has seen a query scores it far better than it will score a new one).
The test split (``--test-split``) is looked at once, for every row at the same time.

Every query is searched in-process by the service's own pipeline; the cross-encoder scores its best ``--depth``
fused candidates, and each smaller depth of ``--depths`` reads the same scores for its first candidates (a pair's
score does not depend on the depth). For each depth:
- nDCG@10 of the fused order, of the cross-encoder's order over the first ``depth`` (the service's reranking),
  of the fused score blended with the cross-encoder's (``(1 - w) * minmax(fused) + w * score`` over the first
  ``depth``, ``w`` chosen on the training queries, 0 allowed), and of a ranking model with and without the
  cross-encoder's score among its features;
- the cross-encoder's ability to tell a relevant candidate from a non-relevant one of the same query (the share of
  such pairs it orders right, against the fused score's), and the number of non-relevant candidates it puts above
  the best-placed relevant one;
- the share of pairs cut at the model's ``max_length``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import load_beir, machine, write_record
from relevance.metrics import ndcg_at
from relevance.ranking_data import QueryData, collect, documents_in_order, ndcg_of, open_pipeline

WEIGHTS = [round(w, 2) for w in np.linspace(0, 1, 21)]


def masked(data: list[QueryData], depth: int) -> list[QueryData]:
    """The same candidates with the cross-encoder's scores kept for the first ``depth`` (fused order) only."""
    out = []
    for q in data:
        rerank = q.columns["rerank"].copy()
        rerank[depth:] = np.nan
        out.append(QueryData(q.query_id, q.text, q.chunk_ids, {**q.columns, "rerank": rerank}, q.labels))
    return out


def reranked(q: QueryData, depth: int) -> np.ndarray:
    """Scores that put the first ``depth`` in the cross-encoder's order, the rest after them as fused."""
    n = len(q.chunk_ids)
    scores = -np.arange(n, dtype=float) - 10.0 * n
    head = min(depth, n)
    scores[:head] = q.columns["rerank"][:head]
    return scores


def blended(q: QueryData, depth: int, w: float) -> np.ndarray:
    n = len(q.chunk_ids)
    fused = q.columns["fused_score"].astype(float)
    lo, hi = np.nanmin(fused), np.nanmax(fused)
    norm = (fused - lo) / (hi - lo) if hi > lo else np.zeros(n)
    scores = norm.copy() - 10.0  # past the depth: the fused order, below every blended candidate
    head = min(depth, n)
    scores[:head] = (1 - w) * norm[:head] + w * np.nan_to_num(q.columns["rerank"][:head])
    return scores


def pair_accuracy(data: list[QueryData], column: str, depth: int) -> tuple[float, float]:
    """(share of (relevant, non-relevant) candidate pairs of one query within the first ``depth`` that ``column``
    orders right, mean number of non-relevant candidates above the best relevant one)."""
    right = total = 0
    above = []
    for q in data:
        values = q.columns[column][:depth].astype(float)
        labels = q.labels[:depth]
        if column in ("fused_rank",):
            values = -values
        pos, neg = values[labels > 0], values[labels == 0]
        if not len(pos) or not len(neg):
            continue
        right += int((pos[:, None] > neg[None, :]).sum())
        total += len(pos) * len(neg)
        above.append(int((neg > pos.max()).sum()))
    return (right / total if total else float("nan")), (float(np.mean(above)) if above else float("nan"))


def chunk_texts(index: str) -> dict[str, str]:
    """chunk id -> what the cross-encoder reads of it (title and text), from the served version's chunk tables."""
    import pyarrow.parquet as pq

    from deployments.search.reranking import passage_text
    from index_format.versions import resolve_version_dir

    out = {}
    for shard in sorted((resolve_version_dir(index) / "shards").iterdir()):
        t = pq.read_table(shard / "chunks.parquet", columns=["chunk_id", "title", "text"])
        for c, title, text in zip(*(t[k].to_pylist() for k in ("chunk_id", "title", "text")), strict=True):
            out[c] = passage_text(title, text)
    return out


def reading(args, test: list[QueryData], qrels, sample: int = 50, depth: int = 20) -> dict:
    """What the model reads: the share of pairs cut at its ``max_length``, and nDCG@10 at ``depth`` with each
    pair given in the trained order (query, passage) and reversed, on the first ``sample`` test queries."""
    from deployments.search.reranking import CrossEncoderScorer

    max_length = int(json.loads((args.reranker / "training.json").read_text()).get("max_length", 256))
    scorer = CrossEncoderScorer(str(args.reranker), max_length=max_length)
    texts = chunk_texts(args.index)
    queries = test[:sample]
    pairs = [(q.text, texts[c]) for q in queries for c in q.chunk_ids[:depth]]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.reranker))  # the pairs' whole length, uncut
    full = [len(ids) for ids in tokenizer([q for q, _ in pairs], [p for _, p in pairs], truncation=False,
                                          return_attention_mask=False, return_token_type_ids=False)["input_ids"]]
    out = {"max_length": max_length, "pairs": len(pairs),
           "share_cut": sum(n > max_length for n in full) / len(pairs),
           "median_tokens": float(np.median(full))}
    for label, flip in (("query_first", False), ("passage_first", True)):
        scores = scorer.score([(p, q) if flip else (q, p) for q, p in pairs])
        total = 0.0
        for i, q in enumerate(queries):
            mine = scores[i * depth:(i + 1) * depth]
            order = list(np.argsort(-mine, kind="stable")) + list(range(depth, len(q.chunk_ids)))
            total += ndcg_at(documents_in_order(q.chunk_ids, order), qrels[q.query_id], 10)
        out[f"ndcg_at_{depth}_{label}"] = total / len(queries)
    out["ndcg_fused"] = ndcg_of(queries, qrels)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.reranker_quality", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a BEIR folder")
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--test-split", default="test")
    ap.add_argument("--index", required=True)
    ap.add_argument("--reranker", type=Path, required=True, help="a cross-encoder trained with --held-out-share")
    ap.add_argument("--depth", type=int, default=40, help="the cross-encoder's depth (default: %(default)s)")
    ap.add_argument("--depths", type=int, nargs="*", default=[10, 20, 40])
    ap.add_argument("--test-queries", type=int, default=0, help="the first N test queries (0: all)")
    ap.add_argument("--train-queries", type=int, default=0,
                    help="the first N training queries the cross-encoder never saw (0: all)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--candidates", type=Path, default=None, help="keep (and reuse) the scored candidates here")
    ap.add_argument("--out", type=Path, default=Path("bench/results/reranker_quality.json"))
    args = ap.parse_args(argv)
    from index_format.process import configure_process

    configure_process()
    import pickle

    from relevance.train_ranker import cross_validate, feature_names, fit

    t0 = time.time()
    trained_on = json.loads((args.reranker / "training.json").read_text())
    unseen = set(trained_on["data"]["held_out_query_ids"])
    train_queries, train_qrels = load_beir(args.data, args.train_split)
    train_queries = {q: t for q, t in train_queries.items() if q in unseen
                     and any(g > 0 for g in train_qrels.get(q, {}).values())}
    if args.train_queries:
        train_queries = dict(list(train_queries.items())[: args.train_queries])
    test_queries, test_qrels = load_beir(args.data, args.test_split)
    if args.test_queries:
        test_queries = dict(list(test_queries.items())[: args.test_queries])
    if args.candidates is not None and args.candidates.is_file():
        with open(args.candidates, "rb") as f:
            train, test = pickle.load(f)
    else:
        pipeline = open_pipeline(args.index, 200, str(args.reranker))
        pipeline.settings = pipeline.settings.model_copy(update={"rerank_depth": args.depth})
        from tqdm import tqdm

        with tqdm(total=len(train_queries) + len(test_queries), desc="searching and reranking") as bar:
            train = collect(pipeline, train_queries, train_qrels, bar.update, rerank=True, rerank_depth=args.depth)
            test = collect(pipeline, test_queries, test_qrels, bar.update, rerank=True, rerank_depth=args.depth)
        if args.candidates is not None:
            with open(args.candidates, "wb") as f:
                pickle.dump((train, test), f)
    qrels = train_qrels | test_qrels
    record = {"machine": machine(), "dataset": str(args.data), "reranker": str(args.reranker),
              "reranker_training": {k: v for k, v in trained_on.items() if k != "data"},
              "train_queries_unseen_by_the_reranker": len(train), "test_queries": len(test), "depth": args.depth,
              "rows": []}
    without = feature_names(train)
    without = [n for n in without if n != "rerank"]
    for depth in args.depths:
        tr, te = masked(train, depth), masked(test, depth)
        weights = {w: ndcg_of(tr, qrels, lambda q, w=w, d=depth: blended(q, d, w)) for w in WEIGHTS}
        w = max(weights, key=lambda k: (round(weights[k], 4), -k))  # ties: the smaller weight
        row = {"depth": depth,
               "fused": ndcg_of(te, qrels),
               "cross_encoder": ndcg_of(te, qrels, lambda q, d=depth: reranked(q, d)),
               "blend_weight": w, "blend_train": weights[w], "blend": ndcg_of(te, qrels, lambda q, d=depth, w=w: blended(q, d, w))}
        for label, names in (("model_without_ce", without), ("model_with_ce", [*without, "rerank"])):
            cv = cross_validate(tr, qrels, names, args.folds)
            booster = fit(tr, names, cv["trees"])
            row[label] = ndcg_of(te, qrels, lambda q, b=booster, n=names: b.predict(q.matrix(n)))
            row[f"{label}_cv"] = cv["model_ndcg"]
        acc_ce, above_ce = pair_accuracy(te, "rerank", depth)
        acc_fused, above_fused = pair_accuracy(te, "fused_score", depth)
        row |= {"pairs_right_ce": acc_ce, "pairs_right_fused": acc_fused,
                "non_relevant_above_best_relevant_ce": above_ce, "non_relevant_above_best_relevant_fused": above_fused}
        record["rows"].append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
        print(json.dumps(record["rows"][-1]), flush=True)
    record["reading"] = reading(args, test, qrels)
    print(json.dumps(record["reading"]), flush=True)
    record["seconds"] = round(time.time() - t0, 1)
    write_record(args.out, record)
    print("| depth | fused | cross-encoder | blend (w) | model | model + CE | CE pairs right | fused pairs right |")
    for r in record["rows"]:
        print(f"| {r['depth']} | {r['fused']:.4f} | {r['cross_encoder']:.4f} | {r['blend']:.4f} ({r['blend_weight']}) | "
              f"{r['model_without_ce']:.4f} | {r['model_with_ce']:.4f} | {r['pairs_right_ce']:.3f} | "
              f"{r['pairs_right_fused']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
