"""Answers and their citations: what the attribution check finds in the answers each engine writes.

SciFact test queries are searched in-process over a built index (hybrid, ``limit`` results), and an
answer is written from the results by the extractive engine (every query) and by a generative model
(``--generative-queries`` of them; SmolLM2-135M by default, the model the demo used to deploy). For each
engine: ms per answer, sentences per answer, the share of sentences a returned result supports, the
share of citations that name a document the qrels judge relevant to the query, and what the service's
check changed: markers kept, removed (not supporting, or naming no result), added to bare sentences.

    python -m bench.answers --data ../shared/data --index bench/out/indexes/scifact-3
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from bench.common import load_beir, machine, write_record


def summarize(answers: list[dict], ms: list[float], relevant: list[set[str]]) -> dict:
    """``relevant``: per answer, the documents the qrels judge relevant to its query."""
    sentences = [s for a in answers for s in a["sentences"]]
    cited = [(c["doc_id"], judged) for a, judged in zip(answers, relevant, strict=True) for c in a["citations"]]
    return {
        "answers": len(answers),
        "ms_per_answer_mean": round(sum(ms) / len(ms), 1) if ms else None,
        "sentences_per_answer": round(len(sentences) / len(answers), 2) if answers else None,
        "sentences_supported_share": round(sum(s["supported"] for s in sentences) / len(sentences), 4)
        if sentences else None,
        "answers_all_supported_share": round(sum(all(s["supported"] for s in a["sentences"]) for a in answers)
                                             / len(answers), 4) if answers else None,
        "citations_kept_or_added": sum(len(a["citations"]) for a in answers),
        "citations_relevant_share": round(sum(d in judged for d, judged in cited) / len(cited), 4) if cited else None,
        "answers_citing_a_relevant_document_share": round(
            sum(any(c["doc_id"] in judged for c in a["citations"]) for a, judged in zip(answers, relevant, strict=True))
            / len(answers), 4) if answers else None,
        "citations_added_by_check": sum(len(a["added_citations"]) for a in answers),
        "markers_removed_by_check": sum(len(a["removed_citations"]) for a in answers),
        "example": answers[0]["text"][:600] if answers else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.answers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--dataset", default="scifact")
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--queries", type=int, default=50, help="test queries answered by the extractive engine")
    ap.add_argument("--generative-model", default="smollm2")
    ap.add_argument("--generative-queries", type=int, default=50,
                    help="of those, how many the generative model answers (about 15 s each on 2 cores)")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--out", type=Path, default=Path("bench/results/answers.json"))
    args = ap.parse_args(argv)

    from deployments.config import RouterSettings, SynthesisConfig
    from deployments.edge.schemas import SearchRequest
    from deployments.search.inprocess import inprocess_pipeline
    from deployments.synthesis.service import SynthesisService

    queries, qrels = load_beir(args.data / args.dataset)
    qids = list(queries)[: args.queries]
    texts = [queries[q] for q in qids]
    relevant = [{d for d, grade in qrels[q].items() if grade > 0} for q in qids]
    pipeline = inprocess_pipeline({"default": args.index}, RouterSettings(cache_size=0))

    async def results_of(q: str) -> list[dict]:
        return [r.model_dump() for r in (await pipeline.search(SearchRequest(query=q, limit=args.limit))).results]

    results = [asyncio.run(results_of(q)) for q in texts]
    record: dict = {"machine": machine(), "index": str(args.index), "limit": args.limit, "queries": len(qids),
                    "engines": {}}
    engines = [("extractive", SynthesisConfig(enabled=True), len(texts)),
               (args.generative_model, SynthesisConfig(enabled=True, model=args.generative_model, threads=2,
                                                       num_cpus=2, max_new_tokens=args.max_new_tokens),
                args.generative_queries)]
    for name, cfg, n in engines:
        if n <= 0:
            continue
        service = SynthesisService(cfg)
        answers, ms = [], []
        for q, res in zip(texts[:n], results[:n], strict=True):
            t = time.perf_counter()
            answers.append(service.answer(q, res))
            ms.append((time.perf_counter() - t) * 1000)
        record["engines"][name] = summarize(answers, ms, relevant[:n])
        print(name, record["engines"][name], flush=True)
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
