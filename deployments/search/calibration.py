"""``relevance_score`` on a scale that means the same for every query: a threshold of 0.5 keeps what is more likely
relevant than not, and a query with nothing relevant gets low scores, not a best hit at 1.0.

A hit's score comes from its own evidence, never from the other hits of its ranking (min-max's flaw: a lone hit
scored 1.0 and a nonsense query's best hit 1.0 too):

- ``probability``: reranked hits keep the reranker's probability;
- ``calibrated``: a collection with a calibration (``python -m relevance.calibrate``: a logistic regression fitted
  on its judged queries) gets the probability that a hit is relevant given its cosine and its BM25 score;
- ``cosine``: otherwise the dense leg's cosine, clipped to [0, 1]: absolute (the encoder's own similarity, not
  ranked against the other hits), though not a probability;
- ``minmax``: a keyword-only search of an uncalibrated collection has no absolute score (BM25 grows with the
  query's terms and their rarity), so min-max over the ranking, as ``relevance_scale: minmax`` asks for any search.

A hit missing from a leg's candidates is given that leg's lowest returned score: its own is at most that (the leg
returned its best), so its evidence is bounded, not invented. Ray-free and numpy-only: the router, the in-process
pipeline and the fitting command share it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from deployments.search.hits import chunk_id_of, score_of

# The legs a calibration has a model for, by the legs a search ranked with.
LEGS = {"hybrid": ("dense", "keyword"), "vector": ("dense",), "keyword": ("keyword",)}


def feature(leg: str, score: float) -> float:
    """A leg's score as the regression reads it: cosine as it is; BM25 on a log scale (it grows without bound, and
    a document twice as good by BM25 is not twice as likely relevant)."""
    return score if leg == "dense" else math.log1p(max(score, 0.0))


@dataclass(frozen=True)
class Logistic:
    """P(relevant) = sigmoid(weights . features + bias)."""

    weights: tuple[float, ...]
    bias: float

    def probability(self, features: Sequence[float]) -> float:
        z = self.bias + sum(w * x for w, x in zip(self.weights, features, strict=True))
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, iterations: int = 50) -> Logistic:
    """Maximum likelihood by Newton's method (a few features: a solve each step), with a small L2 penalty on the
    weights so a leg that separates the judged pairs perfectly still has a finite weight."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or len(x) != len(y) or not len(y):
        raise ValueError(f"features {x.shape} and labels {y.shape} do not pair")
    if y.min() == y.max():
        raise ValueError("the judged pairs are all relevant or all not: nothing to calibrate against")
    a = np.hstack([x, np.ones((len(x), 1))])
    beta = np.zeros(a.shape[1])
    penalty = np.full(a.shape[1], l2 * len(y))
    penalty[-1] = 0.0  # the bias is not shrunk
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(a @ beta, -30, 30)))
        gradient = a.T @ (p - y) + penalty * beta
        hessian = (a * (p * (1 - p))[:, None]).T @ a + np.diag(penalty)
        step = np.linalg.solve(hessian + 1e-9 * np.eye(len(beta)), gradient)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return Logistic(tuple(float(w) for w in beta[:-1]), float(beta[-1]))


@dataclass(frozen=True)
class Calibration:
    """A collection's fitted models, one per legs searched (``LEGS``), with what they were fitted on."""

    models: dict[str, Logistic]
    fitted: dict[str, Any]  # version, queries, pairs, held-out figures (``relevance.calibrate``)

    def probabilities(self, method: str, scores: dict[str, np.ndarray]) -> np.ndarray:
        """Each hit's probability of relevance under the model of ``method``'s legs (``Logistic.probability`` over
        each leg's ``feature``), every hit at once, from their ``leg_scores``."""
        model = self.models[method]
        z = np.full(len(next(iter(scores.values()))), model.bias)
        for weight, leg in zip(model.weights, LEGS[method], strict=True):
            z += weight * (scores[leg] if leg == "dense" else np.log1p(np.maximum(scores[leg], 0.0)))
        return np.exp(-np.logaddexp(0.0, -z))  # sigmoid(z), without overflow either way

    def to_json(self) -> dict[str, Any]:
        return {"models": {m: {"legs": list(LEGS[m]), "weights": list(lg.weights), "bias": lg.bias}
                           for m, lg in self.models.items()}, "fitted": self.fitted}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        models = {}
        for method, m in data["models"].items():
            if method not in LEGS or tuple(m["legs"]) != LEGS[method] or len(m["weights"]) != len(LEGS[method]):
                raise ValueError(f"calibration model {method!r} over {m.get('legs')}: expected one of {LEGS}")
            models[method] = Logistic(tuple(float(w) for w in m["weights"]), float(m["bias"]))
        return cls(models, dict(data.get("fitted") or {}))


def leg_scores(chunk_ids: Sequence[str], dense: Sequence, keyword: Sequence) -> dict[str, np.ndarray]:
    """One collection's evidence as arrays: leg -> each chunk's score in that leg's hits (``Retrieved.legs``), a chunk
    missing from a leg given that leg's lowest returned score. A leg not searched, or that returned nothing, is
    absent. Arrays, so a ranking of hundreds of hits is scored in a few numpy passes, not a dict and a call a hit."""
    out = {}
    for leg, hits in (("dense", dense), ("keyword", keyword)):
        if hits:
            own = dict(zip(map(chunk_id_of, hits), map(score_of, hits), strict=True))
            floor = min(own.values())
            out[leg] = np.fromiter((own.get(c, floor) for c in chunk_ids), dtype=np.float64, count=len(chunk_ids))
    return out


def evidence(keys: Sequence[tuple[str, str]], legs: dict[str, tuple[list, list]]) -> list[dict[str, float]]:
    """Each hit's score in each leg its collection searched (``Retrieved.legs``: per collection, its dense and
    keyword hits), as ``leg_scores`` gives them, one dict a hit (what ``relevance.calibrate`` fits on)."""
    arrays = {name: leg_scores([c for c, n in keys if n == name], dense, keyword)
              for name, (dense, keyword) in legs.items()}
    at = dict.fromkeys(legs, 0)
    out = []
    for _, name in keys:
        i = at.get(name, 0)
        out.append({leg: float(values[i]) for leg, values in arrays.get(name, {}).items()})
        if name in at:
            at[name] += 1
    return out


def legs_searched(method: str, have: Sequence[str]) -> str:
    """The ``LEGS`` key of the legs a collection's hits have evidence from (``have``): a hybrid search whose keyword
    leg found nothing (no query term in the collection) ranked by the dense leg alone, as a vector search does."""
    if not have:
        return method
    return next((m for m, legs in LEGS.items() if set(legs) == set(have)), method)


def absolute_scores(method: str, scores: dict[str, np.ndarray], calibration: Calibration | None, n: int
                    ) -> tuple[str, list[float | None]]:
    """The scale a collection's ``n`` hits get without a reranker, and each hit's score on it (None: none on it,
    which ``relevance_scores`` fills by min-max), from their ``leg_scores``."""
    legs = legs_searched(method, list(scores))
    if calibration is not None and legs in calibration.models:
        # No hits (a keyword search no term of which the collection holds): nothing to score, and no leg's array.
        return "calibrated", calibration.probabilities(legs, scores).tolist() if n else []
    if "dense" in LEGS[legs] and "dense" in scores:
        return "cosine", np.clip(scores["dense"], 0.0, 1.0).tolist()
    return "minmax", [None] * n
