"""Choosing fusion settings from judgments, Ray-free: replay fusion over recorded legs, score, compare.

A search's two legs (dense and BM25 candidates with their scores) do not depend on the fusion settings,
so they are fetched once per query (``debug: true`` at the deepest candidate depth) and every setting
is replayed here with the router's own fusion functions. Truncating a recorded leg to its best ``d``
equals asking the shards for ``d``: each shard's top-d holds every member of the global top-d.

Settings are chosen on training queries and judged on held-out ones; the difference is reported with a
paired bootstrap interval (Efron and Tibshirani 1993; as in Sakai, "Evaluating evaluation metrics
based on the bootstrap", SIGIR 2006) so a user sees whether a gain is more than noise.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from deployments.search.fusion import relevance_scores, rrf, weighted
from deployments.search.hits import Hit
from index_format.chunk_ids import chunk_id, doc_of
from relevance.metrics import ndcg_at


@dataclass(frozen=True)
class Legs:
    """One query's recorded candidates, best first: (chunk id, score) per leg."""

    dense: tuple[tuple[str, float], ...]
    keyword: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class FusionSetting:
    """What the replay varies; the fields map onto RouterSettings (see ``router_settings``)."""

    fusion: str = "rrf"
    rrf_k: int = 60
    dense_weight: float = 0.5
    candidates: int = 100
    min_relevance_score: float | None = None

    def label(self) -> str:
        how = f"rrf k={self.rrf_k}" if self.fusion == "rrf" else f"weighted dense={self.dense_weight:.2f}"
        cut = "" if self.min_relevance_score is None else f", min score {self.min_relevance_score:g}"
        return f"{how}, {self.candidates} candidates{cut}"

    def request(self) -> dict:
        """The same setting as fields of one POST /search body."""
        body: dict = {"fusion": self.fusion, "candidates": self.candidates}
        if self.fusion == "rrf":
            body["rrf_k"] = self.rrf_k
        else:
            body["weights"] = {"dense": self.dense_weight, "keyword": round(1 - self.dense_weight, 6)}
        if self.min_relevance_score is not None:  # tuned on the minmax scale (``relevance_of``)
            body |= {"min_relevance_score": self.min_relevance_score, "relevance_scale": "minmax"}
        return body

    def router_settings(self) -> dict:
        """The RouterSettings fields that make this setting the service's default."""
        out = {"fusion": self.fusion, "rrf_k": self.rrf_k, "dense_weight": self.dense_weight,
               "keyword_weight": round(1 - self.dense_weight, 6), "candidate_base": self.candidates,
               "candidate_factor": 1, "deepen_when_flat": False}
        if self.min_relevance_score is not None:
            out["min_relevance_score"] = self.min_relevance_score
        return out


def fuse(legs: Legs, setting: FusionSetting) -> list[Hit]:
    """The fused chunk ranking the router produces for ``setting`` (before rerank and MMR), computed with the
    router's own functions: the oracle ``replay`` is tested against."""
    d = setting.candidates
    dense = [Hit(c, s) for c, s in legs.dense[:d]]
    keyword = [Hit(c, s) for c, s in legs.keyword[:d]]
    if setting.fusion == "rrf":
        fused = rrf([dense, keyword], rrf_k=setting.rrf_k)
    else:
        fused = weighted([dense, keyword], [setting.dense_weight, 1 - setting.dense_weight])
    if setting.min_relevance_score is None:
        return fused
    relevance = relevance_of(setting, [h.score for h in fused])
    return [h for h, r in zip(fused, relevance, strict=True) if r >= setting.min_relevance_score]


def relevance_of(setting: FusionSetting, scores: list[float]) -> list[float]:
    """The ``relevance_score`` the router gives a fused ranking of ``setting`` (what a threshold cuts):
    a weighted fusion's own score (its weights sum to 1), RRF's min-max over the ranking."""
    return relevance_scores(scores, "minmax" if setting.fusion == "rrf" else "weighted", 1.0)


def replay(legs: Legs, setting: FusionSetting) -> list[tuple[str, float]]:
    """``fuse`` as (chunk id, score) pairs, without building Hit objects: a grid replays it hundreds of thousands
    of times. The same arithmetic in the same order, so the same scores and ranking (tests/unit/test_tuning.py
    checks it against ``fuse``). Legs hold each chunk once, as the router's legs do."""
    d = setting.candidates
    scores: dict[str, float] = {}
    if setting.fusion == "rrf":
        for leg in (legs.dense[:d], legs.keyword[:d]):
            for rank, (cid, _) in enumerate(leg, start=1):
                scores[cid] = scores.get(cid, 0.0) + 1.0 / (setting.rrf_k + rank)
    else:
        for leg, w in ((legs.dense[:d], setting.dense_weight), (legs.keyword[:d], 1 - setting.dense_weight)):
            if not leg:
                continue
            lo, hi = min(s for _, s in leg), max(s for _, s in leg)
            for cid, s in leg:
                scores[cid] = scores.get(cid, 0.0) + w * (1.0 if hi == lo else (s - lo) / (hi - lo))
    cut = setting.min_relevance_score
    ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    if cut is None:
        return ranked
    relevance = relevance_of(setting, [s for _, s in ranked])
    return [pair for pair, r in zip(ranked, relevance, strict=True) if r >= cut]


def collapse(leg: tuple[tuple[str, float], ...]) -> tuple[tuple[str, float], ...]:
    """A leg of chunks as a leg of documents, each at its best chunk (the chunk id becomes "doc#0")."""
    seen: dict[str, float] = {}
    for cid, score in leg:
        seen.setdefault(doc_of(cid), score)
    return tuple((chunk_id(d, 0), s) for d, s in seen.items())


def doc_ranking(chunks: Iterable[tuple[str, float]], aggregate: str = "max", limit: int = 100) -> list[str]:
    """Documents ranked from (chunk id, score) pairs, best first: at their best chunk ("max", the order the
    service returns) or by the sum of their chunks' scores ("sum")."""
    if aggregate == "max":
        seen: dict[str, None] = {}
        for cid, _ in chunks:
            seen.setdefault(doc_of(cid))
            if len(seen) == limit:
                break
        return list(seen)
    totals: dict[str, float] = {}
    for cid, score in chunks:
        totals[doc_of(cid)] = totals.get(doc_of(cid), 0.0) + score
    return [d for d, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))][:limit]


AGGREGATES = ("chunk-max", "chunk-sum", "doc-max")


def per_query_ndcg(legs: Mapping[str, Legs], qrels: Mapping[str, Mapping[str, int]], setting: FusionSetting,
                   k: int = 10, aggregate: str = "chunk-max") -> dict[str, float]:
    """nDCG@k of every judged query (0 for a judged query without recorded legs). ``aggregate``: how documents
    are ranked, "chunk-max" (what the service returns), "chunk-sum", or "doc-max" (each leg collapsed to
    documents before fusing)."""
    out = {}
    for qid, judged in qrels.items():
        q = legs.get(qid)
        if q is None:
            out[qid] = 0.0
            continue
        if aggregate == "doc-max":
            q = Legs(collapse(q.dense), collapse(q.keyword))
        docs = doc_ranking(replay(q, setting), "sum" if aggregate == "chunk-sum" else "max", limit=k)
        out[qid] = ndcg_at(docs, judged, k)
    return out


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def grid(fusions: Sequence[str] = ("rrf", "weighted"), rrf_ks: Sequence[int] = (10, 20, 40, 60, 100),
         dense_weights: Sequence[float] = tuple(round(0.1 * i, 1) for i in range(1, 10)),
         candidates: Sequence[int] = (50, 100, 200, 400)) -> list[FusionSetting]:
    """Every combination, without repeating the knobs a fusion method ignores."""
    out = []
    for fusion, depth in itertools.product(fusions, candidates):
        if fusion == "rrf":
            out += [FusionSetting("rrf", rrf_k=k, candidates=depth) for k in rrf_ks]
        else:
            out += [FusionSetting("weighted", dense_weight=w, candidates=depth) for w in dense_weights]
    return out


@dataclass
class Scored:
    setting: FusionSetting
    score: float


def search(legs: Mapping[str, Legs], qrels: Mapping[str, Mapping[str, int]], settings: Sequence[FusionSetting],
           k: int = 10, progress: Callable[[int], None] | None = None) -> list[Scored]:
    """Every setting scored by mean nDCG@k, best first. Ties keep the grid's order (the simpler setting
    first), so a tie never moves a default for nothing."""
    scored = []
    for setting in settings:
        scored.append(Scored(setting, mean(per_query_ndcg(legs, qrels, setting, k).values())))
        if progress:
            progress(1)
    return sorted(scored, key=lambda s: -s.score)


def threshold_candidates(legs: Mapping[str, Legs], setting: FusionSetting, quantiles=(0.1, 0.25, 0.5)) -> list[float]:
    """min_relevance_score values worth trying: quantiles of the relevance scores at rank 10 across queries."""
    at10 = sorted(relevance_of(setting, [s for _, s in f])[9]
                  for f in (replay(q, setting) for q in legs.values()) if len(f) >= 10)
    if not at10:
        return []
    return sorted({round(at10[int(q * (len(at10) - 1))], 6) for q in quantiles})


@dataclass(frozen=True)
class Comparison:
    before: float
    after: float
    diff: float
    low: float
    high: float
    p_not_better: float  # share of resamples in which the tuned setting is not ahead
    queries: int


def paired_bootstrap(before: Mapping[str, float], after: Mapping[str, float], resamples: int = 10_000,
                     seed: int = 0, confidence: float = 0.95) -> Comparison:
    """Mean difference (after - before) over the same queries, with a percentile bootstrap interval:
    queries are drawn with replacement, and each draw keeps a query's two scores together."""
    qids = sorted(before)
    if set(qids) != set(after):
        raise ValueError("before and after must score the same queries")
    if not qids:
        raise ValueError("no queries to compare")
    diffs = [after[q] - before[q] for q in qids]
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    return Comparison(
        before=mean(before.values()), after=mean(after.values()), diff=mean(diffs),
        low=means[int(tail * (resamples - 1))], high=means[int((1 - tail) * (resamples - 1))],
        p_not_better=sum(m <= 0 for m in means) / resamples, queries=n,
    )


def fold_of(query_id: str, folds: int) -> int:
    """The query's fold of ``folds``, by a hash of its id: the ranker's cross-validation folds and the folds an
    encoder is cross-fitted on (``train_encoder --leave-out-fold``) are the same for the same count."""
    return int.from_bytes(hashlib.sha256(f"fold:{query_id}".encode()).digest()[:4], "big") % folds


def split_queries(qids: Iterable[str], held_out: float, seed: str = "raysearch") -> tuple[list[str], list[str]]:
    """(train, held-out), decided by a hash of each query id: stable across runs and machines, and a
    query never moves between the two when judgments are added."""
    train, test = [], []
    for q in sorted(qids):
        h = int.from_bytes(hashlib.sha256(f"{seed}:{q}".encode()).digest()[:8], "big") / 2**64
        (test if h < held_out else train).append(q)
    return train, test
