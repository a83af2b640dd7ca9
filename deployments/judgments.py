"""``python -m deployments.judgments export ROOT OUT``: what ``POST /feedback`` stored, as a BEIR folder
(the store itself is ``deployments.relevance.judgments``)."""

from __future__ import annotations

from pathlib import Path

from deployments.relevance.judgments import JudgmentStore


def main(argv: list[str] | None = None) -> int:
    """``python -m deployments.judgments export ROOT OUT``: a collection's judgments as a BEIR folder."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m deployments.judgments", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export", help="write OUT/queries.jsonl and OUT/qrels/test.tsv from ROOT/judgments")
    p.add_argument("root", type=Path, help="the collection's index root")
    p.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    store = JudgmentStore(args.root / "judgments")
    texts, qrels = store.qrels()
    store.write_beir(args.out)
    print(f"{sum(len(d) for d in qrels.values())} judgments of {len(texts)} queries -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
