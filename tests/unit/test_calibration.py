"""relevance_score's absolute scales (deployments.search.calibration): the logistic fit against scikit-learn's, a
hit's evidence with the floor of a leg that did not return it, and which scale a collection gets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deployments.search.calibration import (
    Calibration,
    Logistic,
    absolute_scores,
    evidence,
    feature,
    fit_logistic,
    leg_scores,
)
from deployments.search.hits import Hit


def test_the_fit_is_the_maximum_likelihood_scikit_learn_finds():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(7)
    x = np.column_stack([rng.uniform(0, 1, 4000), np.log1p(rng.exponential(8, 4000))])
    p = 1 / (1 + np.exp(-(6 * x[:, 0] + 0.8 * x[:, 1] - 5)))
    y = (rng.uniform(size=4000) < p).astype(float)
    ours = fit_logistic(x, y, l2=0.0)
    theirs = LogisticRegression(C=1e12, tol=1e-10, max_iter=10_000).fit(x, y)
    assert ours.weights == pytest.approx(theirs.coef_[0], rel=1e-4)
    assert ours.bias == pytest.approx(theirs.intercept_[0], rel=1e-4)
    assert [ours.probability(row) for row in x[:5]] == pytest.approx(theirs.predict_proba(x[:5])[:, 1], rel=1e-4)


def test_separable_judgments_still_give_finite_weights_and_one_class_is_refused():
    x = np.array([[0.1], [0.2], [0.8], [0.9]])
    fitted = fit_logistic(x, np.array([0, 0, 1, 1]))
    assert all(math.isfinite(w) for w in fitted.weights) and fitted.probability([0.9]) > 0.5 > fitted.probability([0.1])
    with pytest.raises(ValueError, match="all relevant or all not"):
        fit_logistic(x, np.array([1, 1, 1, 1]))


def test_the_probability_does_not_overflow_far_from_zero():
    model = Logistic((1000.0,), 0.0)
    assert model.probability([5.0]) == 1.0 and model.probability([-5.0]) == 0.0


def test_a_hit_missing_from_a_leg_gets_its_lowest_returned_score():
    legs = {"docs": ([Hit("a#0", 0.9, 0, "docs"), Hit("b#0", 0.5, 0, "docs")],
                     [Hit("b#0", 12.0, 0, "docs"), Hit("c#0", 7.0, 0, "docs")]),
            "vec": ([Hit("x#0", 0.3, 0, "vec")], [])}
    got = evidence([("a#0", "docs"), ("b#0", "docs"), ("c#0", "docs"), ("x#0", "vec")], legs)
    assert got == [{"dense": 0.9, "keyword": 7.0}, {"dense": 0.5, "keyword": 12.0},
                   {"dense": 0.5, "keyword": 7.0}, {"dense": 0.3}]
    assert {leg: a.tolist() for leg, a in leg_scores(["a#0", "b#0", "c#0"], *legs["docs"]).items()} == {
        "dense": [0.9, 0.5, 0.5], "keyword": [7.0, 12.0, 7.0]}


def scored(rows: list[dict[str, float]]) -> dict[str, np.ndarray]:
    """Hits' evidence as ``leg_scores`` gives it: leg -> an array over the hits."""
    return {leg: np.array([r[leg] for r in rows]) for leg in rows[0]}


def test_which_scale_a_collection_gets():
    calibration = Calibration({"hybrid": Logistic((4.0, 1.0), -3.0)}, {"queries": 10})
    both = scored([{"dense": 0.7, "keyword": 9.0}, {"dense": -0.2, "keyword": 0.0}])
    scale, scores = absolute_scores("hybrid", both, calibration, 2)
    assert scale == "calibrated"
    assert scores[0] == pytest.approx(1 / (1 + math.exp(-(4 * 0.7 + math.log1p(9.0) - 3))), rel=1e-12)
    model = calibration.models["hybrid"]
    assert scores == pytest.approx([model.probability([feature("dense", d), feature("keyword", k)])
                                    for d, k in zip(both["dense"], both["keyword"], strict=True)], rel=1e-12)
    # No model for the vector leg alone: its cosine, clipped to [0, 1].
    assert absolute_scores("vector", scored([{"dense": 0.7}, {"dense": -0.2}]), calibration, 2) == ("cosine",
                                                                                                  [0.7, 0.0])
    assert absolute_scores("hybrid", both, None, 2) == ("cosine", [0.7, 0.0])
    # A hybrid search whose keyword leg found nothing ranked by its dense leg: the vector model, else its cosine.
    with_vector = Calibration({"vector": Logistic((5.0,), -2.5)}, {})
    assert absolute_scores("hybrid", scored([{"dense": 0.5}]), with_vector, 1) == ("calibrated", [0.5])
    assert absolute_scores("hybrid", scored([{"dense": 0.5}]), calibration, 1) == ("cosine", [0.5])
    # BM25 has no absolute scale: left for min-max over the ranking.
    assert absolute_scores("keyword", scored([{"keyword": 9.0}]), None, 1) == ("minmax", [None])
    # Far out on either side the probability is 0 or 1, never an overflow.
    steep = Calibration({"vector": Logistic((1000.0,), 0.0)}, {})
    assert absolute_scores("vector", scored([{"dense": 5.0}, {"dense": -5.0}]), steep, 2) == ("calibrated", [1.0, 0.0])


def test_a_calibration_round_trips_and_a_wrong_one_is_refused():
    calibration = Calibration({"hybrid": Logistic((4.0, 1.0), -3.0), "vector": Logistic((5.0,), -2.5)},
                              {"queries": 10, "version": "v1"})
    assert Calibration.from_json(calibration.to_json()) == calibration
    data = calibration.to_json()
    data["models"]["vector"]["legs"] = ["keyword"]
    with pytest.raises(ValueError, match="'vector' over"):
        Calibration.from_json(data)


def test_bm25_is_read_on_a_log_scale_and_cosine_as_it_is():
    assert feature("keyword", math.e - 1) == pytest.approx(1.0) and feature("keyword", -3.0) == 0.0
    assert feature("dense", -0.25) == -0.25
