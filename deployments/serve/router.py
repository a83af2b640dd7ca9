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

from fastapi import Request
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

from deployments.builds import list_records, read_record
from deployments.config import RouterSettings, SecurityConfig
from deployments.documents.service import POLL_S, CollectionDocuments, open_documents
from deployments.edge.console import asset_file, page_file
from deployments.edge.errors import status_of
from deployments.edge.guard import Caller, Guard, install
from deployments.edge.http import app, error_response, error_responses, request_id, validation_problems
from deployments.edge.metrics import SearchMetrics
from deployments.edge.schemas import (
    ActivateRequest,
    ActivationResponse,
    BatchSearchRequest,
    BatchSearchResponse,
    BuildJob,
    BuildJobs,
    BuildRequest,
    DeleteDocumentsRequest,
    DocumentResponse,
    FeedbackRequest,
    FeedbackResponse,
    HealthResponse,
    SearchRequest,
    SearchResponse,
    ShardHealth,
    UpsertDocumentsRequest,
    VersionsResponse,
    WriteResponse,
    response_json,
)
from deployments.errors import Conflict, Forbidden, InvalidField, NotFound, ServiceError
from deployments.judgments import JudgmentStore, check_identifier, doc_of_chunk
from deployments.search.activation import DeployedCollection, VersionSwitch
from deployments.search.clients import Collection
from deployments.search.pipeline import SearchPipeline
from deployments.search.stages import failure, redact
from deployments.serve.handles import (
    HandleEncoder,
    HandleReranker,
    HandleSynthesizer,
    LocalEncoder,
    held_slot,
    shard_client,
)
from deployments.serve.heap import settle_heap
from deployments.serve.listen import reuse_address_on_bind
from deployments.serve.specs import CollectionSpec
from deployments.shard.host import VersionCache
from index_format.records import BadRecord, record_to_document
from index_format.versions import resolve_version_dir

logger = logging.getLogger("ray.serve")
FOLD_RETRY_S = 60.0  # a replica tries to start a due fold of a collection at most this often



@app.exception_handler(RayActorError)
async def _replica_gone(request: Request, exc: RayActorError) -> JSONResponse:
    # A needed replica died and its retries found no live one yet: Serve is starting a replacement.
    return error_response(request, 503, "a replica this request needs is restarting; retry shortly",
                          headers={"Retry-After": "2"})


def _log_write(collection: str, seq: int, upserted: int = 0, deleted: int = 0) -> None:
    """One line an acknowledged write, as one a search: Serve adds its request id and the replica that took it."""
    logger.info("write", extra={"event": "write", "collection": collection, "seq": seq, "upserted": upserted,
                                "deleted": deleted})


async def _ndjson(events):
    async for event in events:
        yield json.dumps(event) + "\n"


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=256, health_check_period_s=10)
@serve.ingress(app)
class SearchRouter:
    def __init__(self, collections: dict[str, CollectionSpec], default_collection: str, reranker=None,
                 synthesis=None, llm_rerank: bool = False, security: SecurityConfig | None = None,
                 otlp_endpoint: str | None = None):
        reuse_address_on_bind()  # before Serve binds this replica's port (deployments.serve.listen says why)
        self.tracer = None
        if otlp_endpoint:
            from deployments.search.tracing import SearchTracer

            self.tracer = SearchTracer(otlp_endpoint)
        self.settings = RouterSettings()  # Serve calls reconfigure with the config's settings before any request
        security = security or SecurityConfig()
        # This replica's guard, handed to the app's front door and to the shedding layer ahead of Serve.
        self.guard = Guard.from_config(security)
        install(self.guard)
        self.stage_handles = {"reranker": reranker, "synthesis": synthesis}
        local_encoders: dict[str, LocalEncoder] = {}
        for spec in collections.values():
            if spec.encoder is None and spec.encoder_model not in local_encoders:
                local_encoders[spec.encoder_model] = LocalEncoder(spec.encoder_model, spec.encoder_backend,
                                                                  spec.encoder_threads)
        deployed = {
            name: DeployedCollection(
                name=name, root=Path(spec.root) if spec.root else None,
                encoder_model=spec.encoder_model, dimension=spec.dimension,
                slots=[(slot.name, held_slot(slot.target), slot.shards) for slot in spec.slots],
                encoder=HandleEncoder(spec.encoder) if spec.encoder is not None
                else local_encoders[spec.encoder_model],
                rerank=spec.rerank, ann=spec.ann)
            for name, spec in collections.items()
        }
        self.pipeline = SearchPipeline(
            {
                name: Collection(
                    name=name,
                    version=collections[name].version,
                    shards=[shard_client(slot, handle, collections[name].version, shards)
                            for slot, handle, shards in d.slots],
                    encoder=d.encoder,
                    rerank=d.rerank,
                    ann=d.ann,
                    documents=collections[name].counts.get("docs", 0),
                    chunks=collections[name].counts.get("chunks", 0),
                )
                for name, d in deployed.items()
            },
            default_collection,
            self.settings,
            reranker=HandleReranker(reranker) if reranker is not None else None,
            synthesizer=HandleSynthesizer(synthesis, llm_rerank) if synthesis is not None else None,
            acl_field=security.acl_field, public_principal=security.public_principal,
        )
        self.held_hosts = [handle.host for d in deployed.values() for _, handle, _ in d.slots
                           if isinstance(handle, VersionCache)]
        self.judgments = {name: JudgmentStore(Path(spec.judgments)) for name, spec in collections.items()}
        self.versions = VersionSwitch(self.pipeline.collections, deployed, shard_client,
                                      self.settings.activation_timeout_s, fresh_for=self._fresh_for)
        # Documents written through the API, per collection that follows an index root (a pinned version is
        # read-only): their change log beside the versions, and the fresh segment the pipeline searches.
        self.documents: dict[str, CollectionDocuments] = {}
        for name, spec in collections.items():
            if spec.root is not None:
                docs = open_documents(name, Path(spec.root), resolve_version_dir(Path(spec.root), spec.version),
                                      deployed[name].encoder, spec.dimension)
                self.pipeline.collections[name].fresh = docs.segment
                self.documents[name] = docs
        self._watcher: asyncio.Task | None = None
        self._documents_watcher: asyncio.Task | None = None
        self._fold_tried: dict[str, float] = {}  # collection -> when this replica last tried to start a fold
        self._info_lock = asyncio.Lock()
        self._info_loaded = False
        self.metrics = SearchMetrics()
        self.metrics.index(self.pipeline.collections.values())
        settle_heap()

    async def _fresh_for(self, collection: str, version_dir: Path):
        """The fresh segment to search beside ``version_dir`` (what it lacks of the change log); becomes the one
        later writes go to."""
        return await self.documents[collection].rebase(version_dir)

    async def reconfigure(self, user_config: dict) -> None:
        self.settings = RouterSettings(**(user_config or {}))
        self.pipeline.reconfigure(self.settings)
        self.versions.warm_timeout_s = self.settings.activation_timeout_s
        self._watch()

    def _watch(self) -> None:
        """Follow the ACTIVE pointers and the change logs from this replica's event loop (started once, kept alive)."""
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._follow_versions())
        if self.documents and (self._documents_watcher is None or self._documents_watcher.done()):
            self._documents_watcher = asyncio.get_running_loop().create_task(self._follow_documents())

    async def _follow_documents(self) -> None:
        """Other replicas' writes, searchable here within ``POLL_S`` of their acknowledgement; a fold started when
        a collection's fresh segment is due for one (``router.fold_after_documents``, ``fold_after_s``)."""
        while True:
            for docs in self.documents.values():
                try:
                    await docs.catch_up()
                    await self._fold_if_due(docs)
                except Exception:  # noqa: BLE001 - a watcher that died would stop every later write showing up
                    logger.exception("following the change log of %s", docs.name)
            await asyncio.sleep(POLL_S)

    async def _fold_if_due(self, docs: CollectionDocuments) -> None:
        """Start a fold job of the collection's change log when its segment is due; at most one try a minute per
        collection and replica (the runner refuses a second fold of a root while one runs: another replica's)."""
        segment, s = docs.segment, self.settings
        if not segment.docs:
            return
        due = (s.fold_after_documents and len(segment.docs) >= s.fold_after_documents) or \
            (s.fold_after_s and segment.oldest_write and time.time() - segment.oldest_write >= s.fold_after_s)
        if not due or time.monotonic() - self._fold_tried.get(docs.name, -FOLD_RETRY_S) < FOLD_RETRY_S:
            return
        self._fold_tried[docs.name] = time.monotonic()
        from deployments.serve.builds import start_build

        try:
            job = await start_build(str(self._root_of(docs.name)), "fold", {}, "auto", docs.name)
            logger.info(f"collection {docs.name!r}: folding {len(segment.docs)} written documents (build {job['id']})")
        except Conflict:
            pass  # a build or another replica's fold is writing into the root; the next try comes

    async def _follow_versions(self) -> None:
        while True:
            try:
                await self.versions.follow()
                self.metrics.index(self.pipeline.collections.values())
            except Exception:  # a watcher that died would silently stop every later switch
                logger.exception("following the active index versions")
            await asyncio.sleep(self.settings.version_poll_s)

    async def _ready(self) -> None:
        """What every route that reads or writes documents needs: the watchers running, the logs read."""
        self._watch()
        await self._load_info()

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
            # Every write acknowledged before this replica started is searchable before it answers a search.
            for docs in self.documents.values():
                await docs.catch_up()
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
                self.tracer.record_failure(request.headers, t0, status_of(exc) if isinstance(exc, ServiceError) else 500,
                                           request_id(request))
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
                parts.append(json.dumps({"status": status_of(result), "error": str(result)}))
            else:
                self.metrics.record(result)
                parts.append(f'{{"status":200,"response":{response_json(result)}}}')
        rid = json.dumps(request_id(request))
        return Response(f'{{"responses":[{",".join(parts)}],"request_id":{rid}}}', media_type="application/json")

    def _judgments(self, collection: str | None) -> tuple[str, JudgmentStore]:
        name = collection or self.pipeline.default_collection
        if name not in self.judgments:
            raise NotFound(f"unknown collection {name!r}; known collections: "
                               f"{', '.join(sorted(self.judgments))}")
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
            raise Forbidden(f"tenant {body.tenant!r} is not one of this API key's principals; leave tenant out "
                               "(a judgment belongs to the key's tenant)")
        doc_id = body.doc_id or doc_of_chunk(body.chunk_id)
        if not await self.pipeline.can_see(name, doc_id, body.chunk_id, list(caller.principals)):
            # The same answer for a document that does not exist and one the caller may not see.
            raise NotFound(f"no document {doc_id!r}" + (f" with chunk {body.chunk_id!r}" if body.chunk_id else "")
                               + f" in collection {name!r}")
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

    # ------------------------------------------------------------------ documents

    def _writable(self, collection: str) -> CollectionDocuments:
        if collection not in self.pipeline.collections:
            raise NotFound(f"unknown collection {collection!r}; known collections: "
                           f"{', '.join(sorted(self.pipeline.collections))}")
        if collection not in self.documents:
            raise Conflict(f"collection {collection!r} serves a pinned index version (a version folder, or 'version' "
                           "in the config): its documents are read-only; serve its index root to write to it")
        return self.documents[collection]

    def _may_write(self, caller: Caller, what: str, metadata: dict) -> None:
        """Search keys never write; a write key with principals writes only documents whose ACL field lists
        nothing but its principals (so a tenant cannot write into another's view, nor make public)."""
        if not caller.writer:
            raise Forbidden("this API key may not write documents: add its digest to security.write_key_digests")
        acl_field = self.pipeline.acl_field
        if caller.admin or not acl_field or not caller.principals:
            return
        value = metadata.get(acl_field)
        values = [value] if isinstance(value, str) else list(value) if isinstance(value, list) else []
        if not values or not set(values) <= set(caller.principals):
            raise Forbidden(f"{what}: its {acl_field!r} must list only this key's principals "
                            f"({', '.join(caller.principals)}); it lists {values or 'none'}")

    @app.put("/collections/{collection}/documents", response_model=WriteResponse,
             responses=error_responses({403: "A key without write scope, or a record another tenant's ACL",
                                        404: "Unknown collection", 409: "A collection serving a pinned version",
                                        507: "The disk did not take the write"}))
    async def upsert_documents(self, collection: str, body: UpsertDocumentsRequest, request: Request) -> WriteResponse:
        """Add or replace documents (up to 1,000, atomically): durable in the collection's change log before the
        answer, searchable on this replica when it returns and on the others within a second."""
        docs = self._writable(collection)
        await self._ready()
        caller: Caller = getattr(request.state, "caller", None) or Caller()
        chunking, records, ids = docs.segment.chunking, [], set()
        for i, raw in enumerate(body.documents):
            doc = record_to_document(raw, ("documents", i), chunking.id_fields, chunking.text_fields)
            if isinstance(doc, BadRecord):
                raise InvalidField(f"documents[{i}]: {doc.reason}")
            check_identifier(f"documents[{i}].id", doc.doc_id)
            if doc.doc_id in ids:
                raise InvalidField(f"documents[{i}]: id {doc.doc_id!r} is given twice in this batch; send each once")
            ids.add(doc.doc_id)
            self._may_write(caller, f"documents[{i}]", doc.metadata)
            records.append({"id": doc.doc_id, "title": doc.title, "text": doc.text, "metadata": doc.metadata})
        change, live = await docs.write(records, [], caller.key_id)
        _log_write(collection, change.seq, upserted=len(records))
        return WriteResponse(collection=collection, seq=change.seq, upserted=len(records), searchable=live)

    async def _delete(self, collection: str, ids: list[str], request: Request) -> WriteResponse:
        docs = self._writable(collection)
        await self._ready()
        caller: Caller = getattr(request.state, "caller", None) or Caller()
        principals = getattr(request.state, "principals", None)
        for doc_id in ids:
            check_identifier("id", doc_id)
            found = await self.pipeline.document(collection, doc_id, principals)
            if found is None:  # missing, deleted, or not the caller's to see: the same answer
                raise NotFound(f"no document {doc_id!r} in collection {collection!r}; nothing was deleted")
            self._may_write(caller, f"document {doc_id!r}", found["metadata"])
        change, live = await docs.write([], list(dict.fromkeys(ids)), caller.key_id)
        _log_write(collection, change.seq, deleted=len(set(ids)))
        return WriteResponse(collection=collection, seq=change.seq, deleted=len(set(ids)), searchable=live)

    @app.delete("/collections/{collection}/documents/{doc_id}", response_model=WriteResponse,
                responses=error_responses({403: "A key without write scope, or another tenant's document",
                                           404: "Unknown collection or document", 409: "A pinned version"}))
    async def delete_document(self, collection: str, doc_id: str, request: Request) -> WriteResponse:
        """Delete a document: gone from searches on this replica when the answer comes, on the others within a second."""
        return await self._delete(collection, [doc_id], request)

    @app.post("/collections/{collection}/documents/delete", response_model=WriteResponse,
              responses=error_responses({403: "A key without write scope, or another tenant's document",
                                         404: "Unknown collection, or a document (none is deleted)",
                                         409: "A pinned version"}))
    async def delete_documents(self, collection: str, body: DeleteDocumentsRequest, request: Request) -> WriteResponse:
        """Delete up to 1,000 documents at once, atomically: one missing id refuses the batch (404)."""
        return await self._delete(collection, body.ids, request)

    @app.get("/collections/{collection}/documents/{doc_id}", response_model=DocumentResponse,
             responses=error_responses({404: "Unknown collection, or no such document the caller may see"}))
    async def get_document(self, collection: str, doc_id: str, request: Request) -> DocumentResponse:
        """A document by id, with its chunk ids, as the caller may see it (one it may not see is a 404 too)."""
        if collection not in self.pipeline.collections:
            raise NotFound(f"unknown collection {collection!r}; known collections: "
                           f"{', '.join(sorted(self.pipeline.collections))}")
        await self._ready()
        found = await self.pipeline.document(collection, doc_id, getattr(request.state, "principals", None))
        if found is None:
            raise NotFound(f"no document {doc_id!r} in collection {collection!r}")
        return DocumentResponse(collection=collection, **found)

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

    @app.post("/admin/builds", response_model=BuildJob, status_code=202,
              responses=error_responses({403: "A key that is not an admin key", 404: "Unknown collection",
                                         409: "A build or fold is already writing into the collection's index "
                                              "root, or the collection serves a pinned version",
                                         422: "A bad option, or a path the service cannot read"}))
    async def start_build(self, body: BuildRequest, request: Request) -> BuildJob:
        """Start a build (a corpus, or a delta on a version) or a fold of the change log as a job beside the
        service; answers at once with its id. Follow it at ``GET /admin/builds/{id}``; a version it activates is
        served as any activation is (the replicas follow ACTIVE)."""
        from deployments.serve.builds import start_build

        name = body.collection or self.pipeline.default_collection
        root = self._root_of(name)
        options = body.model_dump(exclude={"kind", "collection"}, exclude_none=True)
        for field in ("corpus", "changes", "deletes"):
            if field in options:
                path = Path(options[field])
                if not (path.parent if any(c in options[field] for c in "*?[") else path).exists():
                    raise InvalidField(f"{field}: {options[field]!r} does not exist on the service's machines")
        if body.kind == "build" and not ({"corpus", "changes", "deletes"} & set(options)):
            raise InvalidField("corpus: a build needs a corpus, or changes or deletes for a delta")
        if body.kind == "fold" and set(options) - {"base", "version", "activate"}:
            raise InvalidField(f"a fold takes only base, version and activate; got {', '.join(sorted(options))}")
        if body.kind == "fold" and "activate" in options:
            options["no_activate"] = not options.pop("activate") or None
        caller: Caller = getattr(request.state, "caller", None) or Caller()
        record = await start_build(str(root), body.kind, options, caller.key_id, name)
        return BuildJob(**record)

    @app.get("/admin/builds", response_model=BuildJobs, responses=error_responses({403: "A key that is not an admin key"}))
    async def list_builds(self) -> BuildJobs:
        """The latest builds and folds of every collection's index root, newest first."""
        records = await asyncio.to_thread(list_records, self._roots())
        return BuildJobs(builds=[BuildJob(**r) for r in records])

    @app.get("/admin/builds/{build_id}", response_model=BuildJob,
             responses=error_responses({403: "A key that is not an admin key", 404: "No such build"}))
    async def build_status(self, build_id: str) -> BuildJob:
        """A build or fold job: its state, progress (stage, done of total) and, once it ended, its summary or the
        end of its output."""
        return BuildJob(**await asyncio.to_thread(read_record, self._roots(), build_id))

    def _roots(self) -> list[Path]:
        return sorted({d.root for d in self.versions.deployed.values() if d.root is not None})

    def _root_of(self, collection: str) -> Path:
        deployed = self.versions.deployed.get(collection)
        if deployed is None:
            raise NotFound(f"unknown collection {collection!r}; known collections: "
                           f"{', '.join(sorted(self.versions.deployed))}")
        if deployed.root is None:
            raise Conflict(f"collection {collection!r} serves a pinned index version (a version folder, or 'version' "
                           "set): it has no index root to build into")
        return Path(deployed.root)

    async def check_health(self) -> None:
        """Serve's health check: a replica holding shards (``shards.placement: router``) whose JVM ran out of
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
        return page_file()

    @app.get("/console/{asset}", include_in_schema=False)
    async def console_asset(self, asset: str, request: Request) -> Response:
        return asset_file(asset) or error_response(request, 404, f"no console file {asset!r}")
