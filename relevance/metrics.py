"""Retrieval metrics, Ray-free, computed the way trec_eval (and so ir_measures) computes them.

A run maps a query id to documents with scores; qrels map a query id to graded judgments. A document
is relevant when its grade is at least 1. Means are over every judged query; one the run did not
answer counts 0, as in ir_measures (trec_eval -c). Context precision and recall judge the chunks a RAG prompt would get: the
share of the returned chunks that come from relevant documents, and the share of relevant documents
that at least one returned chunk covers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def ranked(scores: Mapping[str, float]) -> list[str]:
    """trec_eval's order: score descending, ties by document id descending."""
    return [d for d, _ in sorted(scores.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]


def ndcg_at(docs: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    dcg = sum(max(judged.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(docs[:k]))
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(docs: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    relevant = {d for d, g in judged.items() if g >= 1}
    return len(relevant.intersection(docs[:k])) / len(relevant) if relevant else 0.0


def rr_at(docs: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    for i, d in enumerate(docs[:k]):
        if judged.get(d, 0) >= 1:
            return 1.0 / (i + 1)
    return 0.0


def context_precision(chunk_docs: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    """Share of the first k returned chunks whose document is judged relevant."""
    top = chunk_docs[:k]
    return sum(judged.get(d, 0) >= 1 for d in top) / len(top) if top else 0.0


def context_recall(chunk_docs: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    """Share of the relevant documents that at least one of the first k returned chunks comes from."""
    relevant = {d for d, g in judged.items() if g >= 1}
    return len(relevant.intersection(chunk_docs[:k])) / len(relevant) if relevant else 0.0


def evaluate(run: Run, qrels: Qrels, chunk_runs: Mapping[str, Sequence[str]] | None = None,
             k: int = 10, recall_k: int = 100) -> dict[str, float]:
    """Mean nDCG@k, R@recall_k, RR@k over the judged queries; with ``chunk_runs`` (query id -> the
    document of each returned chunk, in order), context precision and recall at k too."""
    names = [f"nDCG@{k}", f"R@{recall_k}", f"RR@{k}"]
    sums = dict.fromkeys(names, 0.0)
    if chunk_runs is not None:
        sums |= {f"context_precision@{k}": 0.0, f"context_recall@{k}": 0.0}
    n = 0
    for qid, judged in qrels.items():
        n += 1
        docs = ranked(run.get(qid, {}))
        sums[names[0]] += ndcg_at(docs, judged, k)
        sums[names[1]] += recall_at(docs, judged, recall_k)
        sums[names[2]] += rr_at(docs, judged, k)
        if chunk_runs is not None:
            chunks = chunk_runs.get(qid, [])
            sums[f"context_precision@{k}"] += context_precision(chunks, judged, k)
            sums[f"context_recall@{k}"] += context_recall(chunks, judged, k)
    return {name: total / n if n else 0.0 for name, total in sums.items()} | {"queries": n}
