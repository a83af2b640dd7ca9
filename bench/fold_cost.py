"""What folding a few documents written through the API costs, against a full build of the same corpus, in one
run: ``python -m index_build`` builds the corpus (timed around the command), ``--changed`` of its documents are
written again through the change log (their text edited, as the documents API logs them), and
``python -m index_build.fold`` folds them into a new version (timed around the command), ``--rounds`` times (the
first fold starts the cluster's fold workers, the later ones find them up). Both commands join one
Ray cluster started beforehand (``ray start --head``), as builds and folds submitted to a serving cluster do, so
neither pays for starting Ray.

Then the folded version is checked against a full build of the changed corpus for the dataset's test queries, in
process, unless ``--no-check``: the BM25 top 100 and the exact dense top 100 (the same scores rank for rank, the
same chunks above the last score), and each version's approximate index against its own exact search (recall@100:
two HNSW graphs built in different orders never return quite the same top 100, so that is what is compared).

    python -m bench.fold_cost --corpus /work/out/scifact-200k --queries ../shared/data/scifact --shards 4 \
        --encoder hashing:384 --work /work/out/fold-200k --out bench/results/fold_200k_hashing.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import load_beir, machine, write_record


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    t = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - t, done.stdout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fold_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, required=True, help="A BEIR folder or JSONL corpus.")
    p.add_argument("--queries", type=Path, default=None, help="A BEIR folder whose test queries check equality.")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--encoder", default="hashing:384")
    p.add_argument("--changed", type=int, default=10, help="Documents written again through the change log, a round.")
    p.add_argument("--rounds", type=int, default=3, help="Folds in a row, each of --changed new writes: the first "
                   "starts the fold workers, the later ones find them up, as on a serving cluster.")
    p.add_argument("--work", type=Path, required=True, help="Scratch folder (indexes, the changed corpus).")
    p.add_argument("--out", type=Path, required=True, help="Where the JSON record goes.")
    p.add_argument("--no-check", action="store_true", help="Skip the full build of the changed corpus.")
    args = p.parse_args(argv)

    from index_format.change_log import CHANGES_DIR, ChangeLog

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    corpus = args.corpus / "corpus.jsonl" if args.corpus.is_dir() else args.corpus
    env = dict(os.environ, RAY_ADDRESS="auto")
    subprocess.run(["ray", "start", "--head", "--num-cpus", str(os.cpu_count()), "--include-dashboard", "false",
                    "--disable-usage-stats"], check=True, capture_output=True)
    try:
        root = args.work / "index"
        build_s, build_out = timed([sys.executable, "-m", "index_build", "--corpus", str(corpus), "--out", str(root),
                                    "--shards", str(args.shards), "--encoder", args.encoder, "--version", "full",
                                    "--no-progress"], env)
        docs = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
        rng = random.Random(0)
        edited = {}
        folds = []
        log = ChangeLog(root / CHANGES_DIR)
        for round_ in range(args.rounds):
            picked = rng.sample(range(len(docs)), args.changed)
            for i in picked:  # one write per document, as a client updating them one by one does
                d = edited.get(i, docs[i])
                d = edited[i] = dict(d, text=(d.get("text") or "") + f" Sentence {round_} was added through the API.")
                log.append([{"id": d["_id"], "title": d.get("title") or "", "text": d["text"],
                             "metadata": d.get("metadata") or {}}], [])
            fold_s, fold_out = timed([sys.executable, "-m", "index_build.fold", "--index", str(root), "--json"], env)
            summary = json.loads(fold_out)
            folds.append({"round": round_ + 1, "workers": "started by this fold" if round_ == 0 else "kept from the last",
                          "fold_s": round(fold_s, 2), "fold_share": round(fold_s / build_s, 4), "summary": summary})
            print(f"fold {round_ + 1} of {args.changed} documents: {fold_s:.2f} s ({100 * fold_s / build_s:.1f}% of the "
                  f"{build_s:.1f} s build); inside: {summary['seconds']}")
        record = {
            "bench": "fold_cost", "machine": machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "corpus": str(corpus), "documents": len(docs), "shards": args.shards, "encoder": args.encoder,
            "changed": args.changed, "full_build_s": round(build_s, 2), "folds": folds,
            "build_stdout_tail": build_out.strip().splitlines()[-12:],
        }
        if not args.no_check:
            for i, d in edited.items():
                docs[i] = d
            changed = args.work / "changed.jsonl"
            with open(changed, "w") as f:
                for d in docs:
                    f.write(json.dumps(d) + "\n")
            oracle_s, _ = timed([sys.executable, "-m", "index_build", "--corpus", str(changed), "--out",
                                 str(args.work / "oracle"), "--shards", str(args.shards), "--encoder", args.encoder,
                                 "--version", "oracle", "--no-progress", "--no-reuse"], env)
            record["oracle_build_s"] = round(oracle_s, 2)
            record["check"] = check(root, args.work / "oracle", args.queries)
            print(f"check against a full build of the changed corpus: {record['check']}")
        write_record(args.out, record)
    finally:
        subprocess.run(["ray", "stop", "--force"], capture_output=True)
    return 0


def same_ranking(a, b, rel: float = 1e-5) -> bool:
    """The same scores, rank for rank (to ``rel``), and the same chunks at each score; chunks tied at one score
    may come in any order (Lucene breaks ties by its document numbers, which a fold does not keep), and at the
    last score only as many as fit."""
    if len(a) != len(b) or any(abs(x.score - y.score) > rel * max(1.0, abs(y.score)) for x, y in zip(a, b, strict=True)):
        return False
    last = b[-1].score if b else 0.0
    above = lambda hits: {h.chunk_id for h in hits if h.score > last + rel * max(1.0, abs(last))}  # noqa: E731
    return above(a) == above(b)


def check(root: Path, oracle: Path, queries_from: Path | None) -> dict:
    """The folded version against the oracle: the top 100 of each leg for every test query."""
    from deployments.search.inprocess import LocalIndex

    queries = list(load_beir(queries_from)[0].values()) if queries_from else ["protein folding", "cancer cells"]
    got, want = LocalIndex(root), LocalIndex(oracle)
    same_bm25 = same_exact = 0
    recall = {"folded": 0.0, "oracle": 0.0}
    for q in queries:
        same_bm25 += same_ranking(got.bm25(q, 100), want.bm25(q, 100))
        vector = want.embed([q])
        exact_got, exact_want = exact_dense(got, vector), exact_dense(want, vector)
        same_exact += same_ranking(exact_got, exact_want)
        for name, index, exact in (("folded", got, exact_got), ("oracle", want, exact_want)):
            recall[name] += len({h.chunk_id for h in index.dense(vector, 100)} & {h.chunk_id for h in exact}) / 100
    return {"queries": len(queries), "bm25_top100_same_ranking": same_bm25, "exact_dense_top100_same_ranking": same_exact,
            "ann_recall_at_100_vs_exact": {k: round(v / len(queries), 4) for k, v in recall.items()}}


def exact_dense(index, vector, k: int = 100):
    """The exact dense top k over every shard's stored vectors (the oracle an approximate index is held to)."""
    return index.dense(vector, k, ann={"exact": True})


if __name__ == "__main__":
    sys.exit(main())
