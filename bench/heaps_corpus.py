"""A large BEIR corpus whose vocabulary grows with its size, as a real corpus's does: a dataset's documents (judged
ones included, with its queries and qrels, so quality stays measurable inside it) followed by generated documents.

Heaps' law, fitted to the dataset's own token stream (distinct terms V = K * n ** beta after n tokens; SciFact:
K 35.2, beta 0.495), is continued past it: each generated token is a new word with the probability the curve's
slope gives at that point (K * beta * n ** (beta - 1)), else a word already seen, drawn in proportion to how often it
has been seen (so frequencies keep Zipf's shape: the few common words get commoner, the tail grows). The dataset's
words and counts are where it starts; new words are pronounceable strings of syllables, six letters at least, never a
word of the dataset. Documents take their lengths (title and text, in tokens) from the dataset's, and sentences of
its mean length. Deterministic from ``--seed``.

    python -m bench.heaps_corpus --data DATA/scifact --documents 1000000 --out OUT/heaps-1m

Prints the fit, and the corpus's vocabulary against the curve at its end; ``heaps.json`` in ``--out`` keeps both.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

TOKEN = re.compile(r"[a-z0-9]+")
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # 70
BATCH = 1 << 20  # tokens drawn at once (counts are updated between batches)


@dataclass(frozen=True)
class Heaps:
    k: float
    beta: float

    def vocabulary(self, tokens: float) -> float:
        return self.k * tokens ** self.beta

    def new_word_probability(self, position: np.ndarray) -> np.ndarray:
        return np.minimum(1.0, self.k * self.beta * position ** (self.beta - 1.0))


def tokens_of(doc: dict) -> tuple[list[str], list[str]]:
    return TOKEN.findall((doc.get("title") or "").lower()), TOKEN.findall((doc.get("text") or "").lower())


def fit(stream: list[str], points: int = 50) -> Heaps:
    """Heaps' law fitted by least squares on log-log, over the stream's second half of checkpoints onwards the first
    tenth (the start of a stream is its noisiest part)."""
    seen: set[str] = set()
    xs, ys, every = [], [], max(1, len(stream) // points)
    for i, token in enumerate(stream, 1):
        seen.add(token)
        if i % every == 0 and i >= len(stream) // 10:
            xs.append(i)
            ys.append(len(seen))
    beta, log_k = np.polyfit(np.log(xs), np.log(ys), 1)
    return Heaps(float(np.exp(log_k)), float(beta))


def word(index: int) -> str:
    """The ``index``-th made-up word: its digits in base 70, each a syllable, at least three (padded with the first),
    so every index has its own word."""
    digits = []
    while True:
        index, d = divmod(index, len(SYLLABLES))
        digits.append(d)
        if index == 0:
            break
    digits += [0] * (3 - len(digits))
    return "".join(SYLLABLES[d] for d in reversed(digits))


class Words:
    """The vocabulary as it grows: strings by id, counts by id, and the next made-up word that is not a real one."""

    def __init__(self, stream: list[str]):
        ids: dict[str, int] = {}
        for token in stream:
            ids.setdefault(token, len(ids))
        self.strings = list(ids)
        self.real = set(ids)
        self.counts = np.bincount(np.fromiter((ids[t] for t in stream), dtype=np.int64, count=len(stream)),
                                  minlength=len(ids)).astype(np.int64)
        self.made = 0

    def add(self, n: int) -> None:
        for _ in range(n):
            while (w := word(self.made)) in self.real:
                self.made += 1
            self.made += 1
            self.strings.append(w)
        self.counts = np.concatenate([self.counts, np.zeros(n, dtype=np.int64)])


def draw(words: Words, heaps: Heaps, start: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Word ids of tokens ``start`` to ``start + n`` of the stream (positions count from the dataset's first token)."""
    out = np.empty(n, dtype=np.int64)
    for lo in range(0, n, BATCH):
        size = min(BATCH, n - lo)
        position = np.arange(start + lo + 1, start + lo + size + 1, dtype=np.float64)
        new = rng.random(size) < heaps.new_word_probability(position)
        fresh = int(new.sum())
        first = len(words.strings)
        words.add(fresh)
        cumulative = np.cumsum(words.counts[:first])
        picks = np.searchsorted(cumulative, rng.random(size - fresh) * cumulative[-1], side="right")
        batch = np.empty(size, dtype=np.int64)
        batch[new] = np.arange(first, first + fresh)
        batch[~new] = picks
        words.counts += np.bincount(batch, minlength=len(words.counts))
        out[lo:lo + size] = batch
    return out


def generate(data: Path, documents: int, out: Path, seed: int = 0, progress: bool = True) -> dict:
    """Write ``out`` (corpus.jsonl, queries.jsonl, qrels/, heaps.json) with ``documents`` documents in all; returns
    what heaps.json holds."""
    docs = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines() if line.strip()]
    if documents < len(docs):
        raise ValueError(f"--documents {documents:,} is fewer than the dataset's own {len(docs):,}")
    split = [tokens_of(d) for d in docs]
    stream = [t for title, text in split for t in (*title, *text)]
    heaps = fit(stream)
    words = Words(stream)
    rng = np.random.default_rng(seed)
    title_lengths = np.array([len(title) for title, _ in split])
    text_lengths = np.array([max(1, len(text)) for _, text in split])
    sentence = max(5, round(len(stream) / max(1, sum(d.get("text", "").count(". ") + 1 for d in docs))))
    out.mkdir(parents=True, exist_ok=True)
    made = documents - len(docs)
    position, checkpoints = len(stream), []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=made, desc="documents", unit="doc", file=sys.stderr)
    with open(out / "corpus.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
        step = 10_000
        for lo in range(0, made, step):
            n = min(step, made - lo)
            pick = rng.integers(0, len(docs), size=n)
            t_len, x_len = title_lengths[pick], text_lengths[pick]
            ids = draw(words, heaps, position, int(t_len.sum() + x_len.sum()), rng)
            position += len(ids)
            strings, at = words.strings, 0
            for i in range(n):
                title = " ".join(strings[w] for w in ids[at:at + t_len[i]])
                at += t_len[i]
                body = [strings[w] for w in ids[at:at + x_len[i]]]
                at += x_len[i]
                text = ". ".join(" ".join(body[s:s + sentence]) for s in range(0, len(body), sentence)) + "."
                f.write(json.dumps({"_id": f"h{lo + i:09d}", "title": title, "text": text}) + "\n")
            checkpoints.append({"tokens": position, "vocabulary": int((words.counts > 0).sum()),
                                "heaps": round(heaps.vocabulary(position))})
            if bar is not None:
                bar.update(n)
    if bar is not None:
        bar.close()
    shutil.copy(data / "queries.jsonl", out / "queries.jsonl")
    shutil.copytree(data / "qrels", out / "qrels", dirs_exist_ok=True)
    vocabulary = int((words.counts > 0).sum())
    summary = {"data": str(data), "documents": documents, "dataset_documents": len(docs), "seed": seed,
               "fit": asdict(heaps), "dataset_tokens": len(stream), "dataset_vocabulary": len(words.real),
               "tokens": position, "vocabulary": vocabulary, "heaps_vocabulary": round(heaps.vocabulary(position)),
               "sentence_tokens": sentence, "checkpoints": checkpoints[:: max(1, len(checkpoints) // 20)]}
    (out / "heaps.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.heaps_corpus", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder (corpus.jsonl, queries.jsonl, "
                    "qrels/): its documents are kept and its Heaps curve continued")
    ap.add_argument("--documents", type=int, required=True, help="documents in all, the dataset's included")
    ap.add_argument("--out", type=Path, required=True, help="the folder to write (a BEIR dataset folder)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    try:
        s = generate(args.data, args.documents, args.out, args.seed, not args.no_progress)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: {s['documents']:,} documents ({s['dataset_documents']:,} of {args.data.name}), "
          f"{s['tokens']:,} tokens, {s['vocabulary']:,} distinct words (Heaps' law fitted to {args.data.name}: "
          f"K {s['fit']['k']:.1f}, beta {s['fit']['beta']:.3f}, gives {s['heaps_vocabulary']:,})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
