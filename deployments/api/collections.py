"""``GET /collections`` and the MCP tool ``list_collections``: what a caller may search and filter on.

An agent or a framework that builds filters needs the collections' names and their metadata fields before its first
search; without them it learns a field's name from a 422. The fields are those a filter may name: the version's (its
shards'), and those of documents written since (the fresh segment), each with the operators its kind takes. Ray-free:
it reads the collections the pipeline serves.
"""

from __future__ import annotations

from collections.abc import Iterable

from deployments.edge.schemas import CollectionInfo, CollectionsResponse, FilterField
from deployments.search.clients import Collection
from deployments.shard.filters import operators_for


def filter_fields(c: Collection) -> list[FilterField]:
    """The fields of ``c``'s version, then those only documents written since hold (the version's kind wins)."""
    kinds = dict(c.fields)
    if c.fresh is not None:
        for name, kind in c.fresh.metadata.fields().items():
            kinds.setdefault(name, kind)
    return [FilterField(name=name, kind=kind, operators=operators_for(kind)) for name, kind in sorted(kinds.items())]


def list_collections(collections: Iterable[Collection], default: str) -> CollectionsResponse:
    return CollectionsResponse(collections=[
        CollectionInfo(name=c.name, default=c.name == default, version=c.version, documents=c.documents,
                       chunks=c.chunks, fields=filter_fields(c))
        for c in sorted(collections, key=lambda c: c.name)])
