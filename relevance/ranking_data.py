"""A ranking model's data, Ray-free: each judged query's candidates with their features (the in-process pipeline's
own stages, ``SearchPipeline.ranking_features``), their labels, and the rankings nDCG@10 is judged on.

A candidate is a chunk; its label is the grade of its document. Judgments are per document and a document ranks
at its best chunk (as every figure of this project counts them), so a ranking of chunks is judged as the ranking
of the documents in the order their first chunk appears.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deployments.search.learned import feature_matrix
from index_format.chunk_ids import doc_of
from relevance.metrics import ndcg_at

K = 10


@dataclass
class QueryData:
    """One judged query's candidates, in the order the service ranks them without a model."""

    query_id: str
    text: str
    chunk_ids: list[str]
    columns: dict[str, np.ndarray]
    labels: np.ndarray  # the grade of each candidate's document (0: not judged relevant)

    def matrix(self, names: Sequence[str]) -> np.ndarray:
        return feature_matrix(self.columns, len(self.chunk_ids), names)


def documents_in_order(chunk_ids: Sequence[str], order: Sequence[int] | np.ndarray) -> list[str]:
    """The documents of the candidates taken in ``order``, each at its first (best) chunk."""
    return list(dict.fromkeys(doc_of(chunk_ids[i]) for i in order))


def ndcg_of(queries: Sequence[QueryData], qrels: Mapping[str, Mapping[str, int]],
            scores: Callable[[QueryData], np.ndarray] | None = None, k: int = K) -> float:
    """Mean document-level nDCG@k of the queries' candidates in the order ``scores`` gives them (best first,
    ties in the order before), or in the service's order without a model (None). A query none of whose
    candidates is relevant counts 0, as it does for the service."""
    per_query = ndcg_per_query(queries, qrels, scores, k)
    return sum(per_query.values()) / len(per_query) if per_query else 0.0


def ndcg_per_query(queries: Sequence[QueryData], qrels: Mapping[str, Mapping[str, int]],
                   scores: Callable[[QueryData], np.ndarray] | None = None, k: int = K) -> dict[str, float]:
    """``ndcg_of``'s figure for each query, by query id (what the activation guard compares pairwise)."""
    out = {}
    for q in queries:
        order = (np.arange(len(q.chunk_ids)) if scores is None
                 else np.argsort(-scores(q), kind="stable"))
        out[q.query_id] = ndcg_at(documents_in_order(q.chunk_ids, order), qrels[q.query_id], k)
    return out


def collect(pipeline, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], progress=None,
            stand_in: Mapping[str, str] | None = None, **request) -> list[QueryData]:
    """Every query's candidates and features, searched as the service would (``request`` adds search fields,
    e.g. ``rerank: true`` to have the cross-encoder's scores among the features).

    ``stand_in`` (cross-fitting, ``cross_fit_encoders``): a query it names is searched with that named encoder,
    whose cosine stands in for the version's own encoder's, so none of the query's features comes from an
    encoder trained on it; the stand-ins' own columns are dropped from every query."""
    from deployments.edge.schemas import SearchRequest

    stand_in = stand_in or {}
    stand_ins = set(stand_in.values())
    out: list[QueryData] = []

    async def go() -> None:
        for qid, text in queries.items():
            name = stand_in.get(qid)
            table = await pipeline.ranking_features(SearchRequest(query=text, ranking_model=False, encoder=name,
                                                                  **request))
            columns = dict(table.columns)
            if name is not None:  # NaN where its encoder failed, as the version's own would be
                missing = np.full(len(table.hits), np.nan, dtype=np.float32)
                columns["dense"] = columns.get(f"dense_{name}", missing)
                columns["dense_gap"] = columns.get(f"dense_gap_{name}", missing)
            for other in stand_ins:
                columns.pop(f"dense_{other}", None)
                columns.pop(f"dense_gap_{other}", None)
            ids = [h.chunk_id for h in table.hits]
            grades = qrels.get(qid, {})
            labels = np.array([max(0, int(grades.get(doc_of(c), 0))) for c in ids], dtype=np.int32)
            out.append(QueryData(qid, text, ids, columns, labels))
            if progress:
                progress(1)

    asyncio.run(go())
    return out


def cross_fit_encoders(index: str | Path, names: Sequence[str], query_ids: Iterable[str]) -> dict[str, str]:
    """Each query of ``query_ids`` -> the named encoder of ``names`` (held by the version ``index`` serves) that
    was trained without it: each was trained with ``relevance.train_encoder --leave-out-fold K/N``, whose
    ``training.json`` lists the queries it left out. Every query needs one, or the ranker would learn from an
    encoder's score on a query that encoder was trained on (and trust it more than it deserves on new ones)."""
    import json

    from index_format.versions import read_version_manifest, resolve_version_dir

    held = read_version_manifest(resolve_version_dir(index)).encoders
    left_out: dict[str, str] = {}
    for name in names:
        if name not in held:
            raise SystemExit(f"--cross-fit {name}: the version {index} serves holds no encoder of that name "
                             f"(it holds: {', '.join(sorted(held)) or 'none'}; python -m index_build.add_encoder)")
        record = Path(held[name].encoder) / "training.json"
        ids = (json.loads(record.read_text()).get("data", {}).get("left_out_query_ids")
               if record.is_file() else None)
        if ids is None:
            raise SystemExit(f"--cross-fit {name}: its model {held[name].encoder} has no training.json listing "
                             "the queries it left out (train it with relevance.train_encoder --leave-out-fold K/N)")
        for q in ids:
            left_out.setdefault(q, name)
    wanted = list(query_ids)
    missing = [q for q in wanted if q not in left_out]
    if missing:
        raise SystemExit(f"--cross-fit {' '.join(names)}: {len(missing)} of {len(wanted)} training queries were "
                         f"left out by none of them (e.g. {', '.join(missing[:3])}); train one encoder per fold "
                         "with the same N")
    return {q: left_out[q] for q in wanted}


def open_pipeline(index: str | Path, depth: int, reranker: str | None = None):
    """The in-process pipeline over an index (root, URL or version folder) that makes the features, with no model."""
    from deployments.config import RouterSettings
    from deployments.search.inprocess import InProcessReranker, inprocess_pipeline
    from index_format.versions import resolve_version_dir

    scorer = None
    if reranker:
        from deployments.search.reranking import CrossEncoderScorer

        scorer = InProcessReranker(CrossEncoderScorer(reranker, max_length=256))
    settings = RouterSettings(cache_size=0, ranking_depth=depth, rerank_timeout_s=3600, request_timeout_s=3600)
    return inprocess_pipeline({"default": resolve_version_dir(index)}, settings, reranker=scorer)
