"""What a shard tells a ranking model about given candidates: the features it holds the data for, computed
for a few hundred chunks of one query (``ShardGroup.features``), never for the whole shard.

The router asks each shard slot about the candidates it holds after fusion (``deployments.search.learned``),
so a candidate the keyword leg did not return still gets its exact BM25, and one the dense leg did not
return its cosine: a learned ranker must not read "absent from a leg" as "scored 0". Each feature is one
float per candidate, NaN where it cannot be had (no query vector, a chunk this shard does not hold).

- ``bm25_<field>``: corpus-exact BM25 of the field (the same score the keyword leg gives, restricted to the
  candidates by a filter clause); ``contents`` is title + text as indexed.
- ``term_coverage``, ``idf_coverage``: the share of the query's distinct analyzed terms the chunk holds,
  plain and weighted by each term's corpus idf. BM25 sums evidence; coverage says how much of the
  question the chunk speaks to.
- ``dense``: cosine of the chunk's stored vector with the query's; ``dense_<name>``: the same for each named
  encoder the version holds (``index_build.add_encoder``), given the query's vector under it.
- ``length``, ``title_length``: words in the chunk's text and its title; ``position``: the chunk's index
  within its document (a document's opening chunk carries its title and abstract).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from deployments.shard.lucene import FactsReader
from index_format.bm25_stats import lucene_idf

SHARD_FEATURES = ("bm25_contents", "term_coverage", "idf_coverage", "dense", "length", "title_length", "position")
COVERAGE = ("term_coverage", "idf_coverage")
# What the shards read from the postings, in one pass (``FactsReader``): a model that reads none of these costs none.
FROM_POSTINGS = ("bm25_", *COVERAGE)


@dataclass(frozen=True, eq=False)
class FeatureQuery:
    """What a shard is asked: the query as searched, its vector (None: no dense feature), the candidates, and the
    features wanted (None: all; a served model asks for those it reads, so the others cost nothing)."""

    text: str
    chunk_ids: list[str]
    vector: np.ndarray | None = None
    names: frozenset[str] | None = None
    vectors: dict[str, np.ndarray] = field(default_factory=dict)  # the query under each named encoder

    @functools.cached_property
    def reads_postings(self) -> bool:
        """Whether the shards read the postings for it (``FROM_POSTINGS``): else its features make no Lucene call."""
        return self.wants(*FROM_POSTINGS)

    def wants(self, *names: str) -> bool:
        return self.names is None or any(n in self.names or (n.endswith("_") and any(m.startswith(n) for m in
                                                                                   self.names)) for n in names)


def reads_postings(features: Sequence[str]) -> bool:
    """Whether the shards read the postings for a model reading ``features`` (``bm25_share`` is made from
    ``bm25_contents``, so it counts too)."""
    return FeatureQuery("", [], names=frozenset(features)).reads_postings


def empty_features(n: int) -> dict[str, np.ndarray]:
    """``SHARD_FEATURES`` for ``n`` candidates, all NaN: rows of one block, allocated once."""
    return dict(zip(SHARD_FEATURES, np.full((len(SHARD_FEATURES), n), np.nan, dtype=np.float32), strict=True))


def words(texts: Sequence[str | None]) -> np.ndarray:
    return np.fromiter((len(t.split()) if t else 0 for t in texts), dtype=np.float32, count=len(texts))


def position_of(chunk_id: str) -> float:
    try:
        return float(chunk_id.rsplit("#", 1)[1])
    except (IndexError, ValueError):
        return np.nan


def coverage(held: np.ndarray, idf: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(share of the distinct terms each candidate holds, the same weighted by each term's idf) from ``held``: one
    row per candidate, one column per distinct term, nonzero where the candidate holds the term."""
    if held.shape[1] == 0:
        return np.zeros(len(held), dtype=np.float32), np.zeros(len(held), dtype=np.float32)
    held = held.astype(np.float32)
    weights = np.asarray(idf, dtype=np.float32)
    total = float(weights.sum())
    plain = held.mean(axis=1)
    weighted = (held @ weights) / total if total > 0 else plain
    return plain.astype(np.float32), weighted.astype(np.float32)


def held_of_bits(bits: np.ndarray, terms: int) -> np.ndarray:
    """``coverage``'s ``held`` from each candidate's bits (``FactsReader.read``: bit i set when it holds term i)."""
    return np.unpackbits(np.asarray(bits, dtype="<u8").view(np.uint8).reshape(len(bits), 8), axis=1, count=terms,
                         bitorder="little")


def held_by_rows(chunk_ids: Sequence[str], row_of: dict[str, int]) -> tuple[list[int], np.ndarray]:
    """(positions in ``chunk_ids`` of the candidates a shard or segment holds, their rows there)."""
    at = [i for i, c in enumerate(chunk_ids) if c in row_of]
    return at, np.array([row_of[chunk_ids[i]] for i in at], dtype=np.int64)


def candidates_features(services: Sequence, reader: FactsReader | None, query: FeatureQuery,
                        located: Sequence[tuple[np.ndarray, np.ndarray]], terms: list[str]) -> dict[str, np.ndarray]:
    """The features of ``query.chunk_ids`` (NaN for those no service holds) from ``services``, shards of one version
    whose postings ``reader`` reads (None: the query wants nothing from them): ``located`` gives, for each, the
    positions of the candidates it holds and their rows there; ``terms``, the query as their one analyzer makes it.
    The shards' postings are read in one call into the JVM, their vectors and rows each from its own; what does not
    depend on the shard (the distinct terms, their corpus idf, the coverage arithmetic) is done once."""
    n = len(query.chunk_ids)
    out = empty_features(n)
    busy = [(service, at, rows) for service, (at, rows) in zip(services, located, strict=True) if len(at)]
    if not busy:
        return out
    fields = [f for f in reader.names if query.wants(f"bm25_{f}")] if reader is not None else []
    want_coverage = reader is not None and query.wants(*COVERAGE)
    distinct = sorted(set(terms))[:64] if want_coverage else []
    held = np.concatenate([at for at, _ in located])
    if fields or want_coverage:
        # The wanted fields' BM25 and which distinct terms each holds, in one pass and one call (``FactsReader``).
        corpus = busy[0][0].lucene
        idf = [lucene_idf(corpus.corpus.doc_count, int(corpus.corpus_df.get(t, 0))) for t in distinct]
        facts = reader.read([rows for _, rows in located], terms if fields else [], distinct, idf, fields)
        for field, scores in facts.fields.items() if fields else ():
            out.setdefault(f"bm25_{field}", np.full(n, np.nan, dtype=np.float32))[held] = scores
        if want_coverage:
            out["term_coverage"][held], out["idf_coverage"][held] = (
                facts.coverage or coverage(held_of_bits(facts.masks, len(distinct)), idf))
    vector = np.asarray(query.vector, dtype=np.float32) if query.vector is not None and query.wants("dense") else None
    named = {name: np.asarray(v, dtype=np.float32) for name, v in query.vectors.items() if query.wants(f"dense_{name}")}
    for service, at, rows in busy:
        if vector is not None:
            out["dense"][at] = service.embeddings[rows] @ vector
        for name, v in named.items():
            if name in service.named:
                column = out.setdefault(f"dense_{name}", np.full(n, np.nan, dtype=np.float32))
                column[at] = np.asarray(service.named[name].vectors[rows], dtype=np.float32) @ v
        text_words, title_words, positions = service.row_facts()
        out["length"][at] = text_words[rows]
        out["title_length"][at] = title_words[rows]
        out["position"][at] = positions[rows]
    return out


def merge_features(n: int, parts: list[tuple[list[int], dict[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """One table for ``n`` candidates from several shards' answers, each about the candidates at its positions."""
    if len(parts) == 1 and len(parts[0][0]) == n:  # one answer about all of them, in order: its columns as they are
        return empty_features(n) | parts[0][1]
    out = empty_features(n)
    for at, features in parts:
        for name, values in features.items():
            column = out.setdefault(name, np.full(n, np.nan, dtype=np.float32))
            column[at] = values
    return out
