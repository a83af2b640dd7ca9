"""The ranking model's activation guard (relevance.guard): a gain beyond chance accepted, one within it refused, too few
held-out queries refused with how many more are needed; its bound checked against a brute-force bootstrap."""

from __future__ import annotations

import random

import pytest

from relevance.guard import MIN_QUERIES, decide


def paired(gains: list[float], base: float = 0.4) -> tuple[dict, dict]:
    return ({f"q{i}": base + g for i, g in enumerate(gains)}, {f"q{i}": base for i in range(len(gains))})


def test_a_clear_gain_is_accepted():
    rng = random.Random(1)
    model, served = paired([0.08 + rng.uniform(-0.05, 0.05) for _ in range(60)])
    verdict = decide(model, served)
    assert verdict["accept"] and verdict["queries"] == 60 and 0 < verdict["gain_low"] < verdict["gain"]
    assert "above 0 with 95% confidence" in verdict["why"]


def test_a_gain_within_noise_is_refused():
    """Cranfield's case in miniature: a mean gain of about +0.04 carried by a few queries among many that moved
    both ways."""
    rng = random.Random(2)
    gains = [rng.choice([-0.3, 0.3]) + rng.uniform(-0.1, 0.1) for _ in range(60)]
    shift = 0.04 - sum(gains) / len(gains)
    model, served = paired([g + shift for g in gains])
    verdict = decide(model, served)
    assert verdict["gain"] == pytest.approx(0.04, abs=1e-4)
    assert not verdict["accept"] and verdict["gain_low"] <= 0 and "within chance" in verdict["why"]


def test_too_few_held_out_queries_are_refused_saying_how_many_more():
    model, served = paired([0.2] * 45)
    verdict = decide(model, served, share=0.2)
    assert not verdict["accept"] and "gain" not in verdict
    assert verdict["why"] == (f"45 held-out queries; the guard needs at least {MIN_QUERIES}: 5 more held out "
                              "(about 25 more judged queries at a validation share of 0.2)")


def test_the_bound_is_the_bootstrap_s_fifth_percentile():
    """Oracle: 2,000 resamples of the mean gain drawn here with numpy; the guard's one-sided 95% bound (10,000
    resamples of its own) within their sampling noise of the 5th percentile."""
    import numpy as np

    rng = random.Random(3)
    gains = [rng.gauss(0.02, 0.1) for _ in range(60)]
    model, served = paired(gains)
    draws = np.random.default_rng(0).choice(np.array(gains), size=(2000, len(gains))).mean(axis=1)
    verdict = decide(model, served)
    assert verdict["gain_low"] == pytest.approx(float(np.percentile(draws, 5)), abs=0.006)
    assert verdict["gain_high"] == pytest.approx(float(np.percentile(draws, 95)), abs=0.006)
