"""The learned ranking stage, Ray-free: a gradient-boosted ranker (LightGBM's lambdarank) reorders a collection's
best fused candidates from features the legs, the shards and the cross-encoder give.

The features of a candidate (``FEATURES``; a model reads those it was trained on, by name):

- from the legs, at no cost: ``dense_rank`` and ``keyword_rank`` (1-based; NaN when the leg did not return it),
  ``fused_score`` and ``fused_rank``;
- from the shards that hold the candidates (``deployments.shard.features``): exact BM25 per field, the share of
  the query's terms the chunk holds, the cosine, lengths, the chunk's position in its document;
- relative to the other candidates of the query: ``bm25_share`` (BM25 over the best BM25 among them),
  ``dense_gap`` (the best cosine among them minus this one's), ``doc_chunks`` (candidates of the same document);
- for each named encoder the version holds (``index_build.add_encoder``): ``dense_<name>``, its cosine, and
  ``dense_gap_<name>``, as ``dense_gap``;
- ``rerank``: the cross-encoder's probability, where it scored the candidate (NaN past its depth).

Every column is computed the same way when training (``relevance.train_ranker`` runs this module through the
in-process pipeline) and when serving, so the model sees at serving time what it was trained on. A missing value
is NaN, which the trees route on their own (LightGBM learns where a missing value goes), never a made-up 0.
"""

from __future__ import annotations

import functools
import json
import logging
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from pathlib import Path

import numpy as np

from deployments.edge.schemas import Method
from deployments.search.hits import Hit
from deployments.search.retrieval import Retrieved
from deployments.search.stages import SearchContext, failure, gathered, within
from deployments.shard.features import SHARD_FEATURES, FeatureQuery, merge_features
from index_format.chunk_ids import doc_of

logger = logging.getLogger("ray.serve")
_chunk_id, _score, _slot = itemgetter(0), itemgetter(1), itemgetter(2)  # of a Hit

LEG_FEATURES = ("dense_rank", "keyword_rank", "fused_score", "fused_rank")
RELATIVE_FEATURES = ("bm25_share", "dense_gap", "doc_chunks")
FEATURES = (*LEG_FEATURES, *SHARD_FEATURES, *RELATIVE_FEATURES, "rerank")
# Feature groups as the ablation table names them (``relevance.train_ranker --ablate``): a field's BM25 or an
# encoder's cosine joins its group by prefix.
GROUPS = {
    "legs": LEG_FEATURES,
    "bm25": ("bm25_", "bm25_share"),
    "coverage": ("term_coverage", "idf_coverage"),
    "dense": ("dense", "dense_gap"),
    "lengths": ("length", "title_length", "position", "doc_chunks"),
    "rerank": ("rerank",),
}


def in_group(name: str, group: str) -> bool:
    if group == "dense" and named_encoder_of(name) is not None:
        return True
    return any(name == f or (f.endswith("_") and name.startswith(f)) for f in GROUPS[group])


def named_encoder_of(feature: str) -> str | None:
    """The named encoder a feature comes from (``dense_<name>``, ``dense_gap_<name>``), else None."""
    if feature in FEATURES or not feature.startswith("dense_"):
        return None
    return feature.removeprefix("dense_gap_") if feature.startswith("dense_gap_") else feature.removeprefix("dense_")


@dataclass
class FeatureTable:
    """One row per candidate, one column per feature, in the candidates' order."""

    hits: list[Hit]
    columns: dict[str, np.ndarray] = field(default_factory=dict)

    def matrix(self, names: Sequence[str]) -> np.ndarray:
        return feature_matrix(self.columns, len(self.hits), names)


def feature_matrix(columns: Mapping[str, np.ndarray], n: int, names: Sequence[str]) -> np.ndarray:
    """The ``columns`` named by ``names`` as an n x len(names) float64 matrix (LightGBM's own dtype: no copy
    there), NaN for a column absent."""
    out = np.full((n, len(names)), np.nan)
    for j, name in enumerate(names):
        column = columns.get(name)
        if column is not None:
            out[:, j] = column
    return out


def leg_ranks(hits: Sequence[Hit], pool: Sequence[Hit]) -> np.ndarray:
    """Each of ``pool``'s rank (1-based) in ``hits``, NaN where absent; both of one collection, so a chunk id is a
    key (no tuple made per hit, and the loops in C: this runs over every leg hit of every query a model ranks)."""
    rank = dict(zip(map(_chunk_id, hits), range(1, len(hits) + 1), strict=True))
    return np.fromiter(map(rank.get, map(_chunk_id, pool), repeat(np.nan)), dtype=np.float32, count=len(pool))


def leg_scores(hits: Sequence[Hit], pool: Sequence[Hit]) -> np.ndarray:
    score = dict(zip(map(_chunk_id, hits), map(_score, hits), strict=True))
    return np.fromiter(map(score.get, map(_chunk_id, pool), repeat(np.nan)), dtype=np.float32, count=len(pool))


def relative(columns: dict[str, np.ndarray], pool: Sequence[Hit]) -> None:
    """The features that compare a candidate with the query's other candidates (``RELATIVE_FEATURES``)."""
    bm25 = columns["bm25_contents"]
    best = np.fmax.reduce(bm25, initial=np.nan)  # the largest that is not NaN (NaN when none is)
    columns["bm25_share"] = bm25 / best if best > 0 else np.zeros_like(bm25)
    for name in [n for n in columns if n == "dense" or named_encoder_of(n) is not None and
                 not n.startswith("dense_gap")]:
        dense = columns[name]
        gap = "dense_gap" if name == "dense" else f"dense_gap_{name.removeprefix('dense_')}"
        columns[gap] = np.fmax.reduce(dense, initial=np.nan) - dense  # NaN where the cosine is
    docs = list(map(doc_of, map(_chunk_id, pool)))
    counts = Counter(docs)
    columns["doc_chunks"] = np.fromiter(map(counts.__getitem__, docs), dtype=np.float32, count=len(docs))


@functools.lru_cache(maxsize=64)  # a served model asks with the same names every query
def shard_names(names: tuple[str, ...] | None) -> frozenset[str] | None:
    """The shards' features a model reading ``names`` needs (the relative ones are made from theirs)."""
    if names is None:
        return None
    made_from = {"bm25_share": "bm25_contents", "dense_gap": "dense"}
    made_from |= {n: f"dense_{named_encoder_of(n)}" for n in names if n.startswith("dense_gap_")}
    return frozenset(names) | {made_from[n] for n in names if n in made_from}


async def query_vectors(ctx: SearchContext, target, wanted: frozenset[str] | None) -> tuple[object, dict]:
    """The query's vector under the version's own encoder (None where not wanted) and under each named encoder whose
    cosine is wanted (``wanted`` None: all): the dense leg's vector where the leg searched with that encoder, else
    embedded now, all at once. A keyword search embeds nothing, so its cosines are NaN."""
    searched, leg = ctx.vectors.get(target.name), ctx.req.encoder
    if ctx.req.method is Method.keyword:  # a keyword search embeds nothing for its ranking either: no cosines
        return searched, {}
    sides: list[str | None] = [n for n in target.encoders if wanted is None or f"dense_{n}" in wanted]
    if wanted is None or "dense" in wanted:
        sides.append(None)
    have = {leg: searched} if searched is not None else {}
    # A leg that needed a vector and has none: its encoder just failed (a warning says so); not asked again.
    failed = searched is None
    need = [n for n in sides if n not in have and not (failed and n == leg)]
    got = await within(gathered([target.encoder_for(n).embed(ctx.text) for n in need]),
                       ctx.settings.encoder_timeout_s) if need else []
    have.update(zip(need, got, strict=True))
    return have.get(None), {n: have[n] for n in sides if n is not None and n in have}


def at_slots(slot_of: list[int]) -> dict[int, np.ndarray]:
    """The positions in a pool of the candidates of each shard slot (often one slot holds them all)."""
    if slot_of and slot_of.count(slot_of[0]) == len(slot_of):
        return {slot_of[0]: np.arange(len(slot_of))}
    slots = np.asarray(slot_of, dtype=np.int64)
    return {s: np.flatnonzero(slots == s) for s in np.unique(slots).tolist()}


async def candidate_features(ctx: SearchContext, got: Retrieved, pool: list[Hit],
                             rerank: dict[tuple[str, str], float] | None = None,
                             names: Sequence[str] | None = None) -> FeatureTable:
    """The features of ``pool`` (candidates of one collection): each shard slot asked at once about those it
    holds, under ``shard_timeout_s``; a slot that fails leaves its candidates' shard features NaN. ``names``: only
    what a model reads is asked of the shards (None: everything, as training asks)."""
    target = ctx.targets[0]
    ids = list(map(_chunk_id, pool))
    by_slot = at_slots(list(map(_slot, pool)))
    slots = list(by_slot)
    wanted = shard_names(None if names is None else tuple(names))
    try:
        vector, named = await query_vectors(ctx, target, wanted)
    except Exception as exc:  # noqa: BLE001 - the cosines are NaN, as where the query encoder failed for the leg
        vector, named = ctx.vectors.get(target.name) if ctx.req.encoder is None else None, {}
        ctx.work.warnings.append(f"ranking features: a query encoder {failure(exc)}; its cosines left out")
    calls = [within(target.slot(s).features(FeatureQuery(ctx.text, ids if len(at) == len(ids) else [ids[i] for i in at],
                                                         vector, wanted, named)), ctx.settings.shard_timeout_s)
             for s, at in by_slot.items()]
    answers = await gathered(calls, return_exceptions=True)
    failed = [target.slot(s).name for s, a in zip(slots, answers, strict=True) if isinstance(a, BaseException)]
    if failed:
        ctx.work.warnings.append(f"ranking features: shards {', '.join(failed)} did not answer; their candidates "
                                 "were ranked without their shard features")
    parts = [(by_slot[s], a) for s, a in zip(slots, answers, strict=True) if not isinstance(a, BaseException)]
    columns = merge_features(len(pool), parts)
    dense, keyword = got.legs[target.name]
    columns["dense_rank"] = leg_ranks(dense, pool)
    columns["keyword_rank"] = leg_ranks(keyword, pool)
    if got.fused[:len(pool)] == pool:  # the fused order's head, as served and trained: ranks are positions
        columns["fused_score"] = np.fromiter(map(_score, pool), dtype=np.float32, count=len(pool))
        columns["fused_rank"] = np.arange(1, len(pool) + 1, dtype=np.float32)
    else:
        columns["fused_score"] = leg_scores(got.fused, pool)
        columns["fused_rank"] = leg_ranks(got.fused, pool)
    relative(columns, pool)
    columns["rerank"] = (np.array([rerank.get(h.key, np.nan) for h in pool], dtype=np.float32) if rerank
                         else np.full(len(pool), np.nan, dtype=np.float32))
    return FeatureTable(list(pool), columns)


class RankingModel:
    """A trained ranker as served: its id, the features it reads (in its order), LightGBM's booster and the same
    trees compiled to machine code (``compiled_trees``), which score a query's 200 candidates about five times
    faster than the booster's ``predict`` (bench/README.md, "A ranking model"); where compiling fails, the
    booster scores, with a warning in the log."""

    def __init__(self, model_id: str, features: Sequence[str], model_text: str):
        import lightgbm

        self.id = model_id
        self.features = list(features)
        self.booster = lightgbm.Booster(model_str=model_text)
        if self.booster.num_feature() != len(self.features):
            raise ValueError(f"ranking model {model_id!r} reads {self.booster.num_feature()} features; its "
                             f"description names {len(self.features)}")
        self.compiled = compiled_trees(model_id, model_text)

    @classmethod
    def from_files(cls, model_id: str, description: bytes | str, model_text: bytes | str) -> RankingModel:
        meta = json.loads(description)
        text = model_text.decode() if isinstance(model_text, bytes) else model_text
        return cls(model_id, meta["features"], text)

    def score(self, table: FeatureTable) -> np.ndarray:
        if not table.hits:
            return np.zeros(0)
        matrix = table.matrix(self.features)
        if self.compiled is not None:
            return self.compiled.predict(matrix, n_jobs=1)
        return np.asarray(self.booster.predict(matrix, num_threads=1), dtype=np.float64)


def compiled_trees(model_id: str, model_text: str):
    """The model's trees compiled to native code by lleaves (LLVM), in double precision: the same scores as
    LightGBM's ``predict`` (to rounding; NaN routed as the trees say), or None, logged, where it cannot compile."""
    try:
        import lleaves

        with tempfile.TemporaryDirectory() as folder:  # lleaves reads the trees from a file
            path = Path(folder) / "model.txt"
            path.write_text(model_text, encoding="utf-8")
            compiled = lleaves.Model(model_file=str(path))
            compiled.compile()
        return compiled
    except Exception as exc:  # noqa: BLE001 - the booster scores the same, slower
        logger.warning("ranking model %s: its trees did not compile (%s: %s); LightGBM's predict scores it",
                       model_id, type(exc).__name__, exc)
        return None


def reordered(pool: list[Hit], scores: np.ndarray) -> list[Hit]:
    """The pool by the model's scores, best first; ties keep the order before (a stable sort)."""
    values, make = scores.tolist(), Hit._make  # (``_make`` skips the keyword handling of ``Hit(...)``)
    return [make((hit[0], values[i], hit[2], hit[3])) for i in np.argsort(-scores, kind="stable").tolist()
            for hit in (pool[i],)]
