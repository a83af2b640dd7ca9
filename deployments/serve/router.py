"""Serve deployment: the HTTP ingress and fusion router (one hop fewer than two deployments).

No `from __future__ import annotations` here: FastAPI must see real types on the routes of a Serve
ingress class, or it takes the request body for a query parameter.

Routes only adapt HTTP: validation is in the request models, the work in ``SearchPipeline``, and
errors become status codes in one place (the exception handlers below).
"""


import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from pydantic import ValidationError
from ray import serve
from ray.exceptions import RayActorError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.config import RouterSettings, SecurityConfig
from deployments.errors import RequestError, ServiceError
from deployments.judgments import JudgmentStore, doc_of_chunk
from deployments.schemas import (
    ActivateRequest,
    ActivationResponse,
    AnnParams,
    BatchSearchRequest,
    BatchSearchResponse,
    ErrorResponse,
    FeedbackRequest,
    FeedbackResponse,
    HealthResponse,
    SearchRequest,
    SearchResponse,
    ShardHealth,
    VersionsResponse,
    response_json,
)
from deployments.search.activation import DeployedCollection, VersionSwitch
from deployments.search.guard import CONSOLE_ASSETS, REPLICA_GUARD, Caller, Guard, key_digest, route_path
from deployments.search.pipeline import Collection, SearchPipeline, failure, redact
from deployments.serve.heap import settle_heap
from deployments.serve.http_metrics import HTTP_REQUESTS, route_label
from deployments.serve.listen import reuse_address_on_bind
from deployments.serve.shedding import COUNTED_KEY, counted, refuse
from deployments.shard.host import LocalShard, ShardHost, SlotClient, VersionCache

logger = logging.getLogger("ray.serve")

app = FastAPI(
    title="raysearch",
    version="0.1.0",
    description="Hybrid (dense + BM25) retrieval over sharded indexes, fused, diversified and assembled.",
)


def error_responses(extra: dict[int, str] | None = None) -> dict[int, dict]:
    """OpenAPI entries for a route's error statuses, every one with the one error body (``ErrorResponse``:
    ``{"error": message, "detail": ...}``), the same for the front door's refusals and the handlers'."""
    common = {401: "No API key, or one that is not valid (when keys are on)",
              413: "Body over security.max_body_bytes",
              422: "Invalid request: the field, the rule and the fix in the message",
              503: "Overloaded (Retry-After says when to retry), or a stage it needs is restarting"}
    return {code: {"model": ErrorResponse, "description": text} for code, text in (common | (extra or {})).items()}


# One router replica per process: the middleware reads the guard its replica configured.
_guard = REPLICA_GUARD


class FrontDoor:
    """Keys, body size and load shedding before anything else of the app runs, as plain ASGI: Starlette's
    ``BaseHTTPMiddleware`` costs a task and a stream per request. A request counts against ``max_inflight``
    until its response has been sent, streamed answers included. Shedding comes first: under overload it is
    what most requests meet. A request that came through the shedding layer ahead of Serve (``python -m
    deployments`` installs it) was counted there, before Serve's own handling of it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = route_path(scope["path"], scope.get("root_path", ""))  # the same rules under a route prefix
        counted_here = counted(scope) and not scope.get(COUNTED_KEY)  # not already counted ahead of Serve
        if counted_here:
            refusal = _guard.admit()
            if refusal is not None:
                HTTP_REQUESTS.count(route_label(scope, path), scope["method"], refusal.status, shed=True)
                return await refuse(refusal, send, Headers(scope=scope).get("x-request-id"))
        status = [500]  # what an exception that escapes the app becomes (Starlette's outer layer answers 500)

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            headers = Headers(scope=scope)
            refusal = _guard.check(scope["method"], path, headers)
            if refusal is not None:
                status[0] = refusal.status
                return await refuse(refusal, send, headers.get("x-request-id"))
            caller = _guard.caller(headers)
            state = scope.setdefault("state", {})
            state["caller"], state["principals"] = caller, list(caller.principals)
            await self.app(scope, receive, send_and_note)
        finally:
            HTTP_REQUESTS.count(route_label(scope, path), scope["method"], status[0])
            if counted_here:
                _guard.release()


app.add_middleware(FrontDoor)


def configure_guard(security: SecurityConfig) -> Guard:
    import os

    digests = set(security.api_key_digests)
    if security.api_keys_env:
        keys = [k.strip() for k in os.environ.get(security.api_keys_env, "").split(",") if k.strip()]
        if not keys and not digests:
            raise ValueError(f"security.api_keys_env names {security.api_keys_env!r}, which holds no keys here")
        digests |= {key_digest(k) for k in keys}
    _guard.key_principals = {d: tuple(p) for d, p in security.key_principals.items()}
    _guard.admin_digests = frozenset(security.admin_key_digests)
    _guard.key_digests = frozenset(digests | set(security.key_principals) | _guard.admin_digests)
    _guard.max_body_bytes = security.max_body_bytes
    _guard.max_inflight = security.max_inflight
    _guard.retry_after_s = security.retry_after_s
    _guard.configured = True
    return _guard


def request_id(request: Request) -> str | None:
    """The request's id: the caller's ``X-Request-Id``, or the one Serve made for it (Serve puts it in the request's
    headers, returns it in the response's, and writes it in every log line of the request, in every replica)."""
    return request.headers.get("x-request-id")


def error_body(request: Request, message: str, detail: Any = None) -> dict[str, Any]:
    """``ErrorResponse``: every error the app answers, with the id to find the request in the logs."""
    return {"error": message, "detail": detail, "request_id": request_id(request)}


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse(status_code=422, content=error_body(request, "invalid request", validation_problems(exc)))


def validation_problems(exc) -> list[dict[str, str]]:
    """Each problem of a request body: the field's path and the rule it broke."""
    return [{"field": ".".join(str(p) for p in e["loc"] if p != "body"), "error": e["msg"]} for e in exc.errors()]


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    # Starlette's own (no such route, method not allowed), in the app's one error body.
    return JSONResponse(status_code=exc.status_code, content=error_body(request, str(exc.detail)),
                        headers=getattr(exc, "headers", None))


@app.exception_handler(RayActorError)
async def _replica_gone(request: Request, exc: RayActorError) -> JSONResponse:
    # A needed replica died and its retries found no live one yet: Serve is starting a replacement.
    return JSONResponse(status_code=503, headers={"Retry-After": "2"},
                        content=error_body(request, "a replica this request needs is restarting; retry shortly"))


@app.exception_handler(ServiceError)
async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
    """Every error a core raises on purpose (``deployments.errors``), mapped to HTTP here and only here."""
    headers = {"Retry-After": "2"} if exc.status == 503 else None
    return JSONResponse(status_code=exc.status, content=error_body(request, str(exc)), headers=headers)


async def call_with_retry(method, *args, attempts: int = 5, pause_s: float = 0.05):
    """A call through a Serve handle, sent again when the replica it went to died or is unreachable:
    Serve's router drops that replica and picks a live one. Shard calls only read, so a second try
    is safe. The caller's deadline (``asyncio.wait_for``) still bounds the whole."""
    for attempt in range(attempts):
        try:
            return await method.remote(*args)
        except RayActorError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(pause_s * 2**attempt)  # until Serve has taken the dead replica out


class HandleShard(SlotClient):
    """One shard slot (a group of shards) in a shard deployment, pinned to one index version: every call
    carries the version as the multiplexed model id."""

    remote = True

    def __init__(self, name: str, handle, version: str, shards: list[str] | None = None):
        super().__init__(name, version, shards)
        self.handle = handle.options(multiplexed_model_id=version)

    async def search(self, vector, text, k_dense, k_keyword, filters, rows_for_top=0, acl=None, ann=None):
        return await call_with_retry(self.handle.search, vector, text, k_dense, k_keyword, filters, rows_for_top,
                                     acl, ann)

    async def fetch(self, chunk_ids):
        return await call_with_retry(self.handle.fetch, chunk_ids)

    async def vectors(self, chunk_ids):
        return await call_with_retry(self.handle.vectors, chunk_ids)

    async def vocabulary(self, acl=None):
        return await call_with_retry(self.handle.vocabulary, acl)

    async def info(self):
        return await call_with_retry(self.handle.info)


def shard_client(slot: str, handle, version: str, shards: list[str]):
    """The pipeline's client for one shard slot at one version: a call through the slot's deployment, or
    straight into the router's own copy (``shard_placement: router``)."""
    if isinstance(handle, VersionCache):
        return LocalShard(slot, handle, version, shards)
    return HandleShard(slot, handle, version, shards)


def held_slot(handle):
    """A slot as the app builder passed it: a deployment's handle, or what to open here."""
    if isinstance(handle, dict) and "host" in handle:
        return VersionCache(ShardHost(**handle["host"]), handle["max_versions"])
    return handle


class HandleEncoder:
    def __init__(self, handle):
        self.handle = handle

    async def embed(self, text: str):
        return await call_with_retry(self.handle.embed, text)

    async def embed_many(self, texts: list[str]):
        # The encoder deployment batches calls that arrive together (serve.batch): one call a query is one batch.
        return await asyncio.gather(*(self.embed(t) for t in texts))


class LocalEncoder:
    """The query encoder inside the router replica (``encoder_placement: router``): no hop, no serialization.
    Worker threads run the model (ONNX Runtime releases the GIL), so the event loop keeps serving; each
    forward pass uses one core (``threads`` queries at once: ``encoder_router_threads``)."""

    def __init__(self, model: str, backend: str, threads: int = 1):
        from concurrent.futures import ThreadPoolExecutor

        from index_format.encoders import load_encoder

        self.encoder = load_encoder(model, "cpu", backend, threads=1)
        # ONNX Runtime's session and the tokenizer's encode_batch may be called from threads at once;
        # transformers' tokenizer (the torch backend) changes its settings on each call, so it gets one.
        self.worker = ThreadPoolExecutor(max_workers=threads if backend.startswith("onnx") else 1,
                                         thread_name_prefix="query-encoder")

    async def embed(self, text: str):
        loop = asyncio.get_running_loop()
        return (await loop.run_in_executor(self.worker, self.encoder.encode, [text]))[0]

    async def embed_many(self, texts: list[str]):
        from index_format.encoders import encode_queries

        loop = asyncio.get_running_loop()
        return list(await loop.run_in_executor(self.worker, encode_queries, self.encoder, texts))


class HandleReranker:
    def __init__(self, handle):
        self.handle = handle

    async def score(self, query: str, passages: list[str]) -> list[float]:
        return await self.handle.score.remote(query, passages)


class HandleSynthesizer:
    def __init__(self, handle, llm_rerank: bool):
        self.handle, self.llm_rerank = handle, llm_rerank

    async def answer(self, query, results, max_new_tokens):
        return await self.handle.answer.remote(query, results, max_new_tokens)

    def stream(self, query, results, max_new_tokens):
        return self.handle.options(stream=True).stream.remote(query, results, max_new_tokens)

    async def relevance(self, query, passages):
        return await self.handle.relevance.remote(query, passages)


# The search console: static files in deployments/console/, served by name from a fixed list (a requested
# name is looked up, never joined onto a path). The policy lets the page load only its own files and call
# only this origin, so a result's text can never run as script even if it slipped past the page's escaping.
_CONSOLE_DIR = Path(__file__).parents[1] / "console"
_CONSOLE_TYPES = {"index.html": "text/html; charset=utf-8", "console.css": "text/css; charset=utf-8",
                  "console.js": "text/javascript; charset=utf-8"}
_CONSOLE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",  # revalidate, so a redeployed console is picked up at once
}


def _console_file(name: str) -> FileResponse:
    return FileResponse(_CONSOLE_DIR / name, media_type=_CONSOLE_TYPES[name], headers=_CONSOLE_HEADERS)


async def _ndjson(events):
    async for event in events:
        yield json.dumps(event) + "\n"


# A response's warnings that say an optional stage was skipped (the pipeline writes them), and the stage each names.
_SKIPPED_STAGES = (("spell correction stopped", None), ("spell correction", "spelling"), ("query encoder", "embed"),
                   ("reranking", "rerank"), ("MMR skipped", "mmr"), ("synthesis", "synthesis"))


def skipped_stage(warning: str) -> str | None:
    return next((stage for start, stage in _SKIPPED_STAGES if warning.startswith(start)), None)


class _Metrics:
    """The router's search metrics (README, "Metrics", lists them as Prometheus sees them); HTTP requests are
    counted apart, every one (``deployments.serve.http_metrics``)."""

    def __init__(self):
        from ray.util import metrics

        self.stage_ms = metrics.Histogram(
            "search_stage_latency_ms", description="Latency of each search stage (ms).",
            boundaries=[0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000], tag_keys=("stage", "method"))
        self.retrieved = metrics.Histogram(
            "search_retrieved_documents", description="Results returned per request.",
            boundaries=[0.5, 1, 5, 10, 20, 50, 100], tag_keys=("method",))
        self.requests = metrics.Counter(
            "search_requests", description="Searches answered, by search method and outcome (ok, degraded, cached).",
            tag_keys=("method", "outcome"))
        self.skipped = metrics.Counter(
            "search_stages_skipped", description="Optional stages that failed or timed out and were skipped.",
            tag_keys=("stage", "method"))
        self.documents = metrics.Gauge(
            "search_index_documents", description="Documents of the index version a collection serves (0: no longer "
            "served).", tag_keys=("collection", "version"))
        self.chunks = metrics.Gauge(
            "search_index_chunks", description="Chunks of the index version a collection serves (0: no longer served).",
            tag_keys=("collection", "version"))
        self._served: dict[str, str] = {}

    def record(self, response: SearchResponse) -> None:
        method = response.method.value
        for stage, ms in response.timings_ms.items():
            self.stage_ms.observe(ms, tags={"stage": stage, "method": method})
        self.retrieved.observe(response.total_results, tags={"method": method})
        outcome = "cached" if response.cached else ("degraded" if response.coverage.degraded else "ok")
        self.requests.inc(1, tags={"method": method, "outcome": outcome})
        for warning in response.warnings:
            stage = skipped_stage(warning)
            if stage is not None:
                self.skipped.inc(1, tags={"stage": stage, "method": method})

    def index(self, collections) -> None:
        """The version each collection serves and its size; a version no longer served drops to 0."""
        for c in collections:
            before = self._served.get(c.name)
            if before == c.version:
                continue
            if before is not None:
                for gauge in (self.documents, self.chunks):
                    gauge.set(0, tags={"collection": c.name, "version": before})
            self.documents.set(c.documents, tags={"collection": c.name, "version": c.version})
            self.chunks.set(c.chunks, tags={"collection": c.name, "version": c.version})
            self._served[c.name] = c.version


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=256, health_check_period_s=10)
@serve.ingress(app)
class SearchRouter:
    def __init__(self, collections: dict[str, dict[str, Any]], default_collection: str, reranker=None,
                 synthesis=None, llm_rerank: bool = False, security: dict | None = None, settings: dict | None = None,
                 otlp_endpoint: str | None = None):
        reuse_address_on_bind()  # before Serve binds this replica's port (deployments.serve.listen says why)
        self.tracer = None
        if otlp_endpoint:
            from deployments.search.tracing import SearchTracer

            self.tracer = SearchTracer(otlp_endpoint)
        self.settings = RouterSettings(**(settings or {}))
        security_cfg = SecurityConfig.model_validate(security or {})
        self.guard = configure_guard(security_cfg)
        self.stage_handles = {"reranker": reranker, "synthesis": synthesis}
        local_encoders: dict[str, LocalEncoder] = {}
        for spec in collections.values():
            if spec["encoder"] is None and spec["encoder_model"] not in local_encoders:
                local_encoders[spec["encoder_model"]] = LocalEncoder(spec["encoder_model"],
                                                                     spec.get("encoder_backend", "onnx"),
                                                                     spec.get("encoder_threads", 1))
        deployed = {
            name: DeployedCollection(
                name=name, root=Path(spec["root"]) if spec.get("root") else None,
                encoder_model=spec["encoder_model"], dimension=spec["dimension"],
                slots=[(slot, held_slot(handle), shards) for slot, handle, shards in spec["shards"]],
                encoder=HandleEncoder(spec["encoder"]) if spec["encoder"] is not None
                else local_encoders[spec["encoder_model"]],
                rerank=spec.get("rerank", True),
                ann=AnnParams(**spec["ann"]) if spec.get("ann") else None)
            for name, spec in collections.items()
        }
        self.pipeline = SearchPipeline(
            {
                name: Collection(
                    name=name,
                    version=collections[name]["version"],
                    shards=[shard_client(slot, handle, collections[name]["version"], shards)
                            for slot, handle, shards in d.slots],
                    encoder=d.encoder,
                    rerank=d.rerank,
                    ann=d.ann,
                    documents=collections[name].get("counts", {}).get("docs", 0),
                    chunks=collections[name].get("counts", {}).get("chunks", 0),
                )
                for name, d in deployed.items()
            },
            default_collection,
            self.settings,
            reranker=HandleReranker(reranker) if reranker is not None else None,
            synthesizer=HandleSynthesizer(synthesis, llm_rerank) if synthesis is not None else None,
            acl_field=security_cfg.acl_field, public_principal=security_cfg.public_principal,
        )
        self.held_hosts = [handle.host for d in deployed.values() for _, handle, _ in d.slots
                           if isinstance(handle, VersionCache)]
        self.judgments = {name: JudgmentStore(Path(spec["judgments"])) for name, spec in collections.items()
                          if spec.get("judgments")}
        self.versions = VersionSwitch(self.pipeline.collections, deployed, shard_client,
                                      self.settings.activation_timeout_s)
        self._watcher: asyncio.Task | None = None
        self._info_lock = asyncio.Lock()
        self._info_loaded = False
        self.metrics = _Metrics()
        self.metrics.index(self.pipeline.collections.values())
        settle_heap()

    async def reconfigure(self, user_config: dict) -> None:
        self.settings = RouterSettings(**(user_config or {}))
        self.pipeline.reconfigure(self.settings)
        self.versions.warm_timeout_s = self.settings.activation_timeout_s
        self._watch()

    def _watch(self) -> None:
        """Follow the ACTIVE pointers from this replica's event loop (started once, kept alive)."""
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._follow_versions())

    async def _follow_versions(self) -> None:
        while True:
            try:
                await self.versions.follow()
                self.metrics.index(self.pipeline.collections.values())
            except Exception:  # a watcher that died would silently stop every later switch
                logger.exception("following the active index versions")
            await asyncio.sleep(self.settings.version_poll_s)

    async def _load_info(self) -> None:
        """Metadata field kinds per collection, asked of the shards once (they validate filters)."""
        if self._info_loaded:
            return
        async with self._info_lock:
            if self._info_loaded:
                return
            for c in self.pipeline.collections.values():
                infos = await asyncio.gather(*(s.info() for s in c.shards))
                fields: dict[str, str] = {}
                for info in infos:
                    fields.update(info["fields"])
                c.fields = fields
            self._info_loaded = True

    @app.post("/search", response_model=SearchResponse, response_model_exclude_none=True,
              responses={200: {"content": {"application/x-ndjson": {}},
                               "description": "The results; with stream: true, NDJSON lines: one 'results' event, "
                               "'token' events, then one 'answer' (or 'error') event."}}
              | error_responses({400: "Request cannot be served (a stage not enabled)", 404: "Unknown collection",
                                 504: "Past router.request_timeout_s; the request's work was stopped"}))
    async def search(self, body: SearchRequest, request: Request) -> SearchResponse:
        self._watch()
        await self._load_info()
        t0 = time.perf_counter()
        outcome = "error"
        try:
            response = await self.pipeline.search(body, principals=getattr(request.state, "principals", None),
                                                  rendered=True)
            outcome = "degraded" if response.coverage.degraded else "ok"
            self.metrics.record(response)
            if self.tracer is not None:
                self.tracer.record(response, request.headers, request_id(request))
            if body.stream:
                return StreamingResponse(_ndjson(self.pipeline.stream_answer(body, response)),
                                         media_type="application/x-ndjson")
            # Serialized once by pydantic's Rust encoder: returning the model would have FastAPI validate
            # and encode it again (the schema above still documents it).
            return Response(response_json(response), media_type="application/json")
        except Exception as exc:
            if self.tracer is not None:
                self.tracer.record_failure(request.headers, t0, getattr(exc, "status", 500), request_id(request))
            raise
        finally:
            # One line a search, in Serve's log format (JSON by default: these fields beside Serve's request_id,
            # route, application, deployment and replica); the query redacted unless router.redact_queries is off.
            logger.info("search", extra={
                "event": "search",
                "query": redact(body.query) if self.settings.redact_queries else body.query,
                "method": body.method.value, "limit": body.limit, "outcome": outcome,
                "ms": round((time.perf_counter() - t0) * 1000, 2),
            })

    @app.post("/search/batch", response_model=BatchSearchResponse,
              responses=error_responses({504: "Past router.request_timeout_s"}))
    async def search_batch(self, body: BatchSearchRequest, request: Request) -> Response:
        """Up to 64 searches in one call, their queries embedded as one batch; each answered or refused on its
        own (``status`` and ``response``, or ``status``, ``error`` and ``detail``, as POST /search would)."""
        self._watch()
        await self._load_info()
        checked: list[SearchRequest | dict] = []
        for item in body.searches:
            try:
                req = SearchRequest.model_validate(item)
            except ValidationError as e:
                checked.append({"status": 422, "error": "invalid request", "detail": validation_problems(e)})
                continue
            if req.stream:
                checked.append({"status": 400, "error": "stream: a streamed answer cannot be batched; send it "
                                "to POST /search"})
                continue
            checked.append(req)
        reqs = [c for c in checked if isinstance(c, SearchRequest)]
        answered = iter(await self.pipeline.search_batch(reqs, getattr(request.state, "principals", None),
                                                         rendered=True))
        parts = []
        for c in checked:
            if not isinstance(c, SearchRequest):
                parts.append(json.dumps(c))
                continue
            result = next(answered)
            if isinstance(result, ServiceError):
                parts.append(json.dumps({"status": result.status, "error": str(result)}))
            else:
                self.metrics.record(result)
                parts.append(f'{{"status":200,"response":{response_json(result)}}}')
        rid = json.dumps(request_id(request))
        return Response(f'{{"responses":[{",".join(parts)}],"request_id":{rid}}}', media_type="application/json")

    def _judgments(self, collection: str | None) -> tuple[str, JudgmentStore]:
        name = collection or self.pipeline.default_collection
        if name not in self.judgments:
            raise RequestError(f"unknown collection {name!r}; known collections: "
                               f"{', '.join(sorted(self.judgments))}", 404)
        return name, self.judgments[name]

    @app.post("/feedback", response_model=FeedbackResponse, status_code=201,
              responses=error_responses({403: "A tenant that is not one of the key's principals",
                                         404: "Unknown collection, or a document it does not hold or the caller may "
                                              "not see", 507: "The disk did not take the judgment"}))
    async def feedback(self, body: FeedbackRequest, request: Request) -> FeedbackResponse:
        """Store a relevance judgment durably (appended and fsynced before the 201). With keys on, the
        judgment belongs to the caller's key and its principals (its tenant), not to a field the caller
        fills in; only a document the caller can find (and, with ACLs, may see) can be judged."""
        caller: Caller = getattr(request.state, "caller", None) or Caller()
        name, store = self._judgments(body.collection)
        if self.guard.keys_on and body.tenant is not None and body.tenant not in caller.principals:
            raise RequestError(f"tenant {body.tenant!r} is not one of this API key's principals; leave tenant out "
                               "(a judgment belongs to the key's tenant)", 403)
        doc_id = body.doc_id or doc_of_chunk(body.chunk_id)
        if not await self.pipeline.can_see(name, doc_id, body.chunk_id, list(caller.principals)):
            # The same answer for a document that does not exist and one the caller may not see.
            raise RequestError(f"no document {doc_id!r}" + (f" with chunk {body.chunk_id!r}" if body.chunk_id else "")
                               + f" in collection {name!r}", 404)
        record = await asyncio.to_thread(store.add, body.query, doc_id, body.label, body.chunk_id, body.user,
                                         None if self.guard.keys_on else body.tenant, caller.key_id,
                                         caller.principals)
        return FeedbackResponse(collection=name, query_id=record["query_id"], doc_id=doc_id, label=body.label)

    @app.get("/feedback/qrels", response_class=PlainTextResponse,
             responses={200: {"content": {"text/tab-separated-values": {}},
                              "description": "query-id, corpus-id, score: BEIR's qrels format"}}
             | error_responses({404: "Unknown collection"}))
    async def feedback_qrels(self, request: Request, collection: str | None = None) -> PlainTextResponse:
        """A collection's judgments as a qrels file (query ids from ``POST /feedback``'s answers). With keys
        on, a caller reads only its tenant's judgments (those made with keys of the same principals); an
        admin key reads them all."""
        caller: Caller = getattr(request.state, "caller", None) or Caller()
        _, store = self._judgments(collection)
        _, qrels = await asyncio.to_thread(store.qrels, None if caller.admin else caller.principals)
        lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{g}" for q, docs in qrels.items() for d, g in docs.items()]
        # Lines of the store that were torn or malformed were skipped; the header says how many.
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/tab-separated-values",
                                 headers={"X-Skipped-Lines": str(store.skipped)})

    @app.get("/admin/versions", response_model=VersionsResponse,
             responses=error_responses({403: "A key that is not an admin key"}))
    async def versions_status(self) -> VersionsResponse:
        """Per collection: the version this replica serves, the active one, the one before, what is published."""
        self._watch()
        return VersionsResponse(collections=await asyncio.to_thread(self.versions.describe))

    @app.post("/admin/collections/{collection}/activate", response_model=ActivationResponse,
              responses=error_responses({403: "A key that is not an admin key", 404: "Unknown collection or version",
                                         409: "The version cannot be served by this app without a redeploy, or is "
                                              "corrupted",
                                         503: "The shards could not load the version; the old one still serves"}))
    async def activate(self, collection: str, body: ActivateRequest) -> ActivationResponse:
        """Switch to an index version: the shards load it beside the current one, then every request that
        starts afterwards uses it. Other router replicas follow within ``version_poll_s``."""
        self._watch()
        result = await self.versions.activate(collection, body.version)
        self.metrics.index(self.pipeline.collections.values())
        return ActivationResponse(**result)

    @app.post("/admin/collections/{collection}/rollback", response_model=ActivationResponse,
              responses=error_responses({403: "A key that is not an admin key", 404: "Unknown collection",
                                         409: "No earlier activation, or it cannot be served"}))
    async def rollback(self, collection: str) -> ActivationResponse:
        """Activate the version that was active before the current one."""
        self._watch()
        result = await self.versions.rollback(collection)
        self.metrics.index(self.pipeline.collections.values())
        return ActivationResponse(**result)

    async def check_health(self) -> None:
        """Serve's health check: a replica holding shards (``shard_placement: router``) whose JVM ran out of
        heap, or whose index files vanished, leaves rotation and is replaced."""
        for host in self.held_hosts:
            await host.check_health()

    @app.get("/health", response_model=HealthResponse)
    async def health(self) -> JSONResponse:
        self._watch()
        shards = []
        for c in self.pipeline.collections.values():
            results = await asyncio.gather(
                *(asyncio.wait_for(s.info(), self.settings.shard_timeout_s) for s in c.shards), return_exceptions=True)
            for slot, r in zip(c.shards, results, strict=True):
                if isinstance(r, BaseException):
                    shards += [ShardHealth(collection=c.name, shard=name, ok=False, error=type(r).__name__)
                               for name in slot.shards]
                else:
                    shards += [ShardHealth(collection=c.name, shard=name, ok=True, chunks=n)
                               for name, n in r["shards"].items()]
        up = sum(s.ok for s in shards)
        status = "ok" if up == len(shards) else ("degraded" if up else "down")
        stages = {}
        for stage, handle in self.stage_handles.items():
            if handle is None:
                stages[stage] = "off"
                continue
            try:
                await asyncio.wait_for(handle.info.remote(), self.settings.shard_timeout_s)
                stages[stage] = "ok"
            except Exception as exc:
                stages[stage] = failure(exc)
        body = HealthResponse(status=status, default_collection=self.pipeline.default_collection,
                              collections={c.name: c.version for c in self.pipeline.collections.values()},
                              shards=shards, stages=stages)
        return JSONResponse(status_code=200 if up else 503, content=body.model_dump())

    @app.get("/", include_in_schema=False)
    async def console_home(self, request: Request) -> RedirectResponse:
        # root_path: under a route prefix the console lives at PREFIX/console.
        return RedirectResponse(request.scope.get("root_path", "").rstrip("/") + "/console")

    @app.get("/console", include_in_schema=False)
    async def console(self) -> FileResponse:
        """The search console: a page that searches, explains the ranking and records judgments."""
        return _console_file("index.html")

    @app.get("/console/{asset}", include_in_schema=False)
    async def console_asset(self, asset: str) -> Response:
        if asset not in CONSOLE_ASSETS:
            return JSONResponse(status_code=404, content={"error": f"no console file {asset!r}"})
        return _console_file(asset)
