"""The request path, Ray-free: query -> fan-out -> fusion -> rerank -> threshold -> MMR -> fetch ->
context -> answer.

The router deployment runs this with Serve handles as its shard and encoder clients; tests run it with
in-process clients over the same shard services. Shards answer with ids and scores only; texts and
vectors are fetched for the few candidates that survive fusion.

Scores in a response: ``scores.dense`` is cosine similarity, ``scores.keyword`` corpus-exact BM25,
``scores.fused`` the RRF or weighted score; ``score`` is the score of the method used: dense for
``vector``, BM25 for ``keyword``, fused for ``hybrid``, and the reranker's (in [0, 1]) whenever the results
were reranked (``reranked: true``). ``relevance_score`` (the seed's field, and the one
``min_relevance_score`` applies to) is that score on [0, 1] for every method: the reranker's probability,
a weighted fusion over its weights' sum, anything else min-max over the ranking (``_relevance_scale``).

Reranking and synthesis are optional stages behind clients: when one fails or is too slow the request
still succeeds, with the earlier stage's output and a line in ``warnings``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from deployments.edge.schemas import (
    AnnParams,
    Answer,
    Coverage,
    Fusion,
    Method,
    RerankWith,
    Result,
    SearchRequest,
    SearchResponse,
    StageScores,
    response_dict,
)
from deployments.errors import (
    DeadlineExceeded,
    InvalidField,
    InvalidRequest,
    NotFound,
    ServiceError,
    Unavailable,
)
from deployments.search.context import assemble, citations
from deployments.search.fusion import is_flat, min_max, relevance_scores, rrf, weighted
from deployments.search.hits import Hit, merge_top_k
from deployments.search.mmr import mmr
from deployments.search.paging import make_cursor, page_offset
from deployments.search.plan import SearchPlan, plan_search
from deployments.search.query_text import expand_synonyms, expand_with_history, normalize_query
from deployments.search.reranking import passage_text
from deployments.search.result_json import FragmentCache, render_results, source_of
from deployments.search.spelling import Speller
from deployments.shard.service import ShardAnswer

SEP = "\x1f"  # collection SEP chunk_id: hits stay distinct across collections


class ShardClient(Protocol):
    name: str
    # Whether a call crosses processes. Only then do rows sent along with an answer spare a round trip; a
    # shard searched in this process is asked for the final page's rows once, after fusion.
    remote: bool

    async def search(self, vector, text, k_dense: int, k_keyword: int, filters, rows_for_top: int = 0,
                     acl: tuple[str, list[str]] | None = None, ann: dict | None = None) -> ShardAnswer: ...
    async def fetch(self, chunk_ids: list[str]) -> list[dict]: ...
    async def vectors(self, chunk_ids: list[str]) -> np.ndarray: ...
    async def vocabulary(self, acl: tuple[str, list[str]] | None = None) -> dict[str, int]: ...


class EncoderClient(Protocol):
    async def embed(self, text: str) -> np.ndarray: ...

    async def embed_many(self, texts: list[str]) -> list[np.ndarray]: ...  # one batch (POST /search/batch)


class RerankerClient(Protocol):
    async def score(self, query: str, passages: list[str]) -> list[float]: ...


class SynthesizerClient(Protocol):
    llm_rerank: bool

    async def answer(self, query: str, results: list[dict], max_new_tokens: int | None) -> dict: ...
    def stream(self, query: str, results: list[dict], max_new_tokens: int | None) -> AsyncIterator[dict]: ...
    async def relevance(self, query: str, passages: list[str]) -> list[float]: ...


@dataclass
class Collection:
    name: str
    version: str
    shards: list[ShardClient]
    encoder: EncoderClient
    fields: dict[str, str] = field(default_factory=dict)
    rerank: bool = True  # rerank by default (when a reranker is deployed)
    ann: AnnParams | None = None  # the collection's approximate search options (a request's own win)
    documents: int = 0  # of the version served (its manifest's counts), for metrics
    chunks: int = 0


def _mark(timings: dict, stage: str, started: float) -> None:
    """A stage's time in ``timings_ms`` (summed when it runs again), and its span: (name, start, end, parent)
    in perf_counter seconds, for traces (``deployments.search.tracing``)."""
    now = time.perf_counter()
    timings[stage] = timings.get(stage, 0.0) + (now - started) * 1000
    timings.setdefault("_stages", []).append((stage, started, now, None))


async def _embed(encoder: EncoderClient, text: str, embedded: dict | None) -> np.ndarray:
    """The query's vector: embedded already with its batch (``search_batch``), else by the encoder now."""
    vector = (embedded or {}).get((id(encoder), text))
    return vector if vector is not None else await encoder.embed(text)


def failure(exc: BaseException) -> str:
    return "timed out" if isinstance(exc, asyncio.TimeoutError | TimeoutError) else f"failed ({type(exc).__name__})"


def redact(text: str) -> str:
    return f"<redacted sha256:{hashlib.sha256(text.encode()).hexdigest()[:12]} chars:{len(text)}>"


def leg_scores(legs: dict[str, tuple[list[Hit], list[Hit]]]) -> tuple[dict[str, float], dict[str, float]]:
    """Each candidate's dense and keyword scores, by chunk id (ids carry their collection: no two legs share one)."""
    dense_of: dict[str, float] = {}
    keyword_of: dict[str, float] = {}
    for dense, keyword in legs.values():
        dense_of.update({h.chunk_id: h.score for h in dense})
        keyword_of.update({h.chunk_id: h.score for h in keyword})
    return dense_of, keyword_of


async def within(awaitable, timeout_s: float):
    """``await awaitable`` under a deadline (``TimeoutError`` past it), in the calling task.
    ``asyncio.wait_for`` runs it in a task of its own: a task and a turn of the event loop more for each
    of the several calls a request makes, all of them on the router's one event loop."""
    async with asyncio.timeout(timeout_s):
        return await awaitable


async def gathered(awaitables: list, return_exceptions: bool = False) -> list:
    """``asyncio.gather``, without its task when there is a single awaitable (one shard group, one
    collection: the default)."""
    if len(awaitables) != 1:
        return await asyncio.gather(*awaitables, return_exceptions=return_exceptions)
    try:
        return [await awaitables[0]]
    except Exception as exc:  # not a cancellation: that ends the request, as it does through gather
        if not return_exceptions:
            raise
        return [exc]


@dataclass
class _Work:
    """What a search's stages write as they go: stage times, the debug trace, warnings."""

    timings: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Retrieved:
    legs: dict[str, tuple[list[Hit], list[Hit]]]  # per collection: its merged dense and keyword legs
    fused: list[Hit]
    known: dict[str, dict]  # chunk rows that came with the answers (shard deployments send the best ones)
    failed: list[str]
    asked: int
    answered: int
    depth: int  # the depth searched (the plan's, or twice it when deepened)
    deepened: bool


@dataclass
class _Ranked:
    ranked: list[Hit]  # fused, or reranked
    reranked: bool
    relevance_of: dict[str, float]
    kept: list[Hit]  # at or above min_relevance_score
    dropped: list[Hit]
    final: list[Hit]  # after MMR


class LRUCache:
    def __init__(self, size: int):
        self.size = size
        self.items: OrderedDict[str, SearchResponse] = OrderedDict()

    def get(self, key: str) -> SearchResponse | None:
        value = self.items.get(key)
        if value is not None:
            self.items.move_to_end(key)
        return value

    def put(self, key: str, value: SearchResponse) -> None:
        if self.size <= 0:
            return
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)


class SearchPipeline:
    def __init__(self, collections: dict[str, Collection], default_collection: str, settings,
                 reranker: RerankerClient | None = None, synthesizer: SynthesizerClient | None = None,
                 acl_field: str | None = None, public_principal: str = "public"):
        self.collections = collections
        self.default_collection = default_collection
        self.settings = settings
        self.reranker = reranker
        self.synthesizer = synthesizer
        self.acl_field = acl_field
        self.public_principal = public_principal
        self.cache = LRUCache(settings.cache_size)
        self.spellers: OrderedDict[tuple, Speller] = OrderedDict()  # per (collections, versions, ACL)
        self.fragments = FragmentCache()  # results' JSON, for responses the router sends as they are

    def reconfigure(self, settings) -> None:
        self.settings = settings
        self.cache = LRUCache(settings.cache_size)

    # ------------------------------------------------------------------ helpers

    def _targets(self, req: SearchRequest) -> list[Collection]:
        names = req.collections or [self.default_collection]
        unknown = [n for n in names if n not in self.collections]
        if unknown:
            raise NotFound(f"unknown collection {unknown[0]!r}; known collections: "
                               f"{', '.join(sorted(self.collections))}")
        targets = [self.collections[n] for n in names]
        if req.filters:
            for name, condition in req.filters.items():
                if not any(name in c.fields for c in targets):
                    known = sorted({f for c in targets for f in c.fields})
                    raise InvalidField(
                        f"unknown filter field {name!r}; known fields: {', '.join(known) or '(none: this index has no metadata)'}",
                    )
                if condition is None:
                    raise InvalidField(f"filter on {name!r} has no condition (null)")
        return targets

    def _check_stages(self, req: SearchRequest, targets: list[Collection]) -> bool:
        """Refuse up front (400) a stage this service cannot run rather than ignoring it; returns whether to rerank."""
        llm = req.rerank_with is RerankWith.llm
        if llm and req.rerank is not False and not (self.synthesizer and self.synthesizer.llm_rerank):
            raise InvalidRequest("rerank_with: llm is not enabled on this service "
                               "(its config needs synthesis.enabled and synthesis.llm_rerank)")
        if req.rerank and not llm and self.reranker is None:
            raise InvalidRequest("rerank: true, but this service deploys no reranker (set reranker.model in its config)")
        if req.synthesize and self.synthesizer is None:
            raise InvalidRequest("synthesize: true, but synthesis is not enabled on this service "
                               "(set synthesis.enabled: true in its config)")
        if req.rerank is not None:
            return req.rerank
        return llm or (self.reranker is not None and all(c.rerank for c in targets))

    async def _rerank(self, req: SearchRequest, text: str, pool: list[Hit], rows: list[dict]) -> list[Hit]:
        passages = [passage_text(r["title"], r["text"]) for r in rows]
        if req.rerank_with is RerankWith.llm:
            scores = await self.synthesizer.relevance(text, passages)
        else:
            scores = await self.reranker.score(text, passages)
        if len(scores) != len(pool):
            raise ValueError(f"the reranker returned {len(scores)} scores for {len(pool)} passages")
        # Ties keep the fused order (sorted is stable).
        return sorted((Hit(h.chunk_id, float(sc), h.shard) for h, sc in zip(pool, scores, strict=True)),
                      key=lambda h: -h.score)

    def _query_text(self, req: SearchRequest, trace: dict) -> str:
        text = normalize_query(req.query)
        if req.expand_synonyms and self.settings.synonyms:
            text, added = expand_synonyms(text, self.settings.synonyms)
            trace["synonyms_added"] = added
        if req.conversation_history:
            history = [t if isinstance(t, str) else t.model_dump() for t in req.conversation_history]
            text = expand_with_history(text, history, turns=self.settings.history_turns)
        trace["effective_query"] = text
        return text

    async def _speller(self, targets: Sequence[Collection], acl) -> Speller:
        """The vocabulary of the searched collections (summed over their shards), built once per version."""
        key = (tuple((c.name, c.version) for c in targets), json.dumps(acl))
        if key not in self.spellers:
            calls = [asyncio.wait_for(shard.vocabulary(acl), self.settings.shard_timeout_s * 10)
                     for c in targets for shard in c.shards]
            df: dict[str, int] = {}
            for part in await asyncio.gather(*calls):
                for word, n in part.items():
                    df[word] = df.get(word, 0) + n
            self.spellers[key] = Speller(df)
            while len(self.spellers) > 8:
                self.spellers.popitem(last=False)
        self.spellers.move_to_end(key)
        return self.spellers[key]

    async def _fan_out(self, targets, vectors, text, k_dense, k_keyword, filters, timings, rows_for_top, acl=None,
                       ann: AnnParams | None = None):
        t = time.perf_counter()
        calls = []
        for c in targets:
            vector = vectors.get(c.name)
            options = (ann or AnnParams()).merged_over(c.ann) or None if k_dense else None
            for shard in c.shards:
                rows = rows_for_top if shard.remote else 0
                calls.append((c, shard, within(
                    shard.search(vector, text, k_dense, k_keyword, filters, rows, acl, options),
                    self.settings.shard_timeout_s)))
        answers = await gathered([call for _, _, call in calls], return_exceptions=True)
        _mark(timings, "retrieve", t)
        per_collection: dict[str, list[tuple[int, ShardAnswer]]] = {c.name: [] for c in targets}
        shard_ms = timings.setdefault("_shards", {})
        failed = []
        # A client may be a group of shards: coverage counts shards, not calls.
        asked = sum(getattr(shard, "size", 1) for _, shard, _ in calls)
        answered = asked
        for (c, shard, _), answer in zip(calls, answers, strict=True):
            if isinstance(answer, BaseException):
                reason = "timeout" if isinstance(answer, asyncio.TimeoutError | TimeoutError) else type(answer).__name__
                failed.append(f"{c.name}/{shard.name}: {reason}")
                answered -= getattr(shard, "size", 1)
                continue
            if answer.filter_error:
                raise InvalidField(answer.filter_error)
            per_collection[c.name].append((c.shards.index(shard), answer))
            timings["_stages"].append((f"shards {c.name}/{shard.name}", t, t + answer.took_ms / 1000, "retrieve"))
            for name, ms in (answer.shard_ms or {answer.shard: answer.took_ms}).items():
                shard_ms[f"{c.name}/{name}"] = round(ms, 3)
        return per_collection, failed, asked, answered

    @staticmethod
    def _legs(collection: str, answers: list[tuple[int, ShardAnswer]], depth: int) -> tuple[list[Hit], list[Hit]]:
        prefix = f"{collection}{SEP}"
        if len(answers) == 1:  # one shard group: its legs are already merged, ranked (rank_key) and cut
            ((i, a),) = answers
            return ([Hit(prefix + cid, s, i) for cid, s in a.dense[:depth]],
                    [Hit(prefix + cid, s, i) for cid, s in a.keyword[:depth]])
        dense = merge_top_k(([Hit(prefix + cid, s, i) for cid, s in a.dense] for i, a in answers), depth)
        keyword = merge_top_k(([Hit(prefix + cid, s, i) for cid, s in a.keyword] for i, a in answers), depth)
        return dense, keyword

    def _fusion(self, req: SearchRequest) -> dict[str, Any]:
        """The fusion a hybrid request gets: its own fields where given, the service's settings otherwise."""
        s = self.settings
        if (req.fusion or Fusion(s.fusion)) is Fusion.rrf:
            return {"method": "rrf", "rrf_k": req.rrf_k or s.rrf_k}
        w = req.weights
        return {"method": "weighted", "weights": {"dense": w.dense if w else s.dense_weight,
                                                  "keyword": w.keyword if w else s.keyword_weight}}

    def _fuse(self, req: SearchRequest, dense: list[Hit], keyword: list[Hit]) -> list[Hit]:
        if req.method is Method.vector:
            return dense
        if req.method is Method.keyword:
            return keyword
        fusion = self._fusion(req)
        if fusion["method"] == "rrf":
            return rrf([dense, keyword], rrf_k=fusion["rrf_k"])
        return weighted([dense, keyword], [fusion["weights"]["dense"], fusion["weights"]["keyword"]])

    # ------------------------------------------------------------------ the request

    async def can_see(self, collection: str, doc_id: str, chunk_id: str | None,
                      principals: list[str] | None) -> bool:
        """Whether a document (its chunk ``chunk_id``, or its first chunk) exists in ``collection`` and, with an
        ACL field, whether these principals may see it: the same rule the shards apply to searches (the
        chunk's metadata matched as the filter ``{acl_field: principals + public}``)."""
        target = self.collections[collection]
        wanted = chunk_id or f"{doc_id}#0"
        try:
            found = await asyncio.wait_for(asyncio.gather(*(slot.fetch([wanted]) for slot in target.shards)),
                                           self.settings.shard_timeout_s)
        except Exception as exc:
            raise Unavailable(f"the shards could not be asked about the document ({failure(exc)}); retry shortly") from exc
        rows = [row for rows_of_slot in found for row in rows_of_slot]
        if not rows or rows[0]["doc_id"] != doc_id:
            return False
        if not self.acl_field:
            return True
        from deployments.shard.filters import FilterError, MetadataTable

        table = MetadataTable.from_json_column([rows[0]["metadata_json"]])
        try:
            allowed = table.allowed_rows({self.acl_field: sorted(set(principals or ()) | {self.public_principal})})
        except FilterError:  # the chunk has no ACL field: seen by nobody, as in a search
            return False
        return allowed is not None and len(allowed) > 0

    def cache_key(self, req: SearchRequest, targets: Sequence[Collection], acl=None) -> str:
        versions = {c.name: c.version for c in targets}
        return json.dumps({"v": versions, "r": req.model_dump(mode="json", exclude={"debug"}), "acl": acl},
                          sort_keys=True)

    async def search_batch(self, reqs: Sequence[SearchRequest], principals: list[str] | None = None,
                           rendered: bool = False) -> list[SearchResponse | ServiceError]:
        """Several searches at once, each answered or failed on its own (an error in place of its response).
        Their queries are embedded first, one batch per encoder: a forward pass over 64 queries costs much
        less than 64 passes of one. A request that corrects its spelling is embedded on its own (its text is
        known only after the correction)."""
        texts: dict[int, list[str]] = {}
        encoders: dict[int, EncoderClient] = {}
        for req in reqs:
            if req.spell_correct or (req.method is Method.keyword and req.mmr_lambda is None):
                continue
            try:
                targets = self._targets(req)
            except ServiceError:
                continue  # answered as that request's error below
            text = self._query_text(req, {})
            for c in targets:
                encoders[id(c.encoder)] = c.encoder
                texts.setdefault(id(c.encoder), []).append(text)
        ready: dict[tuple[int, str], np.ndarray] = {}
        for key, encoder in encoders.items():
            distinct = list(dict.fromkeys(texts[key]))
            try:
                vectors = await within(encoder.embed_many(distinct), self.settings.encoder_timeout_s)
            except Exception:  # noqa: BLE001 - each search then embeds its own query, and fails or warns alone
                continue
            ready.update(((key, t), v) for t, v in zip(distinct, vectors, strict=True))

        async def one(req: SearchRequest) -> SearchResponse | ServiceError:
            try:
                return await self.search(req, principals, rendered, ready)
            except ServiceError as e:
                return e

        return list(await asyncio.gather(*(one(r) for r in reqs)))

    async def search(self, req: SearchRequest, principals: list[str] | None = None,
                     rendered: bool = False, embedded: dict | None = None) -> SearchResponse:
        """``principals``: who the caller is; with an ACL field configured it sees only chunks listed for
        one of them (or public), decided inside each shard before ranking. The request as a whole has a
        deadline (``request_timeout_s``, a 504 past it); every stage still at work for it is cancelled.

        ``rendered``: the caller only sends the response on (``schemas.response_json``), so the results may
        come as JSON written from cached fragments (``result_json``) instead of ``Result`` models; the
        response's ``results`` is then empty and ``response_json`` writes them. A request that synthesizes
        an answer always gets the models (the writer reads them)."""
        try:
            return await within(self._search(req, principals, rendered, embedded), self.settings.request_timeout_s)
        except TimeoutError:
            raise DeadlineExceeded(f"the search took longer than router.request_timeout_s "
                               f"({self.settings.request_timeout_s:g} s) and was stopped") from None

    async def _search(self, req: SearchRequest, principals: list[str] | None, rendered: bool,
                      embedded: dict | None = None) -> SearchResponse:
        """The stages in order: plan, spell, embed, retrieve (fan out, merge the legs, fuse), rank (rerank,
        threshold, MMR), respond (fetch the page's rows, render, assemble, answer)."""
        t_start = time.perf_counter()
        targets = self._targets(req)
        acl = None
        if self.acl_field:
            acl = (self.acl_field, sorted(set(principals or ()) | {self.public_principal}))
        key = self.cache_key(req, targets, acl) if self.cache.size > 0 else None  # no cache, no key to build
        # A response cached with its results as JSON only serves callers that send it on (``rendered``).
        if (key is not None and not req.debug and (hit := self.cache.get(key)) is not None
                and (rendered or hit._results_json is None)):
            return hit.model_copy(update={"cached": True,
                                          "timings_ms": {"total": (time.perf_counter() - t_start) * 1000}})
        work = _Work()
        rerank = self._check_stages(req, targets)
        req = self._with_tuned_defaults(req, rerank)
        # A page: ranks offset+1.. of the same ranking (``paging``); the plan fixes every depth before any work.
        offset = page_offset(req, {c.name: c.version for c in targets}, self.settings)
        if offset and req.mmr_lambda is not None:
            raise InvalidRequest("MMR diversifies one page: offset and cursor cannot be used with it; ask for up "
                               "to 100 results in one page")
        plan = plan_search(req, self.settings, len(targets), rerank, offset)
        if plan.capped:
            work.warnings.append(f"candidates {req.candidates} capped at {self.settings.candidate_cap} "
                                 "(router.candidate_cap)")
        asked_query = req.query
        req, corrected = await self._spell(req, targets, acl, work)
        text = self._query_text(req, work.trace)
        vectors = await self._embed_query(req, text, targets, embedded, work)
        got = await self._retrieve(req, plan, targets, text, vectors, acl, work)
        ranked = await self._rank(req, plan, targets, text, vectors, got, rerank, work)
        response = await self._respond(req, plan, targets, got, ranked, vectors, asked_query, corrected, rendered,
                                       work, t_start)
        if key is not None and not got.failed and not work.warnings and not req.debug and not req.stream:
            self.cache.put(key, response)
        return response

    def _with_tuned_defaults(self, req: SearchRequest, rerank: bool) -> SearchRequest:
        """Tuned defaults (deployments.tune) stand wherever a hybrid request says nothing; a threshold tuned on
        fused scores means nothing on BM25, cosine or reranker scores, so it stays off for those."""
        s, defaults = self.settings, {}
        if req.method is Method.hybrid and req.mmr_lambda is None and s.mmr_lambda is not None:
            defaults["mmr_lambda"] = s.mmr_lambda
        if (req.method is Method.hybrid and not rerank and req.min_relevance_score is None
                and s.min_relevance_score is not None):
            defaults["min_relevance_score"] = s.min_relevance_score
        return req.model_copy(update=defaults) if defaults else req

    async def _spell(self, req: SearchRequest, targets, acl, work: _Work) -> tuple[SearchRequest, str | None]:
        """(the request with its query corrected, the corrected query or None)."""
        if not req.spell_correct:
            return req, None
        s, t, corrected = self.settings, time.perf_counter(), None
        try:
            speller = await self._speller(targets, acl)
            # Off the event loop, under a deadline: other requests on this replica never wait for it.
            fixed, corrections, unchecked = await asyncio.wait_for(
                asyncio.to_thread(speller.correct, req.query, s.spell_max_words), s.spell_timeout_s)
        except Exception as exc:  # the query is searched as typed
            work.warnings.append(f"spell correction {failure(exc)}: the query was searched as typed")
        else:
            if unchecked:
                work.warnings.append(f"spell correction stopped after {s.spell_max_words} unknown words "
                                     f"(router.spell_max_words): {unchecked} more searched as typed")
            work.trace["spelling"] = {"corrected_query": fixed, "corrections": [asdict(c) for c in corrections]}
            if corrections:
                corrected = fixed
                req = req.model_copy(update={"query": fixed})
        _mark(work.timings, "spell", t)
        return req, corrected

    async def _embed_query(self, req: SearchRequest, text: str, targets, embedded, work: _Work) -> dict[str, np.ndarray]:
        """The query's vector per collection; none when no leg needs one, or (hybrid) when the encoder failed."""
        if req.method is Method.keyword and req.mmr_lambda is None:
            return {}
        t = time.perf_counter()
        vectors: dict[str, np.ndarray] = {}
        try:
            got = await within(gathered([_embed(c.encoder, text, embedded) for c in targets]),
                               self.settings.encoder_timeout_s)
            vectors = dict(zip((c.name for c in targets), got, strict=True))
        except Exception as exc:  # a hybrid search can still answer from its keyword leg
            if req.method is not Method.hybrid or req.mmr_lambda is not None:
                raise Unavailable(f"the query encoder {failure(exc)}; retry shortly") from exc
            work.warnings.append(f"query encoder {failure(exc)}: keyword results only")
        _mark(work.timings, "embed", t)
        return vectors

    async def _retrieve(self, req: SearchRequest, plan: SearchPlan, targets, text: str, vectors, acl,
                        work: _Work) -> _Retrieved:
        """Every shard searched (both legs, the filter inside), each collection's legs merged and fused; a flat
        fused list is searched once more at twice the depth (``deepen_when_flat``)."""
        s = self.settings
        k_dense = plan.k_dense if vectors else 0
        fan_vectors = vectors if req.method is not Method.keyword else {}
        depth, deepened = plan.depth, False
        while True:
            per_collection, failed, asked, answered = await self._fan_out(
                targets, fan_vectors, text, depth if k_dense else 0, depth if plan.k_keyword else 0, req.filters,
                work.timings, plan.rows_for_top, acl, req.ann)
            t = time.perf_counter()
            legs = {name: self._legs(name, answers, depth) for name, answers in per_collection.items()}
            fused_per = [self._fuse(req, *legs[c.name]) for c in targets]
            fused = fused_per[0] if len(fused_per) == 1 else rrf(fused_per, rrf_k=req.rrf_k or s.rrf_k)
            _mark(work.timings, "fuse", t)
            if (deepened or req.method is not Method.hybrid or not s.deepen_when_flat or req.candidates
                    or not is_flat(fused) or depth >= s.candidate_cap or len(fused) < depth):
                break
            depth, deepened = min(2 * depth, s.candidate_cap), True
        if req.method is Method.hybrid:
            work.trace["fusion"] = self._fusion(req)
        known = {f"{name}{SEP}{row['chunk_id']}": row | {"collection": name}
                 for name, answers in per_collection.items() for _, a in answers for row in a.rows}
        return _Retrieved(legs, fused, known, failed, asked, answered, depth, deepened)

    async def _rank(self, req: SearchRequest, plan: SearchPlan, targets, text: str, vectors, got: _Retrieved,
                    rerank: bool, work: _Work) -> _Ranked:
        """Reranked (the pool's texts fetched and scored under one deadline), cut at min_relevance_score,
        diversified by MMR: each optional, each failure leaving the order before it, with a warning."""
        s, fused = self.settings, got.fused
        ranked, reranked = fused, False
        if rerank and fused:
            t = time.perf_counter()
            pool = fused[:plan.rerank_depth]

            async def fetch_and_rerank() -> list[Hit]:  # one deadline for the pool's texts and their scores
                pool_rows = await self._fetch(pool, targets, got.known)
                got.known.update((h.chunk_id, row) for h, row in zip(pool, pool_rows, strict=True))
                return await self._rerank(req, text, pool, pool_rows)

            try:
                ranked = await asyncio.wait_for(fetch_and_rerank(), s.rerank_timeout_s)
                reranked = True
            except Exception as exc:  # the fused order stands; the request still succeeds
                work.warnings.append(f"reranking {failure(exc)}: results are in fused order")
            _mark(work.timings, "rerank", t)
            work.trace["rerank"] = {"depth": len(pool), "with": req.rerank_with.value, "applied": reranked}
        relevance_of = dict(zip((h.chunk_id for h in ranked),
                             relevance_scores([h.score for h in ranked], *self._relevance_scale(req, reranked, targets)),
                             strict=True))
        cut = req.min_relevance_score
        kept = ranked if cut is None else [h for h in ranked if relevance_of[h.chunk_id] >= cut]
        dropped = [] if cut is None else [h for h in ranked if relevance_of[h.chunk_id] < cut]
        final = kept
        if req.mmr_lambda is not None and kept:
            t = time.perf_counter()
            pool = kept[: req.limit * s.mmr_pool_factor]
            try:
                pool_vectors = await asyncio.wait_for(self._vectors(pool, targets), s.shard_timeout_s)
            except Exception as exc:  # the relevance order stands
                work.warnings.append(f"MMR skipped: the candidates' vectors {failure(exc)}")
            else:
                query_vector = next(iter(vectors.values()))
                relevance = [h.score for h in min_max(pool)]
                final = mmr(pool, query_vector, pool_vectors, req.limit, req.mmr_lambda, relevance)
            _mark(work.timings, "mmr", t)
        return _Ranked(ranked, reranked, relevance_of, kept, dropped, final)

    async def _respond(self, req: SearchRequest, plan: SearchPlan, targets, got: _Retrieved, ranked: _Ranked, vectors,
                       asked_query: str, corrected: str | None, rendered: bool, work: _Work,
                       t_start: float) -> SearchResponse:
        """The page's rows fetched and rendered, the context assembled, the answer written: the response."""
        s, hybrid = self.settings, req.method is Method.hybrid
        top = ranked.final[plan.offset:plan.window]
        t = time.perf_counter()
        try:
            rows = await within(self._fetch(top, targets, got.known), s.shard_timeout_s)
        except Exception as exc:
            raise Unavailable(f"the shards did not send the results' texts: {failure(exc)}; retry shortly") from exc
        _mark(work.timings, "fetch", t)
        fused_scores = {h.chunk_id: h.score for h in got.fused} if hybrid else {}
        dense_of, keyword_of = leg_scores(got.legs)
        results_json = None
        if rendered and not req.synthesize:
            results = []
            results_json = render_results(self.fragments, {c.name: c.version for c in targets}, top, rows, dense_of,
                                          keyword_of, fused_scores, ranked.reranked, ranked.relevance_of,
                                          plan.offset + 1)
        else:
            results = self._results(top, rows, dense_of, keyword_of, fused_scores, ranked.reranked,
                                    ranked.relevance_of, plan.offset + 1)
        context_payload = citation_payload = None
        if req.include_context or req.include_citations:
            t = time.perf_counter()
            passages, info = assemble(  # a result's score is its hit's
                [r | {"score": h.score} for r, h in zip(rows, top, strict=True)],
                token_budget=req.token_budget or s.token_budget,
            )
            if req.include_context:
                context_payload = [p.__dict__ | {"chunk_ids": list(p.chunk_ids)} for p in passages]
                work.trace["context"] = info
            if req.include_citations:
                citation_payload = citations(passages)
            _mark(work.timings, "assemble", t)
        answer = None
        if req.synthesize and not req.stream:
            t = time.perf_counter()
            answer = await self._answer(req, results, work.warnings)
            _mark(work.timings, "synthesize", t)
        timings = work.timings
        work.trace["shard_search_ms"] = timings.pop("_shards", {})
        stages = timings.pop("_stages", [])
        timings["total"] = (time.perf_counter() - t_start) * 1000
        final, window = ranked.final, plan.window
        # A one-leg search ranks exactly the page: a full page may have a next one (maybe empty).
        more = len(final) > window or (len(final) == window and not plan.reorders)
        response = SearchResponse(
            query=asked_query,
            corrected_query=corrected,
            method=req.method,
            method_used=Method.keyword if hybrid and not vectors else req.method,
            results=results,
            total=len(ranked.kept),
            total_results=len(top),
            offset=plan.offset,
            next_cursor=make_cursor(req, {c.name: c.version for c in targets}, window, s)
            if more and req.mmr_lambda is None and window < plan.pages_end else None,
            citations=[source_of(r["doc_id"], r["metadata"]) for r in rows] if req.include_citations else None,
            passage_citations=citation_payload,
            synthesis=answer.text if answer else None,
            context=context_payload,
            index_version={c.name: c.version for c in targets},
            timings_ms={k: round(v, 3) for k, v in timings.items()},
            coverage=Coverage(shards_asked=got.asked, shards_answered=got.answered,
                              ratio=got.answered / got.asked if got.asked else 0.0,
                              degraded=bool(got.failed), failed=got.failed),
            reranked=ranked.reranked,
            answer=answer,
            warnings=work.warnings,
            debug=self._debug(work.trace, got.legs, got.fused, ranked.ranked if ranked.reranked else None,
                              ranked.dropped, final, got.depth, got.deepened, req) if req.debug else None,
        )
        response._results_json = results_json
        response._stages = (t_start, time.perf_counter(), stages)
        return response

    async def _answer(self, req: SearchRequest, results: list[Result], warnings: list[str]) -> Answer | None:
        try:
            answer = await asyncio.wait_for(
                self.synthesizer.answer(req.query, [r.model_dump() for r in results], req.max_answer_tokens),
                self.settings.synthesis_timeout_s)
            return Answer.model_validate(answer)
        except Exception as exc:
            warnings.append(f"synthesis {failure(exc)}: no answer, results only")
            return None

    async def stream_answer(self, req: SearchRequest, response: SearchResponse) -> AsyncIterator[dict]:
        """Events for ``stream: true``, after ``search`` answered (so a bad request is still a plain 4xx):
        the search response, the answer's tokens, then the answer. A synthesis failure is an ``error``
        event, since the status line has been sent by then."""
        yield {"type": "results", **response_dict(response)}
        deadline = time.monotonic() + self.settings.synthesis_timeout_s
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

    async def _vectors(self, hits: list[Hit], targets: list[Collection]) -> np.ndarray:
        by_name = {c.name: c for c in targets}
        groups: dict[tuple[str, int], list[int]] = {}
        for i, h in enumerate(hits):
            groups.setdefault((h.chunk_id.split(SEP, 1)[0], h.shard), []).append(i)
        out: list[np.ndarray | None] = [None] * len(hits)
        calls = [by_name[name].shards[shard].vectors([hits[i].chunk_id.split(SEP, 1)[1] for i in idx])
                 for (name, shard), idx in groups.items()]
        for idx, vecs in zip(groups.values(), await asyncio.gather(*calls), strict=True):
            for i, v in zip(idx, vecs, strict=True):
                out[i] = v
        return np.stack(out)

    async def _fetch(self, hits: list[Hit], targets: list[Collection], known: dict[str, dict]) -> list[dict]:
        """Rows of the final hits: those the shards sent along, the rest fetched (one call per shard)."""
        by_name = {c.name: c for c in targets}
        groups: dict[tuple[str, int], list[str]] = {}
        for h in hits:
            if h.chunk_id not in known:
                name, cid = h.chunk_id.split(SEP, 1)
                groups.setdefault((name, h.shard), []).append(cid)
        calls = [by_name[name].shards[shard].fetch(ids) for (name, shard), ids in groups.items()]
        rows: dict[str, dict] = dict(known)
        for (name, _), fetched in zip(groups, await gathered(calls), strict=True):
            for row in fetched:
                rows[f"{name}{SEP}{row['chunk_id']}"] = row | {"collection": name}
        return [rows[h.chunk_id] for h in hits]

    def _relevance_scale(self, req: SearchRequest, reranked: bool, targets: list[Collection]) -> tuple[str, float]:
        """How the final ranking's scores become ``relevance_score`` (``fusion.relevance_scores``): the
        reranker's probability as it is; a weighted fusion of one collection over its weights' sum (its
        most); everything else (RRF, one leg, collections fused by RRF) min-max over the ranking."""
        if reranked:
            return "probability", 1.0
        if req.method is Method.hybrid and len(targets) == 1:
            fusion = self._fusion(req)
            if fusion["method"] == "weighted":
                return "weighted", fusion["weights"]["dense"] + fusion["weights"]["keyword"]
        return "minmax", 1.0

    @staticmethod
    def _results(top: list[Hit], rows: list[dict], dense_of: dict[str, float], keyword_of: dict[str, float],
                 fused_scores: dict[str, float], reranked: bool, relevance_of: dict[str, float],
                 first_rank: int = 1) -> list[Result]:
        results = []
        for rank, (hit, row) in enumerate(zip(top, rows, strict=True), start=first_rank):
            cid, metadata = hit.chunk_id, row["metadata"]
            results.append(Result(
                rank=rank, chunk_id=row["chunk_id"], doc_id=row["doc_id"], collection=row["collection"],
                content=row["text"], source=source_of(row["doc_id"], metadata), title=row["title"],
                section=row["section"], metadata=metadata, relevance_score=relevance_of[cid], score=hit.score,
                scores=StageScores(dense=dense_of.get(cid), keyword=keyword_of.get(cid), fused=fused_scores.get(cid),
                                   reranked=hit.score if reranked else None),
                char_start=row["char_start"], char_end=row["char_end"],
            ))
        return results

    @staticmethod
    def _debug(trace, legs, fused, reranked, dropped, final, depth, deepened, req) -> dict:
        def show(hits, n=50):
            return [{"chunk_id": h.chunk_id.split(SEP, 1)[1], "score": h.score} for h in hits[:n]]

        return trace | {
            "candidate_depth": depth,
            "deepened_because_flat": deepened,
            # Each leg in full, so fusion settings can be replayed offline (deployments.tune).
            "legs": {name: {"dense": show(d, None), "keyword": show(k, None)} for name, (d, k) in legs.items()},
            "fused": show(fused),
            "reranked": show(reranked) if reranked is not None else None,
            "dropped_below_min_relevance_score": show(dropped),
            "after_mmr": show(final) if req.mmr_lambda is not None else None,
            "query_tokens": len(trace.get("effective_query", "").split()),
        }
