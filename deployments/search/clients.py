"""What the request path talks to, as protocols (shards, encoders, reranker, synthesizer), and a collection as
the pipeline holds it. The router meets them with Serve handles or in-process objects (``serve/handles.py``);
tests with in-process shard services (``search/inprocess.py``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from deployments.edge.schemas import AnnParams
from deployments.errors import InvalidRequest, UnknownCollection
from deployments.search.field_weights import held_weights, version_fields
from deployments.shard.query import DocumentsAnswer, DocumentsQuery, ShardAnswer, ShardQuery

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ShardClient(Protocol):
    name: str
    # Whether a call crosses processes. Only then do rows sent along with an answer spare a round trip; a
    # shard searched in this process is asked for the final page's rows once, after fusion.
    remote: bool

    async def search(self, query: ShardQuery) -> ShardAnswer: ...
    async def fetch(self, chunk_ids: list[str]) -> list[dict]: ...
    async def vectors(self, chunk_ids: list[str]) -> np.ndarray: ...
    async def vocabulary(self, acl: tuple[str, list[str]] | None = None) -> dict[str, int]: ...
    async def documents(self, query: DocumentsQuery) -> DocumentsAnswer: ...  # a page listed without a query


class EncoderClient(Protocol):
    async def embed(self, text: str) -> np.ndarray: ...

    async def embed_many(self, texts: list[str]) -> list[np.ndarray]: ...  # one batch (POST /search/batch)

    # Documents (the fresh segment's chunks): embedded with the version's document prompt, queries with its query one.
    async def embed_documents(self, texts: list[str]) -> list[np.ndarray]: ...

    # (tokens embedded, tokens in all) of a query that may pass the model's token limit; None for one that cannot
    # (asked of a short query, no work) or an encoder with no limit.
    async def tokens(self, text: str) -> tuple[int, int] | None: ...


class RerankerClient(Protocol):
    async def score(self, query: str, passages: list[str]) -> list[float]: ...


class SynthesizerClient(Protocol):
    llm_rerank: bool

    async def answer(self, query: str, results: list[dict], max_new_tokens: int | None) -> dict: ...
    def stream(self, query: str, results: list[dict], max_new_tokens: int | None) -> AsyncIterator[dict]: ...
    async def relevance(self, query: str, passages: list[str]) -> list[float]: ...


def collection(collections: Mapping[str, T], name: str) -> T:
    """``collections[name]`` (a collection, or what is kept per collection), or ``UnknownCollection`` (a 404 listing
    the known names): the one lookup of a collection by the name a request gave."""
    try:
        return collections[name]
    except KeyError:
        raise UnknownCollection(name, collections) from None


async def fields_of(shards: Sequence[Any]) -> dict[str, str]:
    """The metadata fields (name -> kind) of a version's shard slots, asked of each slot's ``info`` (which loads the
    version on it: asking is also the warm-up of a switch)."""
    fields: dict[str, str] = {}
    for info in await asyncio.gather(*(s.info() for s in shards)):
        fields.update(info["fields"])
    return fields


@dataclass
class Collection:
    name: str
    version: str
    shards: list[ShardClient]
    encoder: EncoderClient
    fields: dict[str, str] = field(default_factory=dict)
    rerank: bool = True  # rerank by default (when a reranker is deployed)
    ann: AnnParams | None = None  # the collection's approximate search options (a request's own win)
    bm25_fields: tuple[str, ...] = ("contents",)  # the Lucene fields the version's BM25 scores (``field_weights``)
    field_weights: dict[str, float] | None = None  # the collection's, restricted to those (a request's own win)
    documents: int = 0  # of the version served (its manifest's counts), for metrics
    chunks: int = 0
    # Documents written through the API since the version (``deployments.documents.segment.FreshSegment``): searched
    # as one more shard after the version's, and masking the version's copies of the documents it holds.
    fresh: Any = None
    # The query encoders of the version's named encoders (``index_build.add_encoder``), by name.
    encoders: dict[str, EncoderClient] = field(default_factory=dict)

    @classmethod
    def at_version(cls, name: str, version: str, shards: Sequence[ShardClient], encoder: EncoderClient, *,
                   fields: Mapping[str, str] | None = None, counts: Mapping[str, int] | None = None,
                   rerank: bool = True, ann: AnnParams | None = None, fresh: Any = None,
                   bm25: Mapping[str, Any] | None = None, field_weights: Mapping[str, float] | None = None,
                   encoders: Mapping[str, EncoderClient] | None = None) -> Collection:
        """The collection as searched at ``version``: its shard clients pinned to it, the metadata fields they hold
        (``fields_of``), the version manifest's ``counts`` (docs, chunks), and the fresh segment of the writes that
        version lacks. Made whole, once: a switch to another version makes another (requests that began on this
        one finish on it). ``bm25``: the manifest's block, which names the Lucene fields beside ``contents``;
        ``field_weights``: the collection's configured weights, kept for the fields the version has
        (``deployments.search.field_weights``); ``encoders``: the query encoders of the version's named encoders."""
        counts = counts or {}
        bm25_fields = version_fields(bm25 or {})
        weights, left_out = held_weights(field_weights, bm25_fields)
        if left_out:
            logger.warning("collection %r: index version %r does not index the BM25 fields %s of its field_weights; "
                           "searching with %s", name, version, left_out, weights or {"contents": 1.0})
        return cls(name=name, version=version, shards=list(shards), encoder=encoder, fields=dict(fields or {}),
                   rerank=rerank, ann=ann, documents=counts.get("docs", 0), chunks=counts.get("chunks", 0),
                   fresh=fresh, bm25_fields=bm25_fields, field_weights=weights, encoders=dict(encoders or {}))

    def encoder_for(self, name: str | None) -> EncoderClient:
        """The query encoder of the named encoder ``name`` (None: the version's own); refused (400) with the names
        the version holds when it holds no such encoder."""
        if name is None:
            return self.encoder
        try:
            return self.encoders[name]
        except KeyError:
            raise InvalidRequest(f"collection {self.name!r} (index version {self.version!r}) holds no encoder named "
                                 f"{name!r}; it holds: {', '.join(sorted(self.encoders)) or 'only its own'}") from None

    def slot(self, i: int) -> ShardClient:
        """The shard client a hit's ``shard`` names: a shard slot of the version, or (past them) the fresh segment."""
        return self.shards[i] if i < len(self.shards) else self.fresh

    def clients(self) -> list[ShardClient]:
        """Whom a search asks: the version's shard slots, and the fresh segment when it holds anything."""
        return [*self.shards, self.fresh] if self.fresh is not None and self.fresh.live else self.shards
