"""Whether a ranking model may replace what a collection serves: the guard of ``relevance.rankers activate``.

A model is activated only when its gain in nDCG@10 over what is served, on held-out judged queries, is positive
with 95% confidence: the lower end of a one-sided 95% interval of the mean per-query gain is above 0. The interval
is a paired percentile bootstrap over queries (``relevance.tuning.paired_bootstrap``: 10,000 resamples, each query's
two scores drawn together). Paired, because both orders rank the same candidates of the same query, so most of a
query's difficulty cancels; a bootstrap, because per-query nDCG differences are bounded, skewed and often exactly 0
(the two orders agree on the top ten), which a t-test's normal approximation does not describe at these sizes.

A mean gain measured on few queries is mostly chance: on 25 held-out Cranfield queries a model read +0.043 and then
lowered nDCG@10 on new queries. Below ``MIN_QUERIES`` held-out queries the guard refuses without
computing an interval, and says how many more it needs: a percentile bootstrap of few paired differences is too
narrow (it cannot see the tails its sample missed, and per-query nDCG changes have long ones), so its bound claims
more than it knows. 50 is the size of a TREC topic set, the number that community settled on to compare two
rankings. It was also chosen after ``bench.guard_check`` (how often a model the guard accepts then lowers nDCG@10
on queries it never saw, over repeated splits of SciFact's and Cranfield's judgments): at 30, two Cranfield models
accepted on 30 and 31 held-out queries lowered it on new ones by 0.018 and 0.008; at 50, none (bench/README.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MIN_QUERIES = 50
CONFIDENCE = 0.95  # one-sided
RESAMPLES = 10_000


def decide(model: Mapping[str, float], served: Mapping[str, float], min_queries: int = MIN_QUERIES,
           confidence: float = CONFIDENCE, share: float | None = None) -> dict[str, Any]:
    """The verdict on per-query nDCG@10 of the model and of what is served, over the same held-out queries:
    ``accept``, ``why``, the means, the gain and its one-sided interval's lower end (``gain_low``; ``gain_high``, the
    upper end of the two-sided interval of the same level), the queries behind it, and the rule. ``share``: the
    validation share the queries were held out at, to say how many more judged queries would do."""
    from relevance.tuning import paired_bootstrap

    n = len(model)
    out: dict[str, Any] = {"queries": n, "min_queries": min_queries, "confidence": confidence,
                           "method": "one-sided paired bootstrap over queries"}
    if n < min_queries:
        more = min_queries - n
        judged = f" (about {round(more / share):,} more judged queries at a validation share of {share:g})" \
            if share else ""
        return out | {"accept": False, "why": f"{n} held-out queries; the guard needs at least {min_queries}: "
                                              f"{more} more held out{judged}"}
    c = paired_bootstrap(served, model, resamples=RESAMPLES, confidence=2 * confidence - 1)
    out |= {"model_ndcg": round(c.after, 4), "served_ndcg": round(c.before, 4), "gain": round(c.diff, 4),
            "gain_low": round(c.low, 4), "gain_high": round(c.high, 4), "p_not_better": round(c.p_not_better, 4)}
    if c.low > 0:
        return out | {"accept": True, "why": f"nDCG@10 gain {c.diff:+.4f} on {n} held-out queries, above 0 with "
                                             f"{confidence:.0%} confidence (lower bound {c.low:+.4f})"}
    return out | {"accept": False, "why": f"nDCG@10 gain {c.diff:+.4f} on {n} held-out queries is within chance: its "
                                          f"{confidence:.0%} lower bound is {c.low:+.4f}, not above 0"}
