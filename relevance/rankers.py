"""A collection's ranking models: list, compare, activate, roll back, turn off.

    python -m relevance.rankers list ROOT
    python -m relevance.rankers compare ROOT MODEL      # on the model's held-out queries, against what is served
    python -m relevance.rankers activate ROOT MODEL     # compare, then activate only on a gain beyond chance
    python -m relevance.rankers rollback ROOT           # back to the model (or no model) active before
    python -m relevance.rankers off ROOT                # rank without a model

Running routers follow ``ROOT/rankers/ACTIVE.json`` within ``router.version_poll_s`` (index_format.rankers).
The comparison searches the model's held-out queries in-process over the version the root serves, orders each
query's candidates with the new model and with what is served (the active model, or none), and judges both
with the queries' judgments: the figures the activation keeps in the history.
"""

from __future__ import annotations

import argparse
import json
import sys

from index_format.rankers import (
    RankerError,
    activate_ranker,
    active_ranker,
    list_rankers,
    ranker_description,
    ranker_state,
    read_ranker,
    rollback_ranker,
)


def load_model(root, model_id: str):
    from deployments.search.learned import RankingModel

    description, text = read_ranker(root, model_id)
    return description, RankingModel(model_id, description["features"], text)


def compare(root, model_id: str, pipeline=None) -> dict:
    """The model against what ``root`` serves now, on the model's held-out queries (nDCG@10, documents at their
    best chunk, the same candidates for both)."""
    from relevance.guard import decide
    from relevance.ranking_data import collect, cross_fit_encoders, ndcg_of, ndcg_per_query, open_pipeline

    description, model = load_model(root, model_id)
    served = active_ranker(root)
    held = description["validation"]
    qrels = {q: {d: int(g) for d, g in docs.items()} for q, docs in held["qrels"].items()}
    pipeline = pipeline or open_pipeline(root, description["depth"], description.get("reranker"))
    # Cross-fitted as in training: each held-out query searched with the encoder that never saw it.
    names = description.get("cross_fit") or []
    stand_in = cross_fit_encoders(root, names, held["queries"]) if names else None
    data = collect(pipeline, held["queries"], qrels, None, stand_in,
                   **({"rerank": True} if description.get("reranker") else {}))

    def scores_of(m):
        return lambda q: m.booster.predict(q.matrix(m.features), num_threads=1)

    served_scores = None if served is None or served == model_id else scores_of(load_model(root, served)[1])
    verdict = decide(ndcg_per_query(data, qrels, scores_of(model)), ndcg_per_query(data, qrels, served_scores),
                     share=(description.get("data") or {}).get("validation_share"))
    return {"model": model_id, "served": served, "queries": len(data),
            "model_ndcg": round(ndcg_of(data, qrels, scores_of(model)), 4),
            "served_ndcg": round(ndcg_of(data, qrels, served_scores), 4), "guard": verdict}


def listing(root) -> list[str]:
    """The published models, one line each, the active one starred: what each reads (features, trees, and whether
    the shards read postings for it: a model that reads no BM25 or coverage costs less to serve), what
    it scored on training judgments (cross-validated, and on its held-out queries against no model, with the guard's
    verdict there: the gain, its interval, the queries behind it), when trained."""
    from deployments.shard.features import reads_postings

    state, _ = ranker_state(root)
    lines = [f"  {'MODEL':<44} {'FEATURES':>8} {'TREES':>5} {'CV NDCG@10':>10} {'HELD OUT (NO MODEL)':>19}  POSTINGS  "
             f"{'GAIN [95% INTERVAL] QUERIES GUARD':<44}  TRAINED"]
    for model_id in list_rankers(root):
        d = ranker_description(root, model_id)
        features = d.get("features", [])
        postings = reads_postings(features)
        cv, held = d.get("cross_validation", {}), d.get("validation", {})
        scores = f"{held.get('model_ndcg', float('nan')):.4f} ({held.get('without_model_ndcg', float('nan')):.4f})"
        lines.append(f"{'* ' if model_id == state['active'] else '  '}{model_id:<44} {len(features):>8} "
                     f"{d.get('trees', 0):>5} {cv.get('model_ndcg', float('nan')):>10.4f} {scores:>19}  "
                     f"{'yes' if postings else 'no':<8}  {guarded(held.get('guard')):<44}  {d.get('trained', '')}")
    return lines + [f"active: {state['active'] or 'none'}"]


def guarded(verdict: dict | None) -> str:
    """The guard's verdict in one column: the gain, its interval, the queries behind it, accepted or refused."""
    if verdict is None:
        return "- (trained before the guard)"
    said = "accepted" if verdict["accept"] else "refused"
    if "gain" not in verdict:
        return f"- {verdict['queries']} {said}(too-few-queries)"
    return f"{verdict['gain']:+.4f} [{verdict['gain_low']:+.4f},{verdict['gain_high']:+.4f}] {verdict['queries']} {said}"


def activate(root, model_id: str, by: str = "cli", pipeline=None) -> int:
    comparison = compare(root, model_id, pipeline)
    print(json.dumps(comparison), file=sys.stderr)
    try:
        previous = activate_ranker(root, model_id, comparison, by=by)
    except RankerError as e:
        print(f"refused: {e}", file=sys.stderr)
        return 2
    print(f"activated {model_id} (was {previous or 'no model'})", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m relevance.rankers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name, help_ in (("list", "the published models and the active one"), ("show", "a model's description"),
                        ("compare", "compare a model with what is served"),
                        ("activate", "compare, then activate if its gain is above 0 with 95% confidence "
                                     "(relevance.guard)"),
                        ("rollback", "return to the model active before"), ("off", "rank without a model")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("root", help="the index root (folder or URL)")
        if name in ("show", "compare", "activate"):
            p.add_argument("model", help="the model id (python -m relevance.rankers list ROOT)")
    args = ap.parse_args(argv)
    from index_format.process import configure_process

    configure_process()
    try:
        if args.command == "list":
            print("\n".join(listing(args.root)))
        elif args.command == "show":
            description = ranker_description(args.root, args.model)
            description.pop("validation", None)
            print(json.dumps(description, indent=1))
        elif args.command == "compare":
            print(json.dumps(compare(args.root, args.model), indent=1))
        elif args.command == "activate":
            return activate(args.root, args.model)
        elif args.command == "rollback":
            was, now = rollback_ranker(args.root)
            print(f"rolled back from {was or 'no model'} to {now or 'no model'}")
        else:
            was = activate_ranker(args.root, None, None)
            print(f"no ranking model (was {was or 'none'})")
    except RankerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
