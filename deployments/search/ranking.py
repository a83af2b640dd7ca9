"""Ranking: the legs fused (RRF or weighted, as the request or the settings say), reranked by the cross-encoder
or the LLM, cut at ``min_relevance_score`` (on the one [0, 1] scale, ``relevance_scale``), near-duplicates dropped
(``dedupe_threshold``), diversified by MMR, grouped (``group_by``: ``search.grouping``); each optional stage, when it
fails, leaves the order before it with a warning (grouping is not optional: the response's shape depends on it).
Over one hit type (``Hit``)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from deployments.edge.schemas import Fusion, Method, RelevanceScale, RerankWith, SearchRequest
from deployments.errors import Unavailable
from deployments.search.calibration import Calibration, absolute_scores, leg_scores
from deployments.search.clients import Collection, RerankerClient, SynthesizerClient
from deployments.search.fusion import min_max, relevance_scores, rrf, weighted
from deployments.search.grouping import Group, group_hits, without_near_duplicates
from deployments.search.hits import Hit, keys_of, scores_by_key
from deployments.search.learned import candidate_features, reordered
from deployments.search.mmr import mmr
from deployments.search.reranking import passage_text
from deployments.search.retrieval import Retrieval, Retrieved
from deployments.search.stages import SearchContext, failure, within
from index_format.chunk_ids import doc_of


@dataclass
class Ranked:
    ranked: list[Hit]  # fused, or reranked
    reranked: bool
    relevance_of: dict[tuple[str, str], float]  # by hit key
    kept: list[Hit]  # at or above min_relevance_score, without near-duplicates (``dedupe_threshold``)
    dropped: list[Hit]
    final: list[Hit]  # after MMR
    model: str | None = None  # the ranking model that ordered ``ranked`` (then ``reranked`` is False)
    groups: list[Group] | None = None  # ``final`` grouped (``group_by``): what pages count
    scales: dict[str, str] | None = None  # per collection, the scale of its relevance scores

    @property
    def total(self) -> int:
        """What a response's ``total`` counts: groups when grouped, else the candidates kept."""
        return len(self.groups) if self.groups is not None else len(self.kept)


def fusion_of(req: SearchRequest, s) -> dict[str, Any]:
    """The fusion a hybrid request gets: its own fields where given, the service's settings otherwise."""
    if (req.fusion or Fusion(s.fusion)) is Fusion.rrf:
        return {"method": "rrf", "rrf_k": req.rrf_k or s.rrf_k}
    w = req.weights
    return {"method": "weighted", "weights": {"dense": w.dense if w else s.dense_weight,
                                              "keyword": w.keyword if w else s.keyword_weight}}


def fuse(req: SearchRequest, settings, dense: list[Hit], keyword: list[Hit]) -> list[Hit]:
    """A collection's two legs as the request's method ranks them: one leg alone, or fused."""
    if req.method is Method.vector:
        return dense
    if req.method is Method.keyword:
        return keyword
    fusion = fusion_of(req, settings)
    if fusion["method"] == "rrf":
        return rrf([dense, keyword], rrf_k=fusion["rrf_k"])
    return weighted([dense, keyword], [fusion["weights"]["dense"], fusion["weights"]["keyword"]])


def relevance_scale(req: SearchRequest, settings, reranked: bool, collections: int,
                    learned: bool = False) -> tuple[str, float]:
    """How the final ranking's scores become ``relevance_score`` on the ``minmax`` scale (``fusion.relevance_scores``):
    the reranker's probability as it is; a weighted fusion of one collection over its weights' sum (its most);
    everything else (RRF, one leg, collections fused by RRF) min-max over the ranking."""
    if learned:
        return "minmax", 1.0
    if reranked:
        return "probability", 1.0
    if req.method is Method.hybrid and collections == 1:
        fusion = fusion_of(req, settings)
        if fusion["method"] == "weighted":
            return "weighted", fusion["weights"]["dense"] + fusion["weights"]["keyword"]
    return "minmax", 1.0


class Ranking:
    """The ranking stages after fusion, with the clients they call (``reranker``, the ``synthesizer``'s LLM)."""

    def __init__(self, retrieval: Retrieval, reranker: RerankerClient | None, synthesizer: SynthesizerClient | None,
                 calibrations: dict[str, Calibration] | None = None):
        self.retrieval, self.reranker, self.synthesizer = retrieval, reranker, synthesizer
        # Each collection's calibration of relevance_score (``search.calibration``), by name: the pipeline's own
        # dict, kept up to date by whoever holds it.
        self.calibrations = calibrations if calibrations is not None else {}

    async def rerank(self, req: SearchRequest, text: str, pool: list[Hit], rows: list[dict]) -> list[Hit]:
        passages = [passage_text(r["title"], r["text"]) for r in rows]
        if req.rerank_with is RerankWith.llm:
            scores = await self.synthesizer.relevance(text, passages)
        else:
            scores = await self.reranker.score(text, passages)
        if len(scores) != len(pool):
            raise ValueError(f"the reranker returned {len(scores)} scores for {len(pool)} passages")
        # Ties keep the fused order (sorted is stable).
        return sorted((Hit(h.chunk_id, float(sc), h.shard, h.collection) for h, sc in zip(pool, scores, strict=True)),
                      key=lambda h: -h.score)

    async def rank(self, ctx: SearchContext, got: Retrieved) -> Ranked:
        """Reranked (the pool's texts fetched and scored under one deadline), cut at min_relevance_score,
        diversified by MMR: each optional, each failure leaving the order before it, with a warning."""
        req, targets, work, s, fused = ctx.req, ctx.targets, ctx.work, ctx.settings, got.fused
        ranked, reranked = fused, False
        if ctx.rerank and fused:
            t = time.perf_counter()
            pool = fused[:ctx.plan.rerank_depth]

            async def fetch_and_rerank() -> list[Hit]:  # one deadline for the pool's texts and their scores
                pool_rows = await self.retrieval.fetch(pool, targets, got.known)
                got.known.update((h.key, row) for h, row in zip(pool, pool_rows, strict=True))
                return await self.rerank(req, ctx.text, pool, pool_rows)

            try:
                ranked = await asyncio.wait_for(fetch_and_rerank(), s.rerank_timeout_s)
                reranked = True
            except Exception as exc:  # the fused order stands; the request still succeeds
                work.warnings.append(f"reranking {failure(exc)}: results are in fused order")
            work.mark("rerank", t)
            work.trace["rerank"] = {"depth": len(pool), "with": req.rerank_with.value, "applied": reranked}
        learned = None
        if ctx.model is not None and fused:
            ranked, learned = await self.learned(ctx, got, ranked if reranked else None)
            reranked = reranked and learned is None
        cut = req.min_relevance_score
        # Without a cut, near-duplicates, MMR or groups the page is a slice of ``ranked`` ending at the window: only
        # those hits show a relevance score (each one's own, whatever the others: min-max is over the whole ranking).
        page_only = (cut is None and req.dedupe_threshold is None and req.mmr_lambda is None and req.group_by is None)
        relevance_of, scales = self.relevance(ctx, got, ranked, reranked, learned is not None,
                                              ctx.plan.window if page_only else None)
        kept = ranked if cut is None else [h for h in ranked if relevance_of[h.key] >= cut]
        dropped = [] if cut is None else [h for h in ranked if relevance_of[h.key] < cut]
        if req.dedupe_threshold is not None and kept:
            t = time.perf_counter()
            vectors = await self.vectors(ctx, kept, "near-duplicates kept")
            if vectors is not None:
                kept = without_near_duplicates(kept, vectors, req.dedupe_threshold)
            work.mark("dedupe", t)
        final = kept
        if req.mmr_lambda is not None and kept:
            t = time.perf_counter()
            pool = kept[: req.limit * s.mmr_pool_factor]
            pool_vectors = await self.vectors(ctx, pool, "MMR skipped")  # the relevance order stands without them
            if pool_vectors is not None:
                query_vector = next(iter(ctx.vectors.values()))
                relevance = [h.score for h in min_max(pool)]
                final = mmr(pool, query_vector, pool_vectors, req.limit, req.mmr_lambda, relevance)
            work.mark("mmr", t)
        groups = await self.group(ctx, got, final) if req.group_by is not None else None
        return Ranked(ranked, reranked, relevance_of, kept, dropped, final, learned, groups, scales)

    def relevance(self, ctx: SearchContext, got: Retrieved, ranked: list[Hit], reranked: bool, learned: bool,
                  upto: int | None = None) -> tuple[dict[tuple[str, str], float], dict[str, str]]:
        """The ``relevance_score`` by key of ``ranked``'s first ``upto`` hits (None: all), each as it is among the
        whole ranking, and the scale each collection's hits are on (``search.calibration``)."""
        req, names = ctx.req, [c.name for c in ctx.targets]
        scores = [h.score for h in ranked]  # all of them: min-max is over the whole ranking
        shown = ranked if upto is None else ranked[:upto]
        if req.relevance_scale is RelevanceScale.minmax or reranked:
            scale = ("probability", 1.0) if reranked else relevance_scale(req, ctx.settings, reranked, len(names),
                                                                            learned)
            return (dict(zip(keys_of(shown), relevance_scores(scores, *scale), strict=False)),
                    dict.fromkeys(names, scale[0]))
        values: dict[tuple[str, str], float | None] = {}
        scales = {}
        for name in names:
            hits = shown if len(names) == 1 else [h for h in shown if h.collection == name]
            scales[name], own = absolute_scores(req.method.value, leg_scores([h.chunk_id for h in hits],
                                                                             *got.legs[name]),
                                                self.calibrations.get(name), len(hits))
            values.update(zip(keys_of(hits), own, strict=True))
        if any(v is None for v in values.values()):  # a scale with no absolute score: min-max over the ranking
            relative = dict(zip(keys_of(shown), relevance_scores(scores, "minmax"), strict=False))
            values = {k: relative[k] if v is None else v for k, v in values.items()}
        return values, scales

    async def vectors(self, ctx: SearchContext, pool: list[Hit], skipped: str):
        """The pool's vectors from their shards (MMR and dedupe: one rule, one deadline, ``shard_timeout_s``), or
        None with the warning ``skipped: ...`` when they did not come."""
        try:
            return await asyncio.wait_for(self.retrieval.vectors(pool, ctx.targets), ctx.settings.shard_timeout_s)
        except Exception as exc:
            ctx.work.warnings.append(f"{skipped}: the candidates' vectors {failure(exc)}")
            return None

    async def group(self, ctx: SearchContext, got: Retrieved, final: list[Hit]) -> list[Group]:
        """``final`` grouped by ``group_by``: by document (a chunk id names its document; a document is one
        collection's), or by a metadata field's value across collections (the rows fetched for the whole window,
        once). Not optional, unlike the stages above: the response's shape depends on it, so a failure is a 503."""
        req, t = ctx.req, time.perf_counter()
        if req.group_by == "doc_id":
            keys = [(h.collection, doc_of(h.chunk_id)) for h in final]
        else:
            try:
                rows = await within(self.retrieval.fetch(final, ctx.targets, got.known), ctx.settings.shard_timeout_s)
            except Exception as exc:
                raise Unavailable(f"the shards did not send the candidates' {req.group_by!r} to group by: "
                                  f"{failure(exc)}; retry shortly") from exc
            got.known.update((h.key, row) for h, row in zip(final, rows, strict=True))
            field = req.group_by
            keys = [json.dumps(r["metadata"][field], sort_keys=True) if r["metadata"].get(field) is not None else None
                    for r in rows]
        groups = group_hits(final, keys, req.group_size)
        ctx.work.mark("group", t)
        return groups

    async def learned(self, ctx: SearchContext, got: Retrieved, reranked: list[Hit] | None) -> tuple[list[Hit], str | None]:
        """The best ``ranking_depth`` fused candidates in the order of the collection's ranking model, the cross-encoder's
        scores (``reranked``) among its features, and the model's id; when the stage fails, the order before it
        and None, with a warning."""
        model, work, t = ctx.model, ctx.work, time.perf_counter()
        pool = got.fused[:ctx.settings.ranking_depth]
        before = reranked if reranked is not None else got.fused
        try:
            table = await candidate_features(ctx, got, pool, scores_by_key(reranked or ()),
                                             model.features)
            ranked, applied = reordered(pool, model.score(table)), model.id
        except Exception as exc:  # the order before stands; the request still succeeds
            work.warnings.append(f"ranking model {model.id} {failure(exc)}: results are in "
                                 f"{'reranked' if reranked is not None else 'fused'} order")
            ranked, applied = before, None
        work.mark("rank", t)
        work.trace["ranking_model"] = {"model": model.id, "depth": len(pool), "applied": applied is not None}
        return ranked, applied


def fuse_collections(req: SearchRequest, settings, legs: dict[str, tuple[list[Hit], list[Hit]]],
                     targets: list[Collection]) -> list[Hit]:
    """Each collection's legs fused, then the collections by RRF (scores of two collections are not comparable)."""
    fused_per = [fuse(req, settings, *legs[c.name]) for c in targets]
    return fused_per[0] if len(fused_per) == 1 else rrf(fused_per, rrf_k=req.rrf_k or settings.rrf_k)
