"""A large BEIR corpus made offline: a dataset's documents plus synthetic distractor passages.

Each distractor is a few sentences drawn at random from the dataset's own documents, so its words and
their frequencies are realistic and it competes with the relevant documents for every query; the
dataset's queries and qrels are kept, so quality stays measurable (the task only gets harder).

    python -m bench.scale_corpus --data ../shared/data/scifact --distractors 200000 --out bench/out/scifact-200k
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
from pathlib import Path

from tqdm import tqdm


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale_corpus", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder")
    ap.add_argument("--distractors", type=int, default=200_000)
    ap.add_argument("--sentences", type=int, nargs=2, default=(2, 5), help="sentences per distractor (min max)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    with open(args.data / "corpus.jsonl") as f:
        docs = [json.loads(line) for line in f]
    sentences = [s for d in docs for s in re.split(r"(?<=[.!?])\s+", d.get("text") or "") if len(s.split()) >= 5]
    titles = [d.get("title") or "" for d in docs]
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "corpus.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
        for i in tqdm(range(args.distractors), desc="distractors", unit="doc"):
            text = " ".join(rng.choice(sentences) for _ in range(rng.randint(*args.sentences)))
            f.write(json.dumps({"_id": f"x{i:07d}", "title": rng.choice(titles), "text": text}) + "\n")
    shutil.copy(args.data / "queries.jsonl", args.out / "queries.jsonl")
    shutil.copytree(args.data / "qrels", args.out / "qrels", dirs_exist_ok=True)
    print(f"{args.out}: {len(docs):,} documents + {args.distractors:,} distractors "
          f"(from {len(sentences):,} sentences)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
