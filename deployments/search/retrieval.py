"""Retrieval: the fan-out to every shard of the searched collections (both legs, filters and ACLs inside the
shard, each under its deadline), the merge of each collection's legs, coverage, and the rows and vectors of the
few candidates that survive. Shards answer with ids and scores; texts and vectors are fetched afterwards."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from deployments.edge.schemas import AnnParams
from deployments.errors import InvalidField
from deployments.search.clients import Collection
from deployments.search.field_weights import request_weights
from deployments.search.hits import Hit, hits_of, merge_top_k, scores_by_key
from deployments.search.stages import SearchContext, Span, gathered, within
from deployments.shard.query import MAX_QUERY_CLAUSES, ShardAnswer, ShardQuery
from deployments.shard.shares import Share, share_depth, short_shares
from index_format.chunk_ids import doc_of


@dataclass
class Retrieved:
    legs: dict[str, tuple[list[Hit], list[Hit]]]  # per collection: its merged dense and keyword legs
    fused: list[Hit]
    known: dict[tuple[str, str], dict]  # rows that came with the answers (shard deployments send the best), by key
    failed: list[str]
    asked: int
    answered: int
    depth: int  # the depth searched (the plan's, or twice it when deepened)
    deepened: bool


def without_documents(answer: ShardAnswer, masked: frozenset[str], seen: set[str]) -> ShardAnswer:
    """A version shard's answer without the chunks of documents the fresh segment holds (replaced or deleted);
    the documents it dropped are added to ``seen``."""
    dense = [(c, s) for c, s in answer.dense if doc_of(c) not in masked]
    keyword = [(c, s) for c, s in answer.keyword if doc_of(c) not in masked]
    if len(dense) == len(answer.dense) and len(keyword) == len(answer.keyword):
        return answer
    seen.update(doc_of(c) for c, _ in (*answer.dense, *answer.keyword) if doc_of(c) in masked)
    return replace(answer, dense=dense, keyword=keyword, rows=[r for r in answer.rows if r["doc_id"] not in masked])


def known_rows(per_collection: dict[str, list[tuple[int, ShardAnswer]]]) -> dict[tuple[str, str], dict]:
    """The rows the shards sent along with their answers, by hit key, each naming its collection."""
    return {(row["chunk_id"], name): row | {"collection": name}
            for name, answers in per_collection.items() for _, a in answers for row in a.rows}


def leg_scores(legs: dict[str, tuple[list[Hit], list[Hit]]], wanted: set[tuple[str, str]] | None = None
               ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Each candidate's dense and keyword scores, by hit key (chunk id and collection); with ``wanted``, only
    those candidates' (``scores_by_key``)."""
    dense_of: dict[tuple[str, str], float] = {}
    keyword_of: dict[tuple[str, str], float] = {}
    for dense, keyword in legs.values():
        dense_of.update(scores_by_key(dense, wanted))
        keyword_of.update(scores_by_key(keyword, wanted))
    return dense_of, keyword_of



def _hits(pairs: list[tuple[str, float]], shard: int, collection: str) -> list[Hit]:
    """A shard's (chunk id, score) pairs as hits."""
    ids, scores = zip(*pairs, strict=True) if pairs else ((), ())
    return hits_of(ids, scores, shard, collection)


@dataclass(eq=False)
class _Call:
    """One shard slot's part of a search: what it is asked (each leg's depth) and the depth in full."""

    collection: Collection
    index: int  # the slot's position among the collection's clients (a hit's ``shard``)
    shard: Any
    query: ShardQuery  # the request's search, with this slot's vector, options and rows
    full: tuple[int, int]  # (dense, keyword): what asking it for all of each leg means
    depth: tuple[int, int]  # what it is asked first (its share, or all)
    raw: ShardAnswer | None = None  # its answer, before the fresh segment's documents are dropped from it

    def ask(self, depths: tuple[int, int]):
        return self.shard.search(self.query.at_depth(*depths))


class Retrieval:
    """The shards' side of a search, under its settings (``shard_timeout_s``)."""

    def __init__(self):
        # Slots asked again for a leg's whole k (``_complete``) since started: how often a share was not enough.
        self.asked_again = {"dense": 0, "keyword": 0}

    async def fan_out(self, ctx: SearchContext, k_dense: int, k_keyword: int
                      ) -> tuple[dict[str, list[tuple[int, ShardAnswer]]], list[str], int, int]:
        """Every shard of every target asked at once under ``shard_timeout_s`` for each leg's top ``k_dense`` and
        ``k_keyword`` (0: the leg is not searched): the answers per collection (with the shard's index), the
        shards that failed, and coverage (shards asked, shards that answered).

        Where a collection's version is served by several shard slots (shard deployments, or groups on several
        nodes), each is asked for its likely share of each leg's top k (``shares.share_depth``, as a group asks
        its shards), and asked again for all of it where its share may have been short (``_complete``): the
        merged legs are those of every slot asked for k."""
        req, timeout_s, work = ctx.req, ctx.settings.shard_timeout_s, ctx.work
        t = time.perf_counter()
        base = ShardQuery(text=ctx.text, filters=req.filters, acl=ctx.acl, encoder=req.encoder)
        calls = []
        for c in ctx.targets:
            vector = ctx.vectors.get(c.name) if k_dense else None
            weights = (request_weights(req.field_weights, c.field_weights, c.bm25_fields, c.name, c.version)
                       if k_keyword else None)
            options = (req.ann or AnnParams()).merged_over(c.ann) or None if k_dense else None
            # Documents the fresh segment replaced or deleted are dropped from the version's answers: ask for as
            # many more as the version was seen to hold (at most twice the depth), so the depth stays. (A new
            # document is masked too, but the version never answers for it: asking more for it would cost every
            # search a deeper one.)
            extra = min(len(c.fresh.in_version), max(k_dense, k_keyword)) if c.fresh is not None else 0
            total = sum(getattr(shard, "size", 1) for shard in c.shards)
            for i, shard in enumerate(c.clients()):
                version = i < len(c.shards)
                full = ((k_dense and k_dense + extra, k_keyword and k_keyword + extra) if version
                        else (k_dense, k_keyword))
                depth = (tuple(share_depth(k, getattr(shard, "size", 1) / total) for k in full)
                         if version and len(c.shards) > 1 else full)
                query = replace(base, vector=vector, ann=options, field_weights=weights,
                                rows_for_top=ctx.plan.rows_for_top if shard.remote else 0)
                calls.append(_Call(c, i, shard, query, full, depth))
        answers = await gathered([within(call.ask(call.depth), timeout_s) for call in calls], return_exceptions=True)
        work.mark("retrieve", t)
        per_collection: dict[str, list[tuple[int, ShardAnswer]]] = {c.name: [] for c in ctx.targets}
        failed = []
        # A client may be a group of shards: coverage counts shards, not calls.
        asked = sum(getattr(call.shard, "size", 1) for call in calls)
        answered = asked
        for call, answer in zip(calls, answers, strict=True):
            c, shard = call.collection, call.shard
            if isinstance(answer, BaseException):
                reason = "timeout" if isinstance(answer, asyncio.TimeoutError | TimeoutError) else type(answer).__name__
                failed.append(f"{c.name}/{shard.name}: {reason}")
                answered -= getattr(shard, "size", 1)
                continue
            if answer.filter_error:
                raise InvalidField(answer.filter_error)
            if answer.terms is not None and not any(w.startswith("keyword leg: ") for w in work.warnings):
                kept, distinct = answer.terms
                work.warnings.append(f"keyword leg: the query's {kept:,} rarest distinct terms searched, {distinct - kept:,}"
                                     f" of its {distinct:,} left out (Lucene's limit of {MAX_QUERY_CLAUSES:,} clauses)")
            call.raw = answer
            per_collection[c.name].append((call.index, self._masked(call, answer)))
            work.spans.append(Span(f"shards {c.name}/{shard.name}", t, t + answer.took_ms / 1000, "retrieve"))
            for name, ms in (answer.shard_ms or {answer.shard: answer.took_ms}).items():
                work.shard_ms[f"{c.name}/{name}"] = round(ms, 3)
        await self._complete(ctx, [call for call in calls if call.raw is not None], per_collection, (k_dense, k_keyword))
        return per_collection, failed, asked, answered

    @staticmethod
    def _masked(call: _Call, answer: ShardAnswer) -> ShardAnswer:
        c = call.collection
        if call.index < len(c.shards) and c.fresh is not None and c.fresh.masked:
            return without_documents(answer, c.fresh.masked, c.fresh.in_version)
        return answer

    async def _complete(self, ctx: SearchContext, calls: list[_Call],
                        per_collection: dict[str, list[tuple[int, ShardAnswer]]], ks: tuple[int, int]) -> None:
        """Asks again, for all of a leg, each slot whose share of it may have been short (``shares.short_shares``
        over every candidate of its collection). Replaces those legs of those answers in ``per_collection``; a slot
        that fails the second time keeps its first answer (the top of its share)."""
        again: dict[int, list[int]] = {}  # position in calls -> the depth to ask of each leg again (0: not asked)
        for name, answers in per_collection.items():
            parts = [(n, call) for n, call in enumerate(calls) if call.collection.name == name and call.depth != call.full]
            for leg, k in enumerate(ks):
                if not k or not parts:
                    continue
                pool = [score for _, a in answers for _, score in (a.dense, a.keyword)[leg]]
                shares = [Share([score for _, score in (call.raw.dense, call.raw.keyword)[leg]], call.depth[leg],
                                call.full[leg]) for _, call in parts]
                for i in short_shares(shares, k, pool):
                    n, call = parts[i]
                    again.setdefault(n, [0, 0])[leg] = call.full[leg]
        if not again:
            return
        t = time.perf_counter()
        asks = [(calls[n], tuple(depths)) for n, depths in again.items()]
        answers = await gathered([within(call.ask(depths), ctx.settings.shard_timeout_s) for call, depths in asks],
                                 return_exceptions=True)
        ctx.work.mark("retrieve again", t)
        for (call, depths), answer in zip(asks, answers, strict=True):
            if isinstance(answer, BaseException) or answer.filter_error:
                continue
            deeper = self._masked(call, answer)
            entries = per_collection[call.collection.name]
            at = next(j for j, (i, _) in enumerate(entries) if i == call.index)
            first = entries[at][1]
            entries[at] = (call.index, replace(first, dense=deeper.dense if depths[0] else first.dense,
                                               keyword=deeper.keyword if depths[1] else first.keyword,
                                               rows=first.rows + deeper.rows))
            for leg, depth in zip(("dense", "keyword"), depths, strict=True):
                self.asked_again[leg] += bool(depth)

    @staticmethod
    def legs(collection: str, answers: list[tuple[int, ShardAnswer]], depth: int) -> tuple[list[Hit], list[Hit]]:
        """A collection's dense and keyword legs: each shard's answer as hits of this collection, merged to ``depth``."""
        if len(answers) == 1:  # one shard group: its legs are already merged, ranked (hits.best) and cut
            ((i, a),) = answers
            return _hits(a.dense[:depth], i, collection), _hits(a.keyword[:depth], i, collection)
        dense = merge_top_k((_hits(a.dense, i, collection) for i, a in answers), depth)
        keyword = merge_top_k((_hits(a.keyword, i, collection) for i, a in answers), depth)
        return dense, keyword

    async def vectors(self, hits: list[Hit], targets: list[Collection]) -> np.ndarray:
        """The hits' vectors (for MMR), in their order: one call per shard holding some of them."""
        by_name = {c.name: c for c in targets}
        groups: dict[tuple[str, int], list[int]] = {}
        for i, h in enumerate(hits):
            groups.setdefault((h.collection, h.shard), []).append(i)
        out: list[np.ndarray | None] = [None] * len(hits)
        calls = [by_name[name].slot(shard).vectors([hits[i].chunk_id for i in idx])
                 for (name, shard), idx in groups.items()]
        for idx, vecs in zip(groups.values(), await asyncio.gather(*calls), strict=True):
            for i, v in zip(idx, vecs, strict=True):
                out[i] = v
        return np.stack(out)

    async def fetch(self, hits: list[Hit], targets: list[Collection], known: dict[tuple[str, str], dict]) -> list[dict]:
        """Rows of the final hits: those the shards sent along, the rest fetched (one call per shard)."""
        by_name = {c.name: c for c in targets}
        groups: dict[tuple[str, int], list[str]] = {}
        for h in hits:
            if h.key not in known:
                groups.setdefault((h.collection, h.shard), []).append(h.chunk_id)
        calls = [by_name[name].slot(shard).fetch(ids) for (name, shard), ids in groups.items()]
        rows: dict[tuple[str, str], dict] = dict(known)
        for (name, _), fetched in zip(groups, await gathered(calls), strict=True):
            for row in fetched:
                rows[(row["chunk_id"], name)] = row | {"collection": name}
        return [rows[h.key] for h in hits]
