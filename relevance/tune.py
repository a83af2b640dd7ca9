"""Tune the service's fusion settings on your judgments, check them on held-out queries, write them out.

    python -m relevance.tune --url http://127.0.0.1:8000 --data path/to/beir/scifact --train-split train
    python -m relevance.tune --url ... --judgments path/to/index_root        # POST /feedback judgments
    python -m relevance.tune --url ... --queries q.jsonl --qrels judged.tsv --held-out-share 0.3

1. Every judged query is searched once over HTTP with ``debug: true`` at the deepest candidate depth,
   which records both legs (dense and BM25 candidates with their scores).
2. On the training queries, every setting of the grid (fusion method, RRF k, dense weight, candidates
   per leg) is replayed offline with the router's own fusion code and scored by nDCG@10; then
   min_relevance_score cut-offs, then MMR lambdas (over HTTP: MMR needs the vectors) on the best.
3. On the held-out queries, the service's current behaviour and the tuned setting are both measured
   over HTTP; the difference comes with a 95% paired-bootstrap interval.
4. The tuned settings are written as YAML (``--out``): the router's ``user_config``. ``--apply`` (or
   ``python -m deployments.settings apply FILE``) hands them to the running application, whose router
   replicas reconfigure in place: no redeploy, no restart.

Judgments: a BEIR folder (``--data``; its ``--train-split`` trains and ``--test-split`` is held out),
any queries + qrels pair, or the judgments the service stored (``--judgments ROOT``). Without a train
split, a stable hash of each query id holds out ``--held-out-share`` of the queries.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml
from raysearch_client import SearchClient, SearchServiceError
from raysearch_client.models import SearchRequest
from tqdm import tqdm

from index_format.process import configure_process
from relevance.evaluate import partial, read_queries
from relevance.metrics import ndcg_at
from relevance.qrels import read_qrels
from relevance.tuning import (
    Legs,
    grid,
    mean,
    paired_bootstrap,
    search,
    split_queries,
    threshold_candidates,
)


class Service:
    """The running service, as the tuner talks to it."""

    def __init__(self, client: SearchClient, collection: str | None, workers: int, progress: bool):
        self.client = client
        self.collection = collection
        self.workers = workers
        self.progress = progress
        self.attempts = 5

    def _post_all(self, queries: dict[str, str], body: dict, desc: str) -> dict[str, dict]:
        base = {"method": "hybrid", "include_citations": False, "rerank": False}
        if self.collection:
            base["collections"] = [self.collection]

        def one(item):
            # A partial answer (a shard or the encoder late under load: coverage degraded, or a warning such
            # as "keyword results only") would be scored as if the setting were worse: ask again, or stop. The
            # client sends a 503 with Retry-After again itself; any other error stops the tuning.
            qid, text = item
            for attempt in range(self.attempts):
                try:
                    answer = self.client.search(SearchRequest(**(base | body | {"query": text})))
                except SearchServiceError as e:
                    if e.status != 503:
                        raise SystemExit(f"error: POST /search answered {e} for query {qid}") from None
                    problem = f"503 {e.message}"
                else:
                    if not partial(answer):
                        return qid, answer.model_dump(mode="json")
                    problem = f"a partial answer ({answer.warnings or answer.coverage})"
                time.sleep(1 + 2 * attempt)
            raise SystemExit(f"error: query {qid} got {problem} {self.attempts} times: the service is overloaded or "
                             "a shard is down; lower --workers or fix the service, then run again")

        with ThreadPoolExecutor(self.workers) as pool, \
                tqdm(total=len(queries), desc=desc, disable=not self.progress, file=sys.stderr) as bar:
            out = {}
            for qid, answer in pool.map(one, queries.items()):
                out[qid] = answer
                bar.update(1)
        return out

    def record_legs(self, queries: dict[str, str], depth: int) -> dict[str, Legs]:
        answers = self._post_all(queries, {"limit": 10, "candidates": depth, "debug": True, "fusion": "rrf"},
                                 "recording legs")
        legs = {}
        for qid, answer in answers.items():
            per_collection = answer["debug"]["legs"]
            if len(per_collection) != 1:
                raise SystemExit("error: tune one collection at a time (--collection)")
            (leg,) = per_collection.values()
            legs[qid] = Legs(tuple((h["chunk_id"], h["score"]) for h in leg["dense"]),
                             tuple((h["chunk_id"], h["score"]) for h in leg["keyword"]))
        return legs

    def ndcg(self, queries: dict[str, str], qrels, body: dict, desc: str) -> dict[str, float]:
        """Per-query nDCG@10 of the service's own answers (documents at their best chunk)."""
        answers = self._post_all(queries, {"limit": 100} | body, desc)
        out = {}
        for qid, answer in answers.items():
            docs = list(dict.fromkeys(hit["doc_id"] for hit in answer["results"]))
            out[qid] = ndcg_at(docs, qrels[qid], 10)
        return out


def load_judgments(args) -> tuple[dict[str, str], dict, list[str], list[str]]:
    """(query texts, qrels, training query ids, held-out query ids)."""
    if args.judgments:
        from deployments.judgments import JudgmentStore

        texts, qrels = JudgmentStore(args.judgments / "judgments").qrels()
        train, test = split_queries(qrels, args.held_out_share)
        return texts, qrels, train, test
    if args.data:
        texts = read_queries(args.data / "queries.jsonl")
        test_qrels = read_qrels(args.data / "qrels" / f"{args.test_split}.tsv")
        if args.train_split:
            train_qrels = read_qrels(args.data / "qrels" / f"{args.train_split}.tsv")
            overlap = set(train_qrels) & set(test_qrels)
            if overlap:
                raise ValueError(f"{len(overlap)} queries are judged in both splits; tuning would see the test")
            return texts, train_qrels | test_qrels, sorted(train_qrels), sorted(test_qrels)
        train, test = split_queries(test_qrels, args.held_out_share)
        return texts, test_qrels, train, test
    qrels = read_qrels(args.qrels)
    train, test = split_queries(qrels, args.held_out_share)
    return read_queries(args.queries), qrels, train, test


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m relevance.tune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("judgments (one of)")
    src.add_argument("--data", type=Path, help="a BEIR folder: queries.jsonl and qrels/SPLIT.tsv")
    src.add_argument("--judgments", type=Path, metavar="ROOT",
                     help="an index root: the judgments POST /feedback stored under ROOT/judgments")
    src.add_argument("--queries", type=Path, help="queries.jsonl, with --qrels")
    src.add_argument("--qrels", type=Path, help="a qrels TSV (BEIR or TREC), with --queries")
    ap.add_argument("--train-split", metavar="SPLIT", help="with --data: the split to tune on (e.g. train); the test split is held out")
    ap.add_argument("--test-split", default="test", metavar="SPLIT", help="with --data: the held-out split (default: %(default)s)")
    ap.add_argument("--held-out-share", type=float, default=0.3, metavar="SHARE",
                    help="share of the queries held out when there is no train split (default: %(default)s)")
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the running service")
    ap.add_argument("--collection", help="the collection to tune (default: the service's default)")
    ap.add_argument("--api-key", help="sent as a bearer token when the service has keys on")
    ap.add_argument("--fusions", nargs="+", default=["rrf", "weighted"], choices=["rrf", "weighted"])
    ap.add_argument("--rrf-ks", nargs="+", type=int, default=[10, 20, 40, 60, 100])
    ap.add_argument("--dense-weights", nargs="+", type=float, default=[round(0.1 * i, 1) for i in range(1, 10)])
    ap.add_argument("--candidates", nargs="+", type=int, default=[50, 100, 200, 400],
                    help="candidates per leg to try; the legs are recorded at the largest")
    ap.add_argument("--mmr-lambdas", nargs="*", type=float, default=[0.9, 0.8],
                    help="MMR lambdas tried over HTTP on the best setting (none: skip MMR)")
    ap.add_argument("--mmr-sample", type=int, default=200, help="training queries used to judge MMR (0: all)")
    ap.add_argument("--min-gain", type=float, default=0.002,
                    help="a threshold or MMR is adopted only when it beats the setting without it by this much")
    ap.add_argument("--out", type=Path, default=Path("tuned_settings.yaml"), help="where the settings go")
    ap.add_argument("--report", type=Path, help="also write every figure as JSON here")
    ap.add_argument("--apply", action="store_true",
                    help="apply the settings to the running application (through the router's user_config)")
    ap.add_argument("--app", default="raysearch", help="with --apply: the Serve application's name")
    ap.add_argument("--address", help="with --apply: the Ray cluster (default: RAY_ADDRESS, else the newest one here)")
    ap.add_argument("--workers", type=int, default=2, help="requests in flight")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    configure_process()
    if sum(x is not None for x in (args.data, args.judgments, args.qrels)) != 1 or (args.qrels and not args.queries):
        ap.error("give exactly one of --data, --judgments, or --queries with --qrels")
    if not 0 < args.held_out_share < 1:
        ap.error("--held-out-share is a share between 0 and 1")
    try:
        texts, qrels, train, test = load_judgments(args)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    missing = [q for q in train + test if q not in texts]
    if missing:
        print(f"error: {len(missing)} judged queries have no text (e.g. {missing[0]})", file=sys.stderr)
        return 1
    if len(train) < 5 or len(test) < 5:
        print(f"error: {len(train)} training and {len(test)} held-out queries: judge more queries first "
              "(at least 5 each)", file=sys.stderr)
        return 1
    svc = Service(SearchClient(args.url, api_key=args.api_key, timeout=300), args.collection, args.workers,
                  not args.no_progress)
    train_q = {q: texts[q] for q in train}
    test_q = {q: texts[q] for q in test}
    train_qrels = {q: qrels[q] for q in train}
    print(f"{len(train)} training queries, {len(test)} held-out; searching {args.url}", file=sys.stderr)

    try:
        legs = svc.record_legs(train_q, max(args.candidates))
        settings = grid(args.fusions, args.rrf_ks, args.dense_weights, args.candidates)
        with tqdm(total=len(settings), desc="replaying settings", disable=args.no_progress, file=sys.stderr) as bar:
            ranked = search(legs, train_qrels, settings, progress=bar.update)
        best = ranked[0]
        chosen, train_score = best.setting, best.score
        for cut in threshold_candidates(legs, chosen):
            trial = dataclasses.replace(chosen, min_relevance_score=cut)
            (scored,) = search(legs, train_qrels, [trial])
            if scored.score >= train_score + args.min_gain:
                chosen, train_score = trial, scored.score
        mmr_lambda, mmr_rows = None, []
        if args.mmr_lambdas:
            sample = dict(list(train_q.items())[: args.mmr_sample or None])
            plain = mean(svc.ndcg(sample, qrels, chosen.request(), "MMR: without").values())
            mmr_rows.append({"mmr_lambda": None, "nDCG@10": plain})
            best_mmr = plain
            for lam in args.mmr_lambdas:
                score = mean(svc.ndcg(sample, qrels, chosen.request() | {"mmr_lambda": lam}, f"MMR {lam}").values())
                mmr_rows.append({"mmr_lambda": lam, "nDCG@10": score})
                if score >= best_mmr + args.min_gain:
                    mmr_lambda, best_mmr = lam, score
        after_body = chosen.request() | ({"mmr_lambda": mmr_lambda} if mmr_lambda is not None else {})
        before_test = svc.ndcg(test_q, qrels, {}, "held-out: current")
        after_test = svc.ndcg(test_q, qrels, after_body, "held-out: tuned")
        before_train = svc.ndcg(train_q, qrels, {}, "training: current")
    except httpx.HTTPError as e:
        print(f"error: cannot reach {args.url}: {e}", file=sys.stderr)
        return 1
    comparison = paired_bootstrap(before_test, after_test)

    router = chosen.router_settings() | ({"mmr_lambda": mmr_lambda} if mmr_lambda is not None else {})
    header = (f"# Router settings tuned by python -m relevance.tune on {len(train)} training queries\n"
              f"# ({args.data or args.judgments or args.qrels}); held-out nDCG@10 {comparison.before:.4f} -> "
              f"{comparison.after:.4f} on {len(test)} queries.\n"
              "# Apply to the running app: python -m deployments.settings apply THIS_FILE\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(header + yaml.safe_dump(router, sort_keys=False))

    print("\nbest settings on the training queries (replayed):")
    print("| setting | nDCG@10 train |\n|---|---|")
    for row in ranked[:8]:
        print(f"| {row.setting.label()} | {row.score:.4f} |")
    if mmr_rows:
        print("\nMMR on the best setting (over HTTP, training sample):")
        for row in mmr_rows:
            print(f"  mmr_lambda {row['mmr_lambda']}: {row['nDCG@10']:.4f}")
    c = comparison
    print(f"\n| nDCG@10 | current | tuned | difference (95% CI) |\n|---|---|---|---|\n"
          f"| training ({len(train)}) | {mean(before_train.values()):.4f} | {train_score:.4f} (replayed) | |\n"
          f"| held-out ({c.queries}) | {c.before:.4f} | {c.after:.4f} | {c.diff:+.4f} ({c.low:+.4f} to {c.high:+.4f}) |")
    verdict = "better" if c.low > 0 else ("worse" if c.high < 0 else "not distinguishable from the current one")
    print(f"\ntuned: {chosen.label()}" + (f", MMR {mmr_lambda}" if mmr_lambda is not None else "")
          + f"\non held-out queries the tuned setting is {verdict} (P(not better) = {c.p_not_better:.3f})")
    print(f"settings written to {args.out}")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps({
            "train_queries": len(train), "held_out_queries": len(test), "chosen": router,
            "grid_top": [{"setting": r.setting.label(), "nDCG@10": r.score} for r in ranked[:25]],
            "grid_size": len(ranked), "mmr": mmr_rows, "train_before_http": mean(before_train.values()),
            "train_after_replayed": train_score, "held_out": c.__dict__,
        }, indent=2))
    if args.apply:
        from deployments.settings import apply_router_settings

        try:
            apply_router_settings(router, app=args.app, address=args.address)
        except (RuntimeError, ValueError) as e:
            print(f"error: could not apply: {e}", file=sys.stderr)
            return 1
        print(f"applied to application {args.app!r}: its router replicas reconfigured in place")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
