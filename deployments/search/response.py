"""The response: the page's rows fetched (those the shards did not send along), rendered (as models, or as JSON
from cached fragments when the router only sends it on), the context assembled with its citations, the answer
written, coverage, timings, the cursor of the next page and the debug trace."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from deployments.config import RouterSettings
from deployments.edge.schemas import (
    Answer,
    Coverage,
    GroupChunk,
    Highlight,
    Method,
    Result,
    ResultGroup,
    SearchRequest,
    SearchResponse,
    StageScores,
    response_dict,
)
from deployments.errors import Unavailable
from deployments.search.clients import SynthesizerClient
from deployments.search.context import assemble, citations
from deployments.search.grouping import Group
from deployments.search.highlights import Highlighter
from deployments.search.hits import Hit, keys_of, scores_by_key
from deployments.search.paging import make_cursor
from deployments.search.ranking import Ranked
from deployments.search.result_json import FragmentCache, PageScores, render_results, source_of
from deployments.search.retrieval import Retrieval, Retrieved, leg_scores
from deployments.search.stages import SearchContext, failure, within


class Responder:
    """Writes a search's response from what its stages found."""

    def __init__(self, retrieval: Retrieval, synthesizer: SynthesizerClient | None):
        self.retrieval, self.synthesizer = retrieval, synthesizer
        self.fragments = FragmentCache()  # results' JSON, for responses the router sends as they are
        self.highlighter = Highlighter()  # Lucene's analyzer, loaded at the first ``highlights: true``

    async def respond(self, ctx: SearchContext, got: Retrieved, ranked: Ranked) -> SearchResponse:
        """The page's rows fetched and rendered, the context assembled, the answer written: the response."""
        req, plan, targets, work, s = ctx.req, ctx.plan, ctx.targets, ctx.work, ctx.settings
        hybrid = req.method is Method.hybrid
        # Grouped, a page is a slice of the groups: each result is a group's best hit, its other kept hits ride along.
        groups = ranked.groups[plan.offset:plan.window] if ranked.groups is not None else None
        top = [g.hits[0] for g in groups] if groups is not None else ranked.final[plan.offset:plan.window]
        others = [h for g in groups for h in g.hits[1:]] if groups is not None else []
        t = time.perf_counter()
        try:
            rows = await within(self.retrieval.fetch(top + others, targets, got.known), s.shard_timeout_s)
        except Exception as exc:
            raise Unavailable(f"the shards did not send the results' texts: {failure(exc)}; retry shortly") from exc
        rows, other_rows = rows[:len(top)], dict(zip((h.key for h in others), rows[len(top):], strict=True))
        work.mark("fetch", t)
        shown = set(keys_of(top)) | set(keys_of(others))  # the scores below are read for these alone
        fused_scores = scores_by_key(got.fused, shown) if hybrid else {}
        dense_of, keyword_of = leg_scores(got.legs, shown)
        results_json = None
        scores = PageScores(dense_of, keyword_of, fused_scores, ranked.relevance_of, ranked.reranked)
        # Fragments are kept per chunk; a group or highlights are per request: those responses are written as models.
        if ctx.rendered and not req.synthesize and groups is None and not req.highlights:
            results = []
            results_json = render_results(self.fragments, ctx.versions, top, rows, scores, plan.offset + 1)
        else:
            results = result_models(top, rows, scores, plan.offset + 1)
            if groups is not None:
                results = [with_group(r, g, other_rows, ranked.relevance_of, req.group_by)
                           for r, g in zip(results, groups, strict=True)]
        if req.highlights and results:
            results = await self._highlighted(ctx, results)
        # The context holds each group's chunks together, at the group's rank.
        in_context = (list(zip(top, rows, strict=True)) if groups is None else
                      [(h, row if i == 0 else other_rows[h.key]) for g, row in zip(groups, rows, strict=True)
                       for i, h in enumerate(g.hits)])
        context_payload = citation_payload = None
        if req.include_context or req.include_citations:
            t = time.perf_counter()
            passages, info = assemble(  # a result's score is its hit's
                [r | {"score": h.score} for h, r in in_context],
                token_budget=req.token_budget or s.token_budget,
            )
            if req.include_context:
                context_payload = [p.__dict__ | {"chunk_ids": list(p.chunk_ids)} for p in passages]
                work.trace["context"] = info
            if req.include_citations:
                citation_payload = citations(passages)
            work.mark("assemble", t)
        answer = None
        if req.synthesize and not req.stream:
            t = time.perf_counter()
            answer = await self._answer(req, results, work.warnings, s.synthesis_timeout_s)
            work.mark("synthesize", t)
        timings = work.timings
        work.trace["shard_search_ms"] = work.shard_ms
        timings["total"] = (time.perf_counter() - ctx.started) * 1000
        ranks, window = ranked.total if groups is not None else len(ranked.final), plan.window
        # A one-leg search ranks exactly the page: a full page may have a next one (maybe empty).
        more = ranks > window or (ranks == window and not plan.reorders)
        response = SearchResponse(
            query=ctx.asked_query,
            corrected_query=ctx.corrected,
            method=req.method,
            method_used=Method.keyword if hybrid and not ctx.vectors else req.method,
            results=results,
            total=ranked.total,
            total_results=len(top),
            offset=plan.offset,
            next_cursor=make_cursor(req, ctx.ranked_by, window, s, ctx.writes, ctx.first_page_at)
            if more and req.mmr_lambda is None and window < plan.pages_end else None,
            citations=[source_of(r["doc_id"], r["metadata"]) for r in rows] if req.include_citations else None,
            passage_citations=citation_payload,
            synthesis=answer.text if answer else None,
            context=context_payload,
            index_version=ctx.versions,
            timings_ms={k: round(v, 3) for k, v in timings.items()},
            coverage=Coverage(shards_asked=got.asked, shards_answered=got.answered,
                              ratio=got.answered / got.asked if got.asked else 0.0,
                              degraded=bool(got.failed), failed=got.failed),
            reranked=ranked.reranked,
            relevance_scales=ranked.scales or {},
            ranking_model=ranked.model,
            answer=answer,
            warnings=work.warnings,
            debug=debug_trace(work.trace, got.legs, got.fused,
                              ranked.ranked if ranked.reranked or ranked.model else None,
                              ranked.dropped, ranked.final, got.depth, got.deepened, req) if req.debug else None,
        )
        response._results_json = results_json
        response._stages = (ctx.started, time.perf_counter(), work.spans)
        return response

    async def _highlighted(self, ctx: SearchContext, results: list[Result]) -> list[Result]:
        """``results`` with the spans of the searched query's terms in their texts and their group chunks' (off the
        event loop: the analyzer is called once per word not seen before); on failure, without, and a warning."""
        t = time.perf_counter()
        chunks = [r.group.chunks if r.group is not None else [] for r in results]
        texts = [r.content for r in results] + [c.content for group in chunks for c in group]
        try:
            marked = await asyncio.to_thread(self.highlighter.spans, ctx.text, texts)
        except Exception as exc:  # the results stand without their spans
            ctx.work.warnings.append(f"highlights {failure(exc)}: results without them")
            return results
        as_spans = [[Highlight(start=a, end=b) for a, b in spans] for spans in marked]
        out = [r.model_copy(update={"highlights": spans})
               for r, spans in zip(results, as_spans[:len(results)], strict=True)]
        rest = iter(as_spans[len(results):])
        for r, group in zip(out, chunks, strict=True):
            if group:
                marked_chunks = [c.model_copy(update={"highlights": next(rest)}) for c in group]
                r.group = r.group.model_copy(update={"chunks": marked_chunks})
        ctx.work.mark("highlight", t)
        return out

    async def _answer(self, req: SearchRequest, results: list[Result], warnings: list[str],
                      timeout_s: float) -> Answer | None:
        try:
            answer = await asyncio.wait_for(
                self.synthesizer.answer(req.query, [r.model_dump() for r in results], req.max_answer_tokens),
                timeout_s)
            return Answer.model_validate(answer)
        except Exception as exc:
            warnings.append(f"synthesis {failure(exc)}: no answer, results only")
            return None

    async def stream_answer(self, req: SearchRequest, response: SearchResponse,
                            settings: RouterSettings) -> AsyncIterator[dict]:
        """Events for ``stream: true``, after ``search`` answered (so a bad request is still a plain 4xx):
        the search response, the answer's tokens, then the answer. A synthesis failure is an ``error``
        event, since the status line has been sent by then."""
        yield {"type": "results", **response_dict(response)}
        deadline = time.monotonic() + settings.synthesis_timeout_s
        try:
            events = aiter(self.synthesizer.stream(req.query, [r.model_dump() for r in response.results],
                                                   req.max_answer_tokens))
            while True:  # each event (the first token too) waits only until the deadline
                try:
                    event = await asyncio.wait_for(anext(events), max(0.0, deadline - time.monotonic()))
                except StopAsyncIteration:
                    break
                yield event
        except Exception as exc:
            yield {"type": "error", "error": f"synthesis {failure(exc)}: no answer, results only"}


def result_models(top: list[Hit], rows: list[dict], scores: PageScores, first_rank: int = 1) -> list[Result]:
    """The page's results as models (what synthesis reads, and callers that are not sent JSON)."""
    dense_of, keyword_of, fused_scores, relevance_of = scores.dense, scores.keyword, scores.fused, scores.relevance
    reranked = scores.reranked
    results = []
    for rank, (hit, row) in enumerate(zip(top, rows, strict=True), start=first_rank):
        cid, metadata = hit.key, row["metadata"]
        results.append(Result(
            rank=rank, chunk_id=row["chunk_id"], doc_id=row["doc_id"], collection=row["collection"],
            content=row["text"], source=source_of(row["doc_id"], metadata), title=row["title"],
            section=row["section"], metadata=metadata, relevance_score=relevance_of[cid], score=hit.score,
            scores=StageScores(dense=dense_of.get(cid), keyword=keyword_of.get(cid), fused=fused_scores.get(cid),
                               reranked=hit.score if reranked else None),
            char_start=row["char_start"], char_end=row["char_end"],
        ))
    return results


def with_group(result: Result, group: Group, rows: dict[tuple[str, str], dict],
               relevance_of: dict[tuple[str, str], float], group_by: str) -> Result:
    """``result`` (its group's best hit) with its group: the key, how many candidates fell in it, and the other
    kept chunks (``rows`` by hit key)."""
    key = result.doc_id if group_by == "doc_id" else result.metadata.get(group_by)
    chunks = [GroupChunk(chunk_id=h.chunk_id, content=rows[h.key]["text"], relevance_score=relevance_of[h.key],
                         score=h.score, char_start=rows[h.key]["char_start"], char_end=rows[h.key]["char_end"])
              for h in group.hits[1:]]
    return result.model_copy(update={"group": ResultGroup(key=key, found=group.found, chunks=chunks)})


def debug_trace(trace, legs, fused, reranked, dropped, final, depth, deepened, req) -> dict:
    def show(hits, n=50):
        return [{"chunk_id": h.chunk_id, "score": h.score} for h in hits[:n]]

    return trace | {
        "candidate_depth": depth,
        "deepened_because_flat": deepened,
        # Each leg in full, so fusion settings can be replayed offline (relevance.tune).
        "legs": {name: {"dense": show(d, None), "keyword": show(k, None)} for name, (d, k) in legs.items()},
        "fused": show(fused),
        "reranked": show(reranked) if reranked is not None else None,  # by the cross-encoder, or the ranking model
        "dropped_below_min_relevance_score": show(dropped),
        "after_mmr": show(final) if req.mmr_lambda is not None else None,
        "query_tokens": len(trace.get("effective_query", "").split()),
    }
