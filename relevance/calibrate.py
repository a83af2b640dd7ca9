"""Calibrate a collection's relevance_score on its judgments: afterwards a result's relevance_score is the probability
that it is relevant, so a threshold means the same for every query (a framework's score_threshold included).

    python -m relevance.calibrate --index ROOT --data path/to/beir/scifact      # qrels/train.tsv
    python -m relevance.calibrate --index ROOT --judgments ROOT                 # what POST /feedback stored
    python -m relevance.calibrate --index ROOT --data ... --dry-run             # the figures, nothing written
    python -m relevance.calibrate --index ROOT --off                            # back to the uncalibrated scale

Each judged query is searched in-process over the version ROOT serves, once per method (hybrid, vector, keyword):
its best ``--depth`` fused results, each with its cosine and its BM25 score (a leg that did not return it: that
leg's lowest returned score), labelled relevant when its document is judged relevant (grade > 0; an unjudged
document counts as not relevant). A logistic regression per method maps those to a probability
(``deployments.search.calibration``). Calibrated on a regression of two scores, not a ranking model: it orders
nothing, it only says how sure a score is, and it needs few judgments (its figures say how well it held).

Before writing, it is fitted on all but ``--held-out-share`` of the queries and measured on the rest against the
uncalibrated scales: log loss, Brier score, and expected calibration error (ECE, 10 bins: how far a bin's mean score
lies from the share of it that is relevant). Then it is fitted on every query and written to ``ROOT/calibration.json``
(``index_format.calibration``); running routers take it within ``router.version_poll_s``, and a response's
``relevance_scales`` says ``calibrated``. Calibrate again after a new version with another encoder: the cosine
scale is the encoder's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from deployments.search.calibration import LEGS, Calibration, Logistic, feature, fit_logistic
from index_format.chunk_ids import doc_of

METHODS = tuple(LEGS)
MIN_QUERIES = 10  # with a relevant document: fewer and the held-out figures say nothing


def collect(pipeline, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], method: str, depth: int,
            progress=None) -> list[tuple[str, dict[str, float], float, int]]:
    """(query id, evidence, minmax relevance, label) of each query's best ``depth`` results."""
    from deployments.edge.schemas import SearchRequest

    rows = []

    async def go() -> None:
        for qid, text in queries.items():
            req = SearchRequest(query=text, method=method, limit=depth, candidates=max(depth, 100), rerank=False,
                                ranking_model=False)
            grades = qrels.get(qid, {})
            for chunk, ev, relative in await pipeline.relevance_evidence(req):
                rows.append((qid, ev, relative, int(grades.get(doc_of(chunk), 0) > 0)))
            if progress:
                progress(1)

    asyncio.run(go())
    return rows


def features_of(rows, method: str) -> np.ndarray:
    return np.array([[feature(leg, ev[leg]) for leg in LEGS[method]] for _, ev, _, _ in rows], dtype=np.float64)


def usable(rows, method: str) -> list:
    """The rows with evidence from every leg the method reads (a leg that returned nothing gives none)."""
    return [r for r in rows if all(leg in r[1] for leg in LEGS[method])]


def scale_figures(scores: Sequence[float], labels: Sequence[int], bins: int = 10) -> dict[str, float]:
    """How well scores in [0, 1] read as probabilities of ``labels``: log loss, Brier score, ECE over ``bins``."""
    p = np.clip(np.asarray(scores, dtype=np.float64), 1e-6, 1 - 1e-6)
    y = np.asarray(labels, dtype=np.float64)
    which = np.minimum((p * bins).astype(int), bins - 1)
    ece = sum(abs(p[which == b].mean() - y[which == b].mean()) * (which == b).sum()
              for b in range(bins) if (which == b).any()) / len(p)
    return {"log_loss": round(float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()), 4),
            "brier": round(float(((p - y) ** 2).mean()), 4), "ece": round(float(ece), 4)}


def fit(rows, method: str) -> Logistic:
    rows = usable(rows, method)
    return fit_logistic(features_of(rows, method), np.array([r[3] for r in rows]))


def held_out_figures(train, test, method: str) -> dict:
    """The method fitted on ``train`` and measured on ``test``, beside the uncalibrated scales on ``test``."""
    model, test = fit(train, method), usable(test, method)
    labels = [r[3] for r in test]
    out = {"pairs": len(test), "relevant": int(sum(labels)),
           "calibrated": scale_figures([model.probability(x) for x in features_of(test, method)], labels),
           "minmax": scale_figures([r[2] for r in test], labels)}
    if "dense" in LEGS[method]:
        out["cosine"] = scale_figures([min(1.0, max(0.0, r[1]["dense"])) for r in test], labels)
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m relevance.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True, metavar="ROOT",
                    help="the index root (folder or URL) the calibration is written under and whose active version "
                         "is searched")
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--data", type=Path, help="a BEIR folder (queries.jsonl, qrels/SPLIT.tsv)")
    source.add_argument("--judgments", metavar="ROOT", help="an index root whose judgments/ POST /feedback wrote")
    source.add_argument("--off", action="store_true", help="remove the calibration: back to the cosine scale")
    ap.add_argument("--split", default="train", metavar="SPLIT",
                    help="the qrels split calibrated on, with --data (default: %(default)s); queries the "
                         "--test-split also judges are left out, so figures on it stay unbiased")
    ap.add_argument("--test-split", default="test", metavar="SPLIT", help="with --data (default: %(default)s)")
    ap.add_argument("--depth", type=int, default=20,
                    help="results of each query fitted on: the ones a threshold is applied to (default: %(default)s)")
    ap.add_argument("--held-out-share", type=float, default=0.25, metavar="SHARE",
                    help="queries held out to measure the fit before it is written (default: %(default)s)")
    ap.add_argument("--dry-run", action="store_true", help="measure, write nothing")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from index_format.calibration import remove_calibration, write_calibration

    if args.off:
        print("calibration removed" if remove_calibration(args.index) else "there was no calibration to remove")
        return 0
    if args.data is None and args.judgments is None:
        raise SystemExit("give the judgments: --data BEIR_FOLDER or --judgments ROOT (or --off)")
    if not 0 < args.held_out_share < 1:
        raise SystemExit(f"--held-out-share {args.held_out_share}: expected a share between 0 and 1")
    from index_format.process import configure_process

    configure_process()
    from tqdm import tqdm

    from index_format.manifest import IndexMismatch
    from index_format.versions import resolve_version_dir
    from relevance.ranking_data import open_pipeline
    from relevance.training import beir_judgments, service_judgments
    from relevance.tuning import split_queries

    judged = (beir_judgments(args.data, args.split, args.test_split) if args.data is not None
              else service_judgments(args.judgments))
    queries = {q: t for q, t in judged.queries.items() if any(g > 0 for g in judged.qrels[q].values())}
    if len(queries) < MIN_QUERIES:
        raise SystemExit(f"{len(queries)} judged queries with a relevant document in {judged.source}: at least "
                         f"{MIN_QUERIES} are needed ({MIN_QUERIES - len(queries)} more)")
    try:
        version = resolve_version_dir(args.index)
    except IndexMismatch as e:
        raise SystemExit(f"--index {args.index}: {e}") from None
    pipeline = open_pipeline(args.index, args.depth)
    started = time.time()
    rows = {}
    with tqdm(total=len(queries) * len(METHODS), desc="searching judged queries", disable=args.no_progress,
              file=sys.stderr) as bar:
        for method in METHODS:
            rows[method] = collect(pipeline, queries, judged.qrels, method, args.depth, bar.update)
    _, held = split_queries(queries, args.held_out_share, seed="calibration")
    held = set(held)
    models, figures = {}, {}
    for method in METHODS:
        if not usable(rows[method], method):
            continue  # a leg this index does not have (no vectors, say)
        train = [r for r in rows[method] if r[0] not in held]
        test = [r for r in rows[method] if r[0] in held]
        try:
            figures[method] = held_out_figures(train, test, method)
            models[method] = fit(rows[method], method)
        except ValueError as e:
            figures[method] = {"not fitted": str(e)}
    if not models:
        raise SystemExit("nothing to calibrate: no method's results had both relevant and other documents")
    fitted = {"version": Path(version).name, "source": judged.source, "queries": len(queries),
              "held_out_queries": len(held), "depth": args.depth,
              "pairs": {m: len(usable(rows[m], m)) for m in models}, "held_out": figures,
              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    calibration = Calibration(models, fitted)
    if not args.dry_run:
        write_calibration(args.index, calibration.to_json())
    summary = {"written": not args.dry_run, "seconds": round(time.time() - started, 1)} | calibration.to_json()
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{len(queries)} judged queries ({len(held)} held out to measure), {args.depth} results each, "
              f"version {fitted['version']}:")
        for method, f in figures.items():
            if "calibrated" not in f:
                print(f"  {method}: {f}")
                continue
            others = ", ".join(f"{name} {f[name]['ece']}" for name in ("cosine", "minmax") if name in f)
            print(f"  {method}: ECE on held-out results {f['calibrated']['ece']} calibrated against {others}; log "
                  f"loss {f['calibrated']['log_loss']} against minmax {f['minmax']['log_loss']}")
        print("written to " + f"{args.index}/calibration.json" if not args.dry_run else "dry run: nothing written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

