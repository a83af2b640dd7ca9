"""Retrieval: the fan-out to every shard of the searched collections (both legs, filters and ACLs inside the
shard, each under its deadline), the merge of each collection's legs, coverage, and the rows and vectors of the
few candidates that survive. Shards answer with ids and scores; texts and vectors are fetched afterwards."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

import numpy as np

from deployments.edge.schemas import AnnParams
from deployments.errors import InvalidField
from deployments.search.clients import Collection
from deployments.search.hits import Hit, merge_top_k
from deployments.search.stages import gathered, mark, within
from deployments.shard.service import ShardAnswer


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


def doc_of(chunk_id: str) -> str:
    """A chunk id's document id (chunk ids are ``<doc id>#<chunk index>``: ``index_format.chunking``)."""
    return chunk_id.rsplit("#", 1)[0]


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


def leg_scores(legs: dict[str, tuple[list[Hit], list[Hit]]]) -> tuple[dict[tuple[str, str], float],
                                                                      dict[tuple[str, str], float]]:
    """Each candidate's dense and keyword scores, by hit key (chunk id and collection)."""
    dense_of: dict[tuple[str, str], float] = {}
    keyword_of: dict[tuple[str, str], float] = {}
    for dense, keyword in legs.values():
        dense_of.update({h.key: h.score for h in dense})
        keyword_of.update({h.key: h.score for h in keyword})
    return dense_of, keyword_of



class Retrieval:
    """The shards' side of a search, under the router's settings (``shard_timeout_s``)."""

    def __init__(self, settings):
        self.settings = settings

    async def fan_out(self, targets: list[Collection], vectors: dict[str, np.ndarray], text: str, k_dense: int,
                      k_keyword: int, filters, timings: dict, rows_for_top: int, acl=None,
                      ann: AnnParams | None = None) -> tuple[dict[str, list[tuple[int, ShardAnswer]]], list[str], int, int]:
        """Every shard of every target asked at once under ``shard_timeout_s``: the answers per collection (with
        the shard's index), the shards that failed, and coverage (shards asked, shards that answered)."""
        t = time.perf_counter()
        calls = []
        for c in targets:
            vector = vectors.get(c.name)
            options = (ann or AnnParams()).merged_over(c.ann) or None if k_dense else None
            # Documents the fresh segment replaced or deleted are dropped from the version's answers: ask for as
            # many more as the version was seen to hold (at most twice the depth), so the depth stays. (A new
            # document is masked too, but the version never answers for it: asking more for it would cost every
            # search a deeper one.)
            extra = min(len(c.fresh.in_version), max(k_dense, k_keyword)) if c.fresh is not None else 0
            for i, shard in enumerate(c.clients()):
                rows = rows_for_top if shard.remote else 0
                more = extra if i < len(c.shards) else 0
                calls.append((c, i, shard, within(
                    shard.search(vector, text, k_dense and k_dense + more, k_keyword and k_keyword + more, filters,
                                 rows, acl, options),
                    self.settings.shard_timeout_s)))
        answers = await gathered([call for *_, call in calls], return_exceptions=True)
        mark(timings, "retrieve", t)
        per_collection: dict[str, list[tuple[int, ShardAnswer]]] = {c.name: [] for c in targets}
        shard_ms = timings.setdefault("_shards", {})
        failed = []
        # A client may be a group of shards: coverage counts shards, not calls.
        asked = sum(getattr(shard, "size", 1) for _, _, shard, _ in calls)
        answered = asked
        for (c, i, shard, _), answer in zip(calls, answers, strict=True):
            if isinstance(answer, BaseException):
                reason = "timeout" if isinstance(answer, asyncio.TimeoutError | TimeoutError) else type(answer).__name__
                failed.append(f"{c.name}/{shard.name}: {reason}")
                answered -= getattr(shard, "size", 1)
                continue
            if answer.filter_error:
                raise InvalidField(answer.filter_error)
            if i < len(c.shards) and c.fresh is not None and c.fresh.masked:
                answer = without_documents(answer, c.fresh.masked, c.fresh.in_version)
            per_collection[c.name].append((i, answer))
            timings["_stages"].append((f"shards {c.name}/{shard.name}", t, t + answer.took_ms / 1000, "retrieve"))
            for name, ms in (answer.shard_ms or {answer.shard: answer.took_ms}).items():
                shard_ms[f"{c.name}/{name}"] = round(ms, 3)
        return per_collection, failed, asked, answered

    @staticmethod
    def legs(collection: str, answers: list[tuple[int, ShardAnswer]], depth: int) -> tuple[list[Hit], list[Hit]]:
        """A collection's dense and keyword legs: each shard's answer as hits of this collection, merged to ``depth``."""
        if len(answers) == 1:  # one shard group: its legs are already merged, ranked (rank_key) and cut
            ((i, a),) = answers
            return ([Hit(cid, s, i, collection) for cid, s in a.dense[:depth]],
                    [Hit(cid, s, i, collection) for cid, s in a.keyword[:depth]])
        dense = merge_top_k(([Hit(cid, s, i, collection) for cid, s in a.dense] for i, a in answers), depth)
        keyword = merge_top_k(([Hit(cid, s, i, collection) for cid, s in a.keyword] for i, a in answers), depth)
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
