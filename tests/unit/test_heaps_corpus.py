"""The growing-vocabulary corpus (bench.heaps_corpus) on a small dataset made here: the dataset's documents, queries
and qrels kept as they are; the vocabulary after the generated documents on the Heaps curve fitted to the dataset;
documents as long as the dataset's; made-up words never the dataset's and each index its own; the same seed, the
same corpus."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from bench.heaps_corpus import TOKEN, fit, generate, word


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """400 documents whose words follow Zipf's law over a vocabulary that keeps growing (so Heaps' law holds in it)."""
    folder = tmp_path_factory.mktemp("dataset")
    rng = random.Random(7)
    ranks = np.arange(1, 20_001)
    weights = (1 / ranks) / (1 / ranks).sum()
    nprng = np.random.default_rng(7)
    with open(folder / "corpus.jsonl", "w") as f:
        for i in range(400):
            ids = nprng.choice(ranks, size=rng.randint(40, 200), p=weights)
            words = [f"w{r}x" for r in ids]
            f.write(json.dumps({"_id": f"d{i}", "title": " ".join(words[:8]), "text": ". ".join(
                " ".join(words[s:s + 12]) for s in range(8, len(words), 12))}) + "\n")
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "w1x w2x"}) + "\n")
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td3\t1\n")
    return folder


def test_the_dataset_is_kept_and_the_vocabulary_follows_its_curve(dataset, tmp_path):
    s = generate(dataset, 4_000, tmp_path / "out", seed=1, progress=False)
    lines = (tmp_path / "out" / "corpus.jsonl").read_text().splitlines()
    assert lines[:400] == (dataset / "corpus.jsonl").read_text().splitlines()  # the dataset's own, first, unchanged
    assert len(lines) == 4_000 and len({json.loads(line)["_id"] for line in lines}) == 4_000
    assert (tmp_path / "out" / "queries.jsonl").read_text() == (dataset / "queries.jsonl").read_text()
    assert (tmp_path / "out" / "qrels" / "test.tsv").is_file()
    made = [json.loads(line) for line in lines[400:]]
    tokens = [t for d in made for t in TOKEN.findall((d["title"] + " " + d["text"]).lower())]
    assert s["tokens"] == s["dataset_tokens"] + len(tokens)
    vocabulary = {t for line in lines for t in TOKEN.findall(line.lower())} - {"id", "title", "text"} - \
        {d["_id"] for d in map(json.loads, lines)}
    assert s["vocabulary"] == len(vocabulary)
    assert abs(s["vocabulary"] / s["heaps_vocabulary"] - 1) < 0.05, s  # on the curve fitted to the dataset
    assert s["vocabulary"] > 1.5 * s["dataset_vocabulary"]  # it grew well past the dataset's own words
    assert abs(len(tokens) / len(made) / (s["dataset_tokens"] / 400) - 1) < 0.1  # documents of the dataset's lengths
    real = {t for line in lines[:400] for t in TOKEN.findall(line.lower())}
    new = {t for t in tokens if t not in real}
    assert new and all(len(t) >= 6 and t.isalpha() for t in new)


def test_the_same_seed_makes_the_same_corpus_and_another_seed_another(dataset, tmp_path):
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        generate(dataset, 1_000, tmp_path / name, seed=seed, progress=False)
    read = {n: (tmp_path / n / "corpus.jsonl").read_bytes() for n in "abc"}
    assert read["a"] == read["b"] != read["c"]


def test_the_fit_recovers_a_known_curve_and_made_up_words_are_each_their_own():
    rng = np.random.default_rng(0)
    stream, fresh = [], 0
    for n in range(1, 200_001):  # a stream with exactly Heaps' slope for K 20, beta 0.5
        if rng.random() < min(1.0, 20 * 0.5 * n ** -0.5):
            fresh += 1
            stream.append(f"t{fresh}")
        else:
            stream.append(f"t{rng.integers(1, fresh + 1)}")
    heaps = fit(stream)
    assert abs(heaps.beta - 0.5) < 0.03 and abs(heaps.k / 20 - 1) < 0.2, heaps
    assert len({word(i) for i in range(400_000)}) == 400_000
