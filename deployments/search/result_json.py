"""A page of results written as JSON from fragments rendered once per chunk, without a pydantic model
per result.

Why: at ``limit: 100`` the router built 100 ``Result`` models (validated in Rust, but each one a Python
call with a dozen arguments) and then serialized them, texts escaped again on every request: 0.57 ms for
100 results standalone, 0.16 ms this way (bench/README.md, "Serving cost"), all of it holding the GIL the
router's event loop and encoder threads share. A chunk's text, title, metadata and ids never change
within an index version, so their JSON is rendered once and kept (``FragmentCache``); a request writes
only its ranks and scores around them.

The bytes are those pydantic writes for the same ``Result`` models (``model_dump_json(exclude_none=True)``:
field order, ``null`` handling, float format), which the tests check against the models themselves.
``Result`` stays the schema of record (OpenAPI, the synthesis stage and the cores use the models).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json

from deployments.bounded import BoundedCache
from deployments.search.hits import Hit

# Chunks whose JSON is kept (about the size of their text and metadata each), the least recently used dropped
# first, as a shard's kept rows are.
FRAGMENTS_KEPT = 50_000


def source_of(doc_id: str, metadata: dict[str, Any]) -> str:
    """A result's ``source`` (the seed's field): where its document came from when the corpus said so (a
    ``url`` or ``source`` field), else its document id."""
    for name in ("url", "source"):
        value = metadata.get(name)
        if isinstance(value, str) and value.strip():
            return value
    return doc_id


def dumps(value: Any) -> str:
    """JSON as pydantic writes a model's field: its own serializer (compact, UTF-8 as is, the shortest
    float that reads back the same, NaN as null)."""
    return to_json(value).decode()


class FragmentCache:
    """The JSON of each chunk's unchanging fields, keyed by (collection, index version, chunk id): a
    version never changes a chunk, and a new version gets its own entries."""

    def __init__(self, kept: int = FRAGMENTS_KEPT):
        self.fragments: BoundedCache[tuple[str, str, str], tuple[str, str]] = BoundedCache(kept)

    def of(self, collection: str, version: str, row: dict[str, Any]) -> tuple[str, str]:
        """(fields, span): ``"chunk_id":..`` to ``"metadata":{..}`` (the collection among them), and
        ``"char_start":..,"char_end":..``; a result's scores go between the two."""
        key = (collection, version, row["chunk_id"])
        found = self.fragments.get(key)
        if found is None:
            metadata = row["metadata"]
            found = (
                f'"chunk_id":{dumps(row["chunk_id"])},"doc_id":{dumps(row["doc_id"])},"collection":{dumps(collection)},'
                f'"content":{dumps(row["text"])},"source":{dumps(source_of(row["doc_id"], metadata))},'
                f'"title":{dumps(row["title"])},"section":{dumps(row["section"])},"metadata":{dumps(metadata)}',
                f'"char_start":{int(row["char_start"])},"char_end":{int(row["char_end"])}',
            )
            self.fragments.put(key, found)
        return found


@dataclass(frozen=True)
class PageScores:
    """The scores a page's results show, by hit key (``Hit.key``): each leg's, fusion's and ``relevance_score``;
    ``reranked``: a hit's own score is the reranker's."""

    dense: dict[tuple[str, str], float]
    keyword: dict[tuple[str, str], float]
    fused: dict[tuple[str, str], float]
    relevance: dict[tuple[str, str], float]
    reranked: bool = False


def render_results(fragments: FragmentCache, versions: dict[str, str], top: Sequence[Hit], rows: Sequence[dict],
                   page: PageScores, first_rank: int = 1) -> str:
    """The ``results`` array of a response: ``top`` (best first) with their ``rows`` (each naming its
    ``collection``), and their scores."""
    if len(rows) != len(top):
        raise ValueError(f"{len(top)} hits but {len(rows)} rows")
    dense_of, keyword_of, fused_of, relevance_of, reranked = (page.dense, page.keyword, page.fused, page.relevance,
                                                              page.reranked)
    # Every number of the page in one call of the serializer (a numpy float32 widened, as a float field does):
    # per hit its relevance, score, and the dense, keyword and fused scores (None where it has none).
    scores = []
    for hit in top:
        key = hit.key
        scores += (relevance_of[key], hit.score, dense_of.get(key), keyword_of.get(key), fused_of.get(key))
    numbers = to_json(scores, fallback=float).decode()[1:-1].split(",")
    out = []
    for i, row in enumerate(rows):
        name, at = row["collection"], 5 * i
        fields, span = fragments.of(name, versions[name], row)
        # A stage the hit has no score for is left out (exclude_none), as the model writes it.
        stages = [f'"{stage}":{numbers[at + j]}' for j, stage in ((2, "dense"), (3, "keyword"), (4, "fused"))
                  if scores[at + j] is not None]
        if reranked:
            stages.append(f'"reranked":{numbers[at + 1]}')
        out.append(f'{{"rank":{i + first_rank},{fields},"relevance_score":{numbers[at]},"score":{numbers[at + 1]},'
                   f'"scores":{{{",".join(stages)}}},{span}}}')
    return f'[{",".join(out)}]'
