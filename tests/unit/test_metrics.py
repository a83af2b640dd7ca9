"""The evaluation figures equal ir_measures (trec_eval) on hand-made runs; context measures by hand."""

from __future__ import annotations

import random

import ir_measures
import pytest
from ir_measures import RR, R, nDCG

from relevance.metrics import context_precision, context_recall, evaluate


def _case(seed: int):
    rng = random.Random(seed)
    docs = [f"d{i}" for i in range(60)]
    qrels = {f"q{q}": {d: rng.choice([0, 0, 1, 2, 3]) for d in rng.sample(docs, rng.randint(1, 15))} for q in range(25)}
    qrels["q-none"] = {"d1": 0}  # judged, nothing relevant
    run = {}
    for q in list(qrels)[:-3] + ["q-unjudged"]:  # 3 judged queries left unanswered, one answered unjudged
        scores = rng.sample(range(1, 10_000), rng.randint(0, 120))  # distinct: tie order differs by provider
        run[q] = {d: float(s) for d, s in zip(rng.sample(docs * 3, len(scores)), scores, strict=False)}
    return run, qrels


@pytest.mark.parametrize("seed", range(5))
def test_figures_equal_ir_measures(seed):
    run, qrels = _case(seed)
    ours = evaluate(run, qrels)
    theirs = {str(m): v for m, v in ir_measures.calc_aggregate([nDCG @ 10, R @ 100, RR @ 10], qrels, run).items()}
    for name in ("nDCG@10", "R@100", "RR@10"):
        assert ours[name] == pytest.approx(theirs[name], abs=1e-9), name


def test_context_precision_and_recall_by_hand():
    judged = {"a": 2, "b": 1, "c": 0, "z": 1}
    returned = ["a", "a", "c", "b", "x"]  # the document of each returned chunk, in order
    assert context_precision(returned, judged, 4) == pytest.approx(3 / 4)  # a, a, b relevant; c not
    assert context_recall(returned, judged, 4) == pytest.approx(2 / 3)  # a and b of a, b, z
    assert context_precision([], judged, 4) == 0.0
    figures = evaluate({"q": {"a": 3.0, "b": 2.0}}, {"q": judged}, {"q": returned}, k=4)
    assert figures["context_precision@4"] == pytest.approx(0.75) and figures["queries"] == 1
