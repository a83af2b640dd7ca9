"""Serve deployment: the HTTP ingress and fusion router (one hop fewer than two deployments).

No `from __future__ import annotations` here: FastAPI must see real types on the routes of a Serve
ingress class, or it takes the request body for a query parameter.

Routes only adapt HTTP: validation is in the request models, the caller comes from the front door
(``Depends(current_caller)``), the work is done by Ray-free objects this replica makes once when it starts (the
search pipeline, the version switch, the documents, builds, judgments and health), and errors become status codes
in one place (``deployments.edge.http``'s handlers, over ``deployments.edge.errors``).
"""


import asyncio
import functools
import logging
import time

from fastapi import Request
from fastapi.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from ray import serve
from ray.exceptions import RayActorError

from deployments.api.admin import Builds
from deployments.api.batch import answers_in_order, batch_json, checked
from deployments.api.collections import list_collections
from deployments.api.created import CreatedCollections, registered
from deployments.api.feedback import Feedback
from deployments.api.health import service_health
from deployments.api.mcp import McpEndpoint, McpTools
from deployments.api.observe import SearchRecorder
from deployments.config import RouterSettings, SecurityConfig
from deployments.documents.service import POLL_S, open_documents
from deployments.documents.writes import DocumentWrites
from deployments.edge import schemas as api
from deployments.edge.console import asset_file, page_file
from deployments.edge.guard import Caller, Guard, install
from deployments.edge.http import CurrentCaller, app, error_response, error_responses, install_mcp, request_id
from deployments.edge.metrics import SearchMetrics
from deployments.edge.streams import streamed
from deployments.errors import NotFound, ServiceError
from deployments.judgments import judgments_of
from deployments.search.activation import VersionSwitch
from deployments.search.clients import Collection, fields_of
from deployments.search.models import RankingModels
from deployments.search.pipeline import SearchPipeline
from deployments.serve.builds import start_build
from deployments.serve.handles import (
    HandleReranker,
    HandleSynthesizer,
    deployed_collections,
    held_hosts,
    shard_client,
)
from deployments.serve.heap import settle_heap
from deployments.serve.listen import reuse_address_on_bind
from deployments.serve.logs import cheaper_rollover
from deployments.serve.specs import CollectionSpec, CreatedOptions, created_spec
from deployments.threads import name_os_thread
from index_format.versions import active_version, version_dir

logger = logging.getLogger("ray.serve")


@app.exception_handler(RayActorError)
async def _replica_gone(request: Request, exc: RayActorError) -> JSONResponse:
    # A needed replica died and its retries found no live one yet: Serve is starting a replacement.
    return error_response(request, 503, "a replica this request needs is restarting; retry shortly",
                          headers={"Retry-After": "2"})


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=256, health_check_period_s=10)
@serve.ingress(app)
class SearchRouter:
    async def __init__(self, collections: dict[str, CollectionSpec], default_collection: str, reranker=None,
                       synthesis=None, llm_rerank: bool = False, security: SecurityConfig | None = None,
                       otlp_endpoint: str | None = None, rebalancer=None, created: CreatedOptions | None = None):
        """Everything the replica serves with, made once before it answers: each collection at the version it was
        deployed with (its shards asked for their fields, which loads the version on them), every write acknowledged
        before the replica started applied, and then the followers of ACTIVE and of the change logs started."""
        reuse_address_on_bind()  # before Serve binds this replica's port (deployments.serve.listen says why)
        self.settings = RouterSettings()  # Serve calls reconfigure with the config's settings before any request
        security = security or SecurityConfig()
        # This replica's guard, handed to the app's front door and to the shedding layer ahead of Serve.
        self.guard = Guard.from_config(security)
        install(self.guard)
        self.local_encoders: dict = {}  # the query encoders embedded here, one a model (shared by collections)
        deployed = deployed_collections(collections, self.local_encoders)
        self.deployed = deployed
        self.held_hosts = held_hosts(deployed)
        # Documents written through the API, per collection that follows an index root (a pinned version is
        # read-only): their change log beside the versions, and the fresh segment searched beside the version.
        documents = {name: open_documents(name, d.root, version_dir(d.root, collections[name].version),
                                         d.encoder, d.dimension, {n: client for n, (_, client) in d.named.items()})
                     for name, d in deployed.items() if d.root is not None}
        shards = {name: [shard_client(slot, handle, collections[name].version, names) for slot, handle, names in d.slots]
                  for name, d in deployed.items()}
        fields = await asyncio.gather(*(fields_of(shards[name]) for name in deployed))
        opened = {name: Collection.at_version(name, collections[name].version, shards[name], d.encoder, fields=f,
                                             counts=collections[name].counts, rerank=d.rerank, ann=d.ann,
                                             bm25=collections[name].bm25, field_weights=d.field_weights,
                                             encoders={n: client for n, (_, client) in d.named.items()},
                                             fresh=documents[name].segment if name in documents else None)
                  for (name, d), f in zip(deployed.items(), fields, strict=True)}
        self.rebalancer = rebalancer  # the shard replicas' mover, when rebalance.enabled (GET /admin/rebalance)
        self.stages = {"reranker": HandleReranker(reranker) if reranker is not None else None,
                       "synthesis": HandleSynthesizer(synthesis, llm_rerank) if synthesis is not None else None}
        self.pipeline = SearchPipeline(opened, default_collection, self.settings, reranker=self.stages["reranker"],
                                       synthesizer=self.stages["synthesis"], acl_field=security.acl_field,
                                       public_principal=security.public_principal)
        self.documents = DocumentWrites(self.pipeline, documents)
        self.versions = VersionSwitch(self.pipeline.collections, deployed, shard_client,
                                      self.settings.activation_timeout_s, fresh_for=self.documents.rebase)
        self.models = RankingModels(self.pipeline.models, {name: d.root for name, d in deployed.items()
                                                           if d.follows_active}, self.pipeline.calibrations)
        await self.models.follow()
        self.builds = Builds(deployed, default_collection, start_build,
                             lambda: registered(created.collections_root).values() if created else ())
        self.judgments = Feedback(self.pipeline, {name: judgments_of(spec.judgments)
                                                  for name, spec in collections.items()}, self.guard.keys_on)
        # Collections created through the API (POST /admin/collections): opened here once built, without a redeploy.
        self.created_options = created
        self.created = CreatedCollections(created.collections_root if created else None,
                                          lambda: self.pipeline.collections.keys(),
                                          deployed[default_collection].encoder_spec, security.acl_field, start_build)
        self._not_opened: dict[str, float] = {}  # created collections that failed to open -> when, retried later
        self.metrics = SearchMetrics()
        self.metrics.index(self.pipeline.collections.values())
        self.recorder = SearchRecorder(self.metrics, otlp_endpoint)
        await self.documents.catch_up()  # every write acknowledged before this replica started, searchable here
        await asyncio.gather(*(d.warm() for d in documents.values()))
        await self._open_created()  # those created before this replica started, before it answers
        self._followers = [asyncio.create_task(self._follow_versions()), asyncio.create_task(self._follow_documents())]
        # /mcp: the search route's work and the documents', offered as MCP tools (deployments.api.mcp)
        tools = McpTools(functools.partial(self.answer, route="/mcp"), self.documents, default_collection, self.catalogue, self.guard.key_limits)
        mcp = McpEndpoint(tools, self.guard.max_body_bytes)
        self._followers.append(await mcp.start())
        install_mcp(mcp)
        cheaper_rollover()  # a line a search: the replica's log file checked for rollover without formatting it twice
        name_os_thread("serve-loop")  # this replica's event loop, told apart from its encoder and index threads
        settle_heap()

    async def reconfigure(self, user_config: dict) -> None:
        self.settings = RouterSettings(**(user_config or {}))
        self.pipeline.reconfigure(self.settings)
        self.versions.warm_timeout_s = self.settings.activation_timeout_s

    async def _open_created(self) -> None:
        """Open the collections created through the API that this replica does not serve yet and whose build has
        activated a version. One that fails to open is logged and tried again a minute later."""
        if self.created_options is None:
            return
        root = self.created_options.collections_root
        for name, index in (await asyncio.to_thread(registered, root)).items():
            if name in self.pipeline.collections or time.monotonic() - self._not_opened.get(name, -60.0) < 60.0:
                continue
            if await asyncio.to_thread(active_version, index) is None:
                continue  # its first build is still running (or failed: GET /admin/builds says why)
            try:
                await self._open_collection(await asyncio.to_thread(created_spec, name, index, self.created_options))
                self._not_opened.pop(name, None)
                logger.info(f"serving collection {name!r}, created through the API ({index})")
            except Exception:
                self._not_opened[name] = time.monotonic()
                logger.exception("opening collection %s, created through the API", name)

    async def _open_collection(self, spec: CollectionSpec) -> None:
        """Serve one more collection, as the replica's start serves those of the config: its shards opened here, its
        written documents applied, its root's ACTIVE pointer, ranking model and judgments followed; searchable last."""
        name = spec.name
        d = (await asyncio.to_thread(deployed_collections, {name: spec}, self.local_encoders))[name]
        named = {n: client for n, (_, client) in d.named.items()}
        documents = await asyncio.to_thread(open_documents, name, d.root, version_dir(d.root, spec.version), d.encoder,
                                            d.dimension, named)
        shards = [shard_client(slot, handle, spec.version, names) for slot, handle, names in d.slots]
        opened = Collection.at_version(name, spec.version, shards, d.encoder, fields=await fields_of(shards),
                                       counts=spec.counts, rerank=d.rerank, bm25=spec.bm25, encoders=named,
                                       fresh=documents.segment)
        self.documents.documents[name] = documents
        await documents.catch_up()
        await documents.warm()
        self.versions.add(d)
        self.models.roots[name] = d.root
        self.judgments.stores[name] = judgments_of(spec.judgments)
        self.held_hosts += held_hosts({name: d})
        self.pipeline.collections[name] = opened
        self.metrics.index(self.pipeline.collections.values())

    async def _follow_versions(self) -> None:
        """Switch where an ACTIVE pointer moved (``router.version_poll_s``), and open the collections created since,
        for as long as the replica lives."""
        while True:
            try:
                await self._open_created()
                await self.versions.follow()
                await self.models.follow()
                self.metrics.index(self.pipeline.collections.values())
            except Exception:  # a follower that died would silently stop every later switch
                logger.exception("following the active index versions")
            await asyncio.sleep(self.settings.version_poll_s)

    async def _follow_documents(self) -> None:
        """Other replicas' writes, searchable here within ``POLL_S`` of their acknowledgement; folds when due."""
        while True:
            await self.documents.follow(self.settings, self.builds.fold)
            await asyncio.sleep(POLL_S)

    @app.post("/search", response_model=api.SearchResponse, response_model_exclude_none=True,
              responses={200: {"content": {"application/x-ndjson": {}, "text/event-stream": {}},
                               "description": "The results; with stream: true, NDJSON lines: one 'results' event, "
                               "'token' events, then one 'answer' (or 'error') event; the same events as "
                               "Server-Sent Events (event: the type, data: the JSON) with Accept: "
                               "text/event-stream."}}
              | error_responses({400: "Request cannot be served (a stage not enabled)", 404: "Unknown collection",
                                 504: "Past router.request_timeout_s; the request's work was stopped"}))
    async def search(self, body: api.SearchRequest, request: Request, caller: CurrentCaller) -> api.SearchResponse:
        response = await self.answer(body, request.headers, request_id(request), caller)
        if body.stream:
            return streamed(self.pipeline.stream_answer(body, response), request.headers.get("accept"))
        # Serialized once by pydantic's Rust encoder: returning the model would have FastAPI validate
        # and encode it again (the schema above still documents it).
        return Response(api.response_json(response), media_type="application/json")

    async def answer(self, body: api.SearchRequest, headers, request_id: str | None,
                     caller: Caller, route: str = "/search") -> api.SearchResponse:
        """One search as the caller may see it (its key's principals), recorded: the work of ``POST /search`` and of
        the MCP ``search`` tool (``route`` ``/mcp``)."""
        with self.recorder.search(body, headers, request_id, self.settings.redact_queries, route) as answered:
            response = await self.pipeline.search(body, principals=list(caller.principals), rendered=True)
            answered(response)
        return response

    @app.post("/search/batch", response_model=api.BatchSearchResponse,
              responses=error_responses({504: "Past router.request_timeout_s"}))
    async def search_batch(self, body: api.BatchSearchRequest, request: Request,
                           caller: CurrentCaller) -> Response:
        """Up to 64 searches in one call, their queries embedded as one batch; each answered or refused on its
        own (``status`` and ``response``, or ``status``, ``error`` and ``detail``, as POST /search would)."""
        checks = checked(body.searches)
        answered = await self.pipeline.search_batch([c for c in checks if isinstance(c, api.SearchRequest)],
                                                    list(caller.principals), rendered=True)
        for response in answered:
            if not isinstance(response, ServiceError):
                self.metrics.record(response)
        return Response(batch_json(answers_in_order(checks, answered), request_id(request)),
                        media_type="application/json")

    @app.post("/feedback", response_model=api.FeedbackResponse, status_code=201,
              responses=error_responses({403: "A tenant that is not one of the key's principals",
                                         404: "Unknown collection, or a document it does not hold or the caller may "
                                              "not see", 507: "The disk did not take the judgment"}))
    async def feedback(self, body: api.FeedbackRequest, caller: CurrentCaller) -> api.FeedbackResponse:
        """Store a relevance judgment durably (appended and fsynced before the 201). With keys on, the
        judgment belongs to the caller's key and its principals (its tenant), not to a field the caller
        fills in; only a document the caller can find (and, with ACLs, may see) can be judged."""
        return await self.judgments.add(body, caller)

    @app.get("/feedback/qrels", response_class=PlainTextResponse,
             responses={200: {"content": {"text/tab-separated-values": {}},
                              "description": "query-id, corpus-id, score: BEIR's qrels format"}}
             | error_responses({404: "Unknown collection"}))
    async def feedback_qrels(self, caller: CurrentCaller, collection: str | None = None) -> PlainTextResponse:
        """A collection's judgments as a qrels file (query ids from ``POST /feedback``'s answers). With keys
        on, a caller reads only its tenant's judgments (those made with keys of the same principals); an
        admin key reads them all."""
        qrels, skipped = await self.judgments.qrels(collection, caller)
        # Lines of the store that were torn or malformed were skipped; the header says how many.
        return PlainTextResponse(qrels, media_type="text/tab-separated-values", headers={"X-Skipped-Lines": str(skipped)})

    # ------------------------------------------------------------------ documents

    @app.get("/collections", response_model=api.CollectionsResponse)
    async def collections(self) -> api.CollectionsResponse:
        """The collections served, each with its version, counts and the metadata fields a filter may name (with
        the operators each takes): what a client needs before its first filtered search."""
        return self.catalogue()

    def catalogue(self) -> api.CollectionsResponse:
        return list_collections(self.pipeline.collections.values(), self.pipeline.default_collection)

    @app.put("/collections/{collection}/documents", response_model=api.WriteResponse,
             responses=error_responses({403: "A key without write scope, or a record another tenant's ACL",
                                        404: "Unknown collection", 409: "A collection serving a pinned version",
                                        507: "The disk did not take the write"}))
    async def upsert_documents(self, collection: str, body: api.UpsertDocumentsRequest,
                               caller: CurrentCaller) -> api.WriteResponse:
        """Add or replace documents (up to 1,000, atomically): durable in the collection's change log before the
        answer, searchable on this replica when it returns and on the others within a second."""
        return await self.documents.upsert(collection, body.documents, caller)

    @app.delete("/collections/{collection}/documents/{doc_id}", response_model=api.WriteResponse,
                responses=error_responses({403: "A key without write scope, or another tenant's document",
                                           404: "Unknown collection or document", 409: "A pinned version"}))
    async def delete_document(self, collection: str, doc_id: str,
                              caller: CurrentCaller) -> api.WriteResponse:
        """Delete a document: gone from searches on this replica when the answer comes, on the others within a second."""
        return await self.documents.delete(collection, [doc_id], caller)

    @app.post("/collections/{collection}/documents/delete", response_model=api.WriteResponse,
              responses=error_responses({403: "A key without write scope, or another tenant's document",
                                         404: "Unknown collection, or a document (none is deleted)",
                                         409: "A pinned version"}))
    async def delete_documents(self, collection: str, body: api.DeleteDocumentsRequest,
                               caller: CurrentCaller) -> api.WriteResponse:
        """Delete up to 1,000 documents at once, atomically: one missing id refuses the batch (404)."""
        return await self.documents.delete(collection, body.ids, caller)

    @app.get("/collections/{collection}/documents/{doc_id}", response_model=api.DocumentResponse,
             responses=error_responses({404: "Unknown collection, or no such document the caller may see"}))
    async def get_document(self, collection: str, doc_id: str,
                           caller: CurrentCaller) -> api.DocumentResponse:
        """A document by id, with its chunk ids, as the caller may see it (one it may not see is a 404 too)."""
        return await self.documents.get(collection, doc_id, caller)

    @app.post("/collections/{collection}/documents/list", response_model=api.DocumentsPage,
              responses=error_responses({404: "Unknown collection", 422: "A filter naming a field the collection does "
                                         "not hold, or an operator it does not take"}))
    async def list_documents(self, collection: str, body: api.ListDocumentsRequest,
                             caller: CurrentCaller) -> api.DocumentsPage:
        """A page of a collection's documents in id order, without a query: those the filter lets through and the
        caller may see, with the count of all that match. Page on with ``after`` = the page's ``next_after``."""
        return await self.documents.list(collection, body, caller)

    # ------------------------------------------------------------------ admin

    @app.get("/admin/versions", response_model=api.VersionsResponse,
             responses=error_responses({403: "A key that is not an admin key"}))
    async def versions_status(self) -> api.VersionsResponse:
        """Per collection: the version this replica serves, the active one, the one before, what is published."""
        return api.VersionsResponse(collections=await asyncio.to_thread(self.versions.describe))

    @app.post("/admin/collections/{collection}/activate", response_model=api.ActivationResponse,
              responses=error_responses({403: "A key that is not an admin key", 404: "Unknown collection or version",
                                         409: "The version cannot be served by this app without a redeploy, or is "
                                              "corrupted",
                                         503: "The shards could not load the version; the old one still serves"}))
    async def activate(self, collection: str, body: api.ActivateRequest) -> api.ActivationResponse:
        """Switch to an index version: the shards load it beside the current one, then every request that
        starts afterwards uses it. Other router replicas follow within ``version_poll_s``."""
        result = await self.versions.activate(collection, body.version)
        self.metrics.index(self.pipeline.collections.values())
        return api.ActivationResponse(**result)

    @app.post("/admin/collections/{collection}/rollback", response_model=api.ActivationResponse,
              responses=error_responses({403: "A key that is not an admin key", 404: "Unknown collection",
                                         409: "No earlier activation, or it cannot be served"}))
    async def rollback(self, collection: str) -> api.ActivationResponse:
        """Activate the version that was active before the current one."""
        result = await self.versions.rollback(collection)
        self.metrics.index(self.pipeline.collections.values())
        return api.ActivationResponse(**result)

    @app.post("/admin/collections", response_model=api.CollectionCreated, status_code=202,
              responses=error_responses({403: "A key that is not an admin key",
                                         409: "The name is taken, or creating collections is off (collections_root)",
                                         422: "A bad name or record (named)"}))
    async def create_collection(self, body: api.CreateCollectionRequest,
                                caller: CurrentCaller) -> api.CollectionCreated:
        """Create a collection from its first documents: a build job makes its first version under
        ``collections_root`` and activates it; every router replica then serves it (within
        ``router.version_poll_s``), shards and query encoder inside the replica. Follow the build at
        ``GET /admin/builds/{id}``."""
        return await self.created.create(body, caller)

    @app.get("/admin/rebalance", responses=error_responses({403: "A key that is not an admin key",
                                                            404: "Rebalancing is off (rebalance.enabled)"}))
    async def rebalance_status(self) -> dict:
        """The shard replicas' mover: its last check of the layout (balanced, waiting, or the move it made) and its
        latest moves, each with its outcome and seconds."""
        if self.rebalancer is None:
            raise NotFound("rebalancing is off: set rebalance.enabled (with shards.max_replicas_per_node) and redeploy")
        return await self.rebalancer.report.remote()

    @app.post("/admin/builds", response_model=api.BuildJob, status_code=202,
              responses=error_responses({403: "A key that is not an admin key", 404: "Unknown collection",
                                         409: "A build or fold is already writing into the collection's index "
                                              "root, or the collection serves a pinned version",
                                         422: "A bad option, or a path the service cannot read"}))
    async def start_build(self, body: api.BuildRequest, caller: CurrentCaller) -> api.BuildJob:
        """Start a build (a corpus, or a delta on a version) or a fold of the change log as a job beside the
        service; answers at once with its id. Follow it at ``GET /admin/builds/{id}``; a version it activates is
        served as any activation is (the replicas follow ACTIVE)."""
        return await self.builds.start(body, caller.key_id)

    @app.get("/admin/builds", response_model=api.BuildJobs, responses=error_responses({403: "A key that is not an admin key"}))
    async def list_builds(self) -> api.BuildJobs:
        """The latest builds and folds of every collection's index root, newest first."""
        return await self.builds.jobs()

    @app.get("/admin/builds/{build_id}", response_model=api.BuildJob,
             responses=error_responses({403: "A key that is not an admin key", 404: "No such build"}))
    async def build_status(self, build_id: str) -> api.BuildJob:
        """A build or fold job: its state, progress (stage, done of total) and, once it ended, its summary or the
        end of its output."""
        return await self.builds.job(build_id)

    # ------------------------------------------------------------------ health and the console

    async def check_health(self) -> None:
        """Serve's health check: a replica holding shards (``shards.placement: router``) whose JVM ran out of
        heap, or whose index files vanished, leaves rotation and is replaced."""
        for host in self.held_hosts:
            await host.check_health()

    @app.get("/health", response_model=api.HealthResponse)
    async def health(self) -> JSONResponse:
        # Every shard and stage asked under a deadline (deployments.api.health): 503 when no shard answers.
        body = await service_health(list(self.pipeline.collections.values()), self.pipeline.default_collection,
                                        {stage: c.info if c is not None else None for stage, c in self.stages.items()},
                                        self.settings.shard_timeout_s)
        return JSONResponse(status_code=503 if body.status == "down" else 200, content=body.model_dump())

    @app.get("/", include_in_schema=False)
    async def console_home(self, request: Request) -> RedirectResponse:
        # root_path: under a route prefix the console lives at PREFIX/console.
        return RedirectResponse(request.scope.get("root_path", "").rstrip("/") + "/console")

    @app.get("/console", include_in_schema=False)
    async def console(self) -> FileResponse:
        """The search console: a page that searches, explains the ranking and records judgments."""
        return page_file()

    @app.get("/console/{asset}", include_in_schema=False)
    async def console_asset(self, asset: str, request: Request) -> Response:
        return asset_file(asset) or error_response(request, 404, f"no console file {asset!r}")
