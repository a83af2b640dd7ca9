"""The request path, Ray-free: query -> fan-out -> fusion -> rerank -> threshold -> dedupe -> MMR -> group ->
fetch -> highlights -> context -> answer.

The router deployment runs this with Serve handles as its shard and encoder clients; tests run it with
in-process clients over the same shard services. Shards answer with ids and scores only; texts and
vectors are fetched for the few candidates that survive fusion.

Scores in a response: ``scores.dense`` is cosine similarity, ``scores.keyword`` corpus-exact BM25,
``scores.fused`` the RRF or weighted score; ``score`` is the score of the method used: dense for
``vector``, BM25 for ``keyword``, fused for ``hybrid``, and the reranker's (in [0, 1]) whenever the results
were reranked (``reranked: true``). ``relevance_score`` (the seed's field, and the one
``min_relevance_score`` applies to) is on [0, 1] for every method, on the scale the request asks
(``relevance_scale``): absolute by default, from each hit's own evidence (``search.calibration``), or minmax,
relative to the ranking.

Reranking and synthesis are optional stages behind clients: when one fails or is too slow the request
still succeeds, with the earlier stage's output and a line in ``warnings``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from deployments.bounded import BoundedCache
from deployments.config import RouterSettings
from deployments.edge.schemas import (
    DocumentResponse,
    DocumentsPage,
    ListDocumentsRequest,
    Method,
    RelevanceScale,
    RerankWith,
    SearchRequest,
    SearchResponse,
)
from deployments.errors import (
    DeadlineExceeded,
    InvalidField,
    InvalidRequest,
    ServiceError,
    Unavailable,
)
from deployments.judgments import check_identifier
from deployments.search.calibration import Calibration, evidence
from deployments.search.clients import (
    Collection,
    EncoderClient,
    RerankerClient,
    SynthesizerClient,
    collection,
)
from deployments.search.fusion import is_flat, relevance_scores
from deployments.search.learned import FeatureTable, RankingModel, candidate_features
from deployments.search.lookup import chunk_rows, document_body, document_page, visible
from deployments.search.paging import Cursor, check_alive, page_offset, read_cursor
from deployments.search.plan import plan_search
from deployments.search.query_text import expand_synonyms, expand_with_history, normalize_query
from deployments.search.ranking import Ranking, fuse_collections, fusion_of, relevance_scale
from deployments.search.response import Responder
from deployments.search.retrieval import Retrieval, Retrieved, known_rows
from deployments.search.spelling import Speller
from deployments.search.stages import SearchContext, Work, failure, gathered, ranked_by, within, write_seqs
from deployments.shard.filters import FilterError, filter_conditions
from deployments.shard.query import DocumentsQuery

logger = logging.getLogger("ray.serve")

# How long a cursor's next page waits for this replica to apply the write its point in time names (replicas follow
# the change log within a second of one another).
POINT_IN_TIME_WAIT_S = 2.0
# No encoder's token limit is this short: a query of at most this many bytes is never asked how many tokens it has.
SHORT_QUERY_BYTES = 100
SPELLERS_KEPT = 8  # spelling vocabularies kept, one per (collections, versions, ACL) searched with spell_correct


async def _embed(encoder: EncoderClient, text: str, embedded: dict | None) -> np.ndarray:
    """The query's vector: embedded already with its batch (``search_batch``), else by the encoder now."""
    vector = (embedded or {}).get((id(encoder), text))
    return vector if vector is not None else await encoder.embed(text)


class SearchPipeline:
    """The orchestrator: a request's plan, then its stages in order (``_search``), each stage's work in its own
    module (retrieval, ranking, response). The settings and the optional stages' clients are the pipeline's;
    setting one here hands it to every stage that uses it."""

    def __init__(self, collections: dict[str, Collection], default_collection: str, settings: RouterSettings,
                 reranker: RerankerClient | None = None, synthesizer: SynthesizerClient | None = None,
                 acl_field: str | None = None, public_principal: str = "public"):
        self.collections = collections
        self.default_collection = default_collection
        self.reranker, self.synthesizer = reranker, synthesizer
        self.retrieval = Retrieval()
        # Each collection's active ranking model (``search.learned``) and calibration of relevance_score
        # (``search.calibration``), kept up to date by whoever holds the pipeline (the router follows each root's
        # ``rankers/ACTIVE.json`` and ``calibration.json``; ``inprocess_pipeline`` loads them once).
        self.models: dict[str, RankingModel] = {}
        self.calibrations: dict[str, Calibration] = {}
        self.ranking = Ranking(self.retrieval, reranker, synthesizer, self.calibrations)
        self.responder = Responder(self.retrieval, synthesizer)
        self.acl_field = acl_field
        self.public_principal = public_principal
        self.spellers: BoundedCache[tuple, Speller] = BoundedCache(SPELLERS_KEPT)  # per (collections, versions, ACL)
        self.reconfigure(settings)

    def reconfigure(self, settings: RouterSettings) -> None:
        """The settings every later search runs under (each search takes them whole into its context)."""
        self.settings = settings
        # Identical requests answered from memory, keyed by the request, the versions it searched and the caller's
        # ACL (``cache_key``), so a version switch, a write or another caller never hits.
        self.cache: BoundedCache[str, SearchResponse] = BoundedCache(settings.cache_size)

    # ------------------------------------------------------------------ helpers

    def _targets(self, req: SearchRequest) -> list[Collection]:
        targets = [collection(self.collections, n) for n in req.collections or [self.default_collection]]
        unknown = self._check_filters(req.filters, targets)
        if req.group_by not in (None, "doc_id") and (error := unknown(req.group_by, "group_by field")) is not None:
            raise InvalidField(f"{error}; or group_by: doc_id")
        return targets

    @staticmethod
    def _check_filters(filters: dict[str, Any] | None, targets: Sequence[Collection]
                       ) -> Callable[[str, str], InvalidField | None]:
        """Refuse (422) a filter naming a field no searched collection holds, or a condition of null; returns the
        one rule for a field name (filters and group_by)."""

        def unknown(name: str, what: str) -> InvalidField | None:
            """The error for a field no searched collection holds (one rule for filters and group_by)."""
            if any(name in c.fields or (c.fresh is not None and name in c.fresh.metadata.fields()) for c in targets):
                return None
            known = sorted({f for c in targets for f in c.fields})
            return InvalidField(f"unknown {what} {name!r}; known fields: "
                                f"{', '.join(known) or '(none: this index has no metadata)'}")

        if filters:
            try:
                conditions = filter_conditions(filters)  # the fields under $and, $or and $not too
            except FilterError as e:
                raise InvalidField(str(e)) from None
            for name, condition in conditions:
                if (error := unknown(name, "filter field")) is not None:
                    raise error
                if condition is None:
                    raise InvalidField(f"filter on {name!r} has no condition (null)")
        return unknown

    def _check_stages(self, req: SearchRequest, targets: list[Collection]) -> bool:
        """Refuse up front a query longer than this service takes (422) and a stage it cannot run (400) rather than
        ignoring it; returns whether to rerank."""
        if len(req.query) > self.settings.max_query_chars:
            raise InvalidField(f"query is {len(req.query):,} characters; this service takes at most "
                               f"{self.settings.max_query_chars:,} (router.max_query_chars)")
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

    def _ranking_model(self, req: SearchRequest, targets: list[Collection]) -> RankingModel | None:
        """The model that orders this search: the collection's active one unless the request says
        ``ranking_model: false``; asking for one where none is active (or over several collections) is a 400."""
        if req.ranking_model is False:
            return None
        model = self.models.get(targets[0].name) if len(targets) == 1 else None
        if req.ranking_model and model is None:
            where = (f"collection {targets[0].name!r} has no active ranking model (train one: python -m "
                     "relevance.train_ranker)" if len(targets) == 1 else "a ranking model orders one collection's "
                     "candidates; this search fuses several")
            raise InvalidRequest(f"ranking_model: true, but {where}")
        return model

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
        speller = self.spellers.get(key)
        if speller is None:
            calls = [asyncio.wait_for(shard.vocabulary(acl), self.settings.shard_timeout_s * 10)
                     for c in targets for shard in c.shards]
            df: dict[str, int] = {}
            for part in await asyncio.gather(*calls):
                for word, n in part.items():
                    df[word] = df.get(word, 0) + n
            speller = Speller(df)
            self.spellers.put(key, speller)
        return speller

    # ------------------------------------------------------------------ the request

    async def can_see(self, collection: str, doc_id: str, chunk_id: str | None,
                      principals: list[str] | None) -> bool:
        """Whether a document (its chunk ``chunk_id``, or its first chunk) exists in ``collection`` and, with an
        ACL field, whether these principals may see it: the same rule the shards apply to searches (the
        chunk's metadata matched as the filter ``{acl_field: principals + public}``)."""
        try:
            where, rows, _ = await chunk_rows(self.collections[collection], doc_id, self.settings.shard_timeout_s)
        except Exception as exc:
            raise Unavailable(f"the shards could not be asked about the document ({failure(exc)}); retry shortly") from exc
        if chunk_id is not None:
            rows = [r for r in rows if r["chunk_id"] == chunk_id]
        return bool(rows) and visible(rows[0], self.acl_field, principals, self.public_principal)

    async def document(self, collection: str, doc_id: str, principals: list[str] | None) -> dict[str, Any] | None:
        """A document by id with its chunk ids, as these principals may see it; None when it does not exist, was
        deleted, or may not be seen by them (one answer for all three)."""
        try:
            where, rows, seq = await chunk_rows(self.collections[collection], doc_id, self.settings.shard_timeout_s)
        except Exception as exc:
            raise Unavailable(f"the shards could not be asked about the document ({failure(exc)}); retry shortly") from exc
        if not rows or not visible(rows[0], self.acl_field, principals, self.public_principal):
            return None
        return document_body(doc_id, where, rows, seq)

    async def list_documents(self, name: str, req: ListDocumentsRequest,
                             principals: list[str] | None) -> DocumentsPage:
        """A page of a collection's documents in id order, without a query, as these principals may see them."""
        target = collection(self.collections, name)
        self._check_filters(req.filters, [target])
        for doc_id in req.ids or ():
            check_identifier("ids", doc_id)
        query = DocumentsQuery(filters=req.filters, acl=self._acl(principals),
                               ids=tuple(req.ids) if req.ids is not None else None, after=req.after, limit=req.limit)
        try:
            documents, total, last = await document_page(target, query, self.settings.shard_timeout_s)
        except FilterError as e:
            raise InvalidField(str(e)) from None
        except Exception as exc:
            raise Unavailable(f"the shards could not list the documents ({failure(exc)}); retry shortly") from exc
        return DocumentsPage(collection=name, documents=[DocumentResponse(collection=name, **d) for d in documents],
                             total=total, next_after=last)

    def _acl(self, principals: list[str] | None) -> tuple[str, list[str]] | None:
        """The ACL a caller's searches and listings carry: (field, its principals and the public one); None: no ACL."""
        if not self.acl_field:
            return None
        return (self.acl_field, sorted(set(principals or ()) | {self.public_principal}))

    def cache_key(self, req: SearchRequest, targets: Sequence[Collection], acl=None) -> str:
        # A write changes what a collection answers: the fresh segment's last applied change is part of the key,
        # as are its ranking model and its calibration (the scores it answers with).
        versions = {c.name: [c.version, c.fresh.applied_seq if c.fresh is not None else 0,
                             getattr(self.models.get(c.name), "id", None),
                             getattr(self.calibrations.get(c.name), "fitted", {}).get("at")] for c in targets}
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
                if req.encoder is None or req.encoder in c.encoders:  # else refused as that request's error
                    encoder = c.encoder_for(req.encoder)
                    encoders[id(encoder)] = encoder
                    texts.setdefault(id(encoder), []).append(text)
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
        cursor = read_cursor(req)
        if cursor is not None:  # a next page: ranked again at its first page's point in time
            check_alive(cursor, self.settings.cursor_keep_alive_s)
            targets = await self._at_point_in_time(targets, cursor)
        acl = self._acl(principals)
        key = self.cache_key(req, targets, acl) if self.cache.size > 0 else None  # no cache, no key to build
        # A response cached with its results as JSON only serves callers that send it on (``rendered``).
        if (key is not None and not req.debug and (hit := self.cache.get(key)) is not None
                and (rendered or hit._results_json is None)):
            return hit.model_copy(update={"cached": True,
                                          "timings_ms": {"total": (time.perf_counter() - t_start) * 1000}})
        rerank = self._check_stages(req, targets)
        req = self._with_tuned_defaults(req, rerank)
        # A page: ranks offset+1.. of the same ranking (``paging``); the plan fixes every depth before any work.
        model = self._ranking_model(req, targets)
        writes = write_seqs(targets)
        offset = page_offset(req, cursor, ranked_by(targets, model), self.settings, writes)
        if offset and req.mmr_lambda is not None:
            raise InvalidRequest("MMR diversifies one page: offset and cursor cannot be used with it; ask for up "
                               "to 100 results in one page")
        ctx = await self._prepare(SearchContext(
            req=req, plan=plan_search(req, self.settings, len(targets), rerank, offset), targets=targets,
            settings=self.settings, work=Work(), started=t_start, asked_query=req.query, acl=acl, rerank=rerank,
            rendered=rendered, model=model, writes=writes, first_page_at=cursor.made_at if cursor else None),
            embedded)
        got = await self._retrieve(ctx)
        ranked = await self.ranking.rank(ctx, got)
        response = await self.responder.respond(ctx, got, ranked)
        if key is not None and not got.failed and not ctx.work.warnings and not req.debug and not req.stream:
            self.cache.put(key, response)
        return response

    async def _at_point_in_time(self, targets: list[Collection], cursor: Cursor) -> list[Collection]:
        """Each collection with its fresh segment as it was at the cursor's write (``FreshSegment.at``), waiting up
        to ``POINT_IN_TIME_WAIT_S`` for a replica that has not applied that write yet (it follows the log within a
        second). A collection whose segment no longer holds that point in time is left as it is: ``page_offset``
        then refuses the page (409)."""
        deadline = time.monotonic() + POINT_IN_TIME_WAIT_S
        out = []
        for c in targets:
            seq = cursor.writes.get(c.name, 0)
            while c.fresh is not None and seq > c.fresh.applied_seq and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if c.fresh is not None and seq > c.fresh.applied_seq:
                raise Unavailable(f"this router replica has not applied write {seq} of collection {c.name!r} "
                                  f"yet (it has {c.fresh.applied_seq}); retry shortly")
            out.append(replace(c, fresh=c.fresh.at(seq)) if c.fresh is not None and c.fresh.holds(seq) else c)
        return out

    async def ranking_features(self, req: SearchRequest) -> FeatureTable:
        """What a ranking model sees of this search: its best ``ranking_depth`` fused candidates with their
        features, made by the same stages as a search (``relevance.train_ranker`` trains on these), the
        cross-encoder's scores among them when the search reranks."""
        targets = self._targets(req)
        if len(targets) != 1:
            raise InvalidRequest("ranking features are made for one collection's candidates")
        rerank = self._check_stages(req, targets)
        req = self._with_tuned_defaults(req, rerank)
        ctx = await self._prepare(SearchContext(
            req=req, plan=plan_search(req, self.settings, 1, rerank, 0), targets=targets, settings=self.settings,
            work=Work(), started=time.perf_counter(), asked_query=req.query, rerank=rerank), None)
        got = await self._retrieve(ctx)
        scores: dict = {}
        if rerank and got.fused:
            pool = got.fused[:ctx.plan.rerank_depth]
            rows = await self.retrieval.fetch(pool, targets, got.known)
            scores = {h.key: h.score for h in await self.ranking.rerank(req, ctx.text, pool, rows)}
        return await candidate_features(ctx, got, got.fused[:self.settings.ranking_depth], scores)

    async def relevance_evidence(self, req: SearchRequest) -> list[tuple[str, dict[str, float], float]]:
        """What a calibration is fitted on (``relevance.calibrate``): the best ``limit`` fused candidates of one
        collection's search, each with its legs' evidence (``calibration.evidence``) and its relevance_score on
        the minmax scale, made by the same stages as a search."""
        targets = self._targets(req)
        if len(targets) != 1:
            raise InvalidRequest("relevance evidence is made for one collection's candidates")
        ctx = await self._prepare(SearchContext(
            req=req, plan=plan_search(req, self.settings, 1, False, 0), targets=targets, settings=self.settings,
            work=Work(), started=time.perf_counter(), asked_query=req.query), None)
        got = await self._retrieve(ctx)
        top = got.fused[:req.limit]
        scale = relevance_scale(req, self.settings, False, 1)
        relative = relevance_scores([h.score for h in got.fused], *scale)[:req.limit]
        return list(zip((h.chunk_id for h in top), evidence([h.key for h in top], got.legs), relative, strict=True))

    async def _prepare(self, ctx: SearchContext, embedded: dict | None) -> SearchContext:
        """The planned search made ready to retrieve: the plan's warnings, the query spelled, its text and vectors
        (one rule for a search and for the candidates a ranking model is trained on)."""
        if ctx.plan.capped:
            ctx.work.warnings.append(f"candidates {ctx.req.candidates} capped at {self.settings.candidate_cap} "
                                     "(router.candidate_cap)")
        ctx = await self._spell(ctx)
        ctx = replace(ctx, text=self._query_text(ctx.req, ctx.work.trace))
        return replace(ctx, vectors=await self._embed_query(ctx, embedded))

    def _with_tuned_defaults(self, req: SearchRequest, rerank: bool) -> SearchRequest:
        """Tuned defaults (relevance.tune) stand wherever a hybrid request says nothing; a threshold tuned on
        fused scores means nothing on BM25, cosine or reranker scores, so it stays off for those."""
        s, defaults = self.settings, {}
        # A tuned MMR stays off under group_by: MMR diversifies one page of chunks, grouping pages over groups.
        if (req.method is Method.hybrid and req.mmr_lambda is None and s.mmr_lambda is not None
                and req.group_by is None and req.encoder is None):
            defaults["mmr_lambda"] = s.mmr_lambda
        if (req.method is Method.hybrid and not rerank and req.min_relevance_score is None
                and s.min_relevance_score is not None and req.relevance_scale is not RelevanceScale.absolute):
            # Tuned on the minmax scale (relevance.tune), so applied on it.
            defaults |= {"min_relevance_score": s.min_relevance_score, "relevance_scale": RelevanceScale.minmax}
        return req.model_copy(update=defaults) if defaults else req

    async def _spell(self, ctx: SearchContext) -> SearchContext:
        """The context with its query corrected (``req.query`` and ``corrected``), when the request asks for it."""
        req, work = ctx.req, ctx.work
        if not req.spell_correct:
            return ctx
        s, t = ctx.settings, time.perf_counter()
        try:
            speller = await self._speller(ctx.targets, ctx.acl)
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
                ctx = replace(ctx, req=req.model_copy(update={"query": fixed}), corrected=fixed)
        work.mark("spell", t)
        return ctx

    async def _embed_query(self, ctx: SearchContext, embedded: dict | None) -> dict[str, np.ndarray]:
        """The query's vector per collection; none when no leg needs one, or (hybrid) when the encoder failed."""
        req, targets = ctx.req, ctx.targets
        if req.method is Method.keyword and req.mmr_lambda is None:
            return {}
        t = time.perf_counter()
        vectors: dict[str, np.ndarray] = {}
        encoders = [c.encoder_for(req.encoder) for c in targets]  # an encoder a version lacks: a 400, not a failure
        try:
            got = await within(gathered([_embed(e, ctx.text, embedded) for e in encoders]),
                               ctx.settings.encoder_timeout_s)
            vectors = dict(zip((c.name for c in targets), got, strict=True))
        except Exception as exc:  # a hybrid search can still answer from its keyword leg
            if req.method is not Method.hybrid or req.mmr_lambda is not None:
                raise Unavailable(f"the query encoder {failure(exc)}; retry shortly") from exc
            ctx.work.warnings.append(f"query encoder {failure(exc)}: keyword results only")
        if vectors and len(ctx.text.encode()) > SHORT_QUERY_BYTES:
            await self._token_cut(ctx, encoders)
        ctx.work.mark("embed", t)
        return vectors

    @staticmethod
    async def _token_cut(ctx: SearchContext, encoders: list[EncoderClient]) -> None:
        """A warning where the encoder embedded only the query's first tokens (past its model's limit)."""
        try:
            counts = await within(gathered([e.tokens(ctx.text) for e in dict.fromkeys(encoders)]),
                                  ctx.settings.encoder_timeout_s)
        except Exception:  # the vectors stand; only the note of a cut is missing
            logger.warning("the query's tokens were not counted", exc_info=True)
            return
        cut = [c for c in counts if c is not None and c[0] < c[1]]
        if cut:
            kept, total = min(cut)
            ctx.work.warnings.append(f"dense leg: the encoder embedded the query's first {kept:,} of its "
                                     f"{total:,} tokens (its model's limit)")

    async def _retrieve(self, ctx: SearchContext) -> Retrieved:
        """Every shard searched (both legs, the filter inside), each collection's legs merged and fused; a flat
        fused list is searched once more at twice the depth (``deepen_when_flat``)."""
        req, plan, s = ctx.req, ctx.plan, ctx.settings
        # A keyword search embeds its query only for MMR: its dense leg is not searched.
        dense = bool(plan.k_dense and ctx.vectors) and req.method is not Method.keyword
        depth, deepened = plan.depth, False
        while True:
            per_collection, failed, asked, answered = await self.retrieval.fan_out(
                ctx, depth if dense else 0, depth if plan.k_keyword else 0)
            t = time.perf_counter()
            legs = {name: self.retrieval.legs(name, answers, depth) for name, answers in per_collection.items()}
            fused = fuse_collections(req, s, legs, ctx.targets)
            ctx.work.mark("fuse", t)
            if (deepened or req.method is not Method.hybrid or not s.deepen_when_flat or req.candidates
                    or not is_flat(fused) or depth >= s.candidate_cap or len(fused) < depth):
                break
            depth, deepened = min(2 * depth, s.candidate_cap), True
        if req.method is Method.hybrid:
            ctx.work.trace["fusion"] = fusion_of(req, s)
        return Retrieved(legs, fused, known_rows(per_collection), failed, asked, answered, depth, deepened)

    def stream_answer(self, req: SearchRequest, response: SearchResponse) -> AsyncIterator[dict]:
        """Events for ``stream: true`` (``Responder.stream_answer``)."""
        return self.responder.stream_answer(req, response, self.settings)

