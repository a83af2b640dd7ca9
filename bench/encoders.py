"""Encoders side by side: nDCG@10 and R@100 of each index's own encoder (with the prompts its manifest records) on a
BEIR test split, dense alone and in hybrid search, and where its cosine scores sit.

Each index is searched in-process with the service's own pipeline (``bench.learned.run_queries``: cache off,
``limit`` 100, a document ranked at its best chunk). Rows: keyword (the same BM25 in every index: a check that only
the encoder differs), vector, hybrid with the service's default fusion (weighted 0.5/0.5 over min-max normalized
scores, per query and per leg) and hybrid RRF (k = 60). Nothing is tuned here: every setting is the service's
default or the literature's. The score band is the vector leg's raw cosine of the 1st and the 10th result,
averaged over the queries: a narrow band changes absolute thresholds, not a min-max normalized fusion.

    python -m bench.encoders --data /work/shared/data --dataset scifact \\
        --index minilm=/work/out/idx/scifact-3 --index e5=/work/out/enc/scifact-e5-3
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from bench.common import load_beir, machine, write_record
from bench.learned import run_queries
from relevance.metrics import evaluate

CONFIGS = {
    "keyword": {"method": "keyword"},
    "vector": {"method": "vector"},
    "hybrid weighted 0.5/0.5 (default)": {"method": "hybrid"},
    "hybrid rrf k=60": {"method": "hybrid", "fusion": "rrf", "rrf_k": 60},
}


def score_band(pipeline, queries: dict[str, str]) -> dict[str, float]:
    """Mean raw cosine of the vector leg's 1st and 10th result."""
    from deployments.edge.schemas import SearchRequest

    firsts, tenths = [], []

    async def go():
        for text in queries.values():
            response = await pipeline.search(SearchRequest(query=text, limit=10, method="vector",
                                                           include_citations=False, rerank=False, ranking_model=False))
            scores = [r.score for r in response.results]
            firsts.append(scores[0])
            tenths.append(scores[-1])

    asyncio.run(go())
    return {"cosine_1st": round(sum(firsts) / len(firsts), 4), "cosine_10th": round(sum(tenths) / len(tenths), 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.encoders", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--dataset", default="scifact")
    ap.add_argument("--split", default="test")
    ap.add_argument("--index", action="append", required=True, metavar="LABEL=PATH")
    ap.add_argument("--out", type=Path, default=Path("bench/results/encoders.json"))
    args = ap.parse_args(argv)

    from deployments.config import RouterSettings
    from deployments.search.inprocess import inprocess_pipeline
    from index_format.versions import read_version_manifest, resolve_version_dir

    queries, qrels = load_beir(args.data / args.dataset, args.split)
    judged = {q: qrels[q] for q in queries}
    record: dict = {"machine": machine(), "dataset": args.dataset, "split": args.split, "queries": len(queries),
                    "rows": []}
    for spec in args.index:
        label, path = spec.split("=", 1)
        manifest = read_version_manifest(resolve_version_dir(Path(path)))
        about = {"index": label, "path": path, "version": manifest.version, "encoder": manifest.encoder,
                 "query_prompt": manifest.query_prompt, "document_prompt": manifest.document_prompt}
        pipeline = inprocess_pipeline({"default": Path(path)}, RouterSettings(cache_size=0, request_timeout_s=3600))
        band = score_band(pipeline, queries)
        for config, request in CONFIGS.items():
            t = time.perf_counter()
            run, _ = run_queries(pipeline, queries, rerank=False, ranking_model=False, **request)  # encoders alone
            row = about | {"config": config, **evaluate(run, judged), "seconds": round(time.perf_counter() - t, 1)}
            record["rows"].append(row | (band if config == "vector" else {}))
            print(record["rows"][-1], flush=True)
    write_record(args.out, record)
    print("| index | encoder | prompts (query / document) | config | nDCG@10 | R@100 | cosine 1st / 10th |\n"
          "|---|---|---|---|---|---|---|")
    for r in record["rows"]:
        band = f"{r['cosine_1st']:.3f} / {r['cosine_10th']:.3f}" if "cosine_1st" in r else "-"
        print(f"| {r['index']} | {r['encoder']} | {r['query_prompt']!r} / {r['document_prompt']!r} | {r['config']} | "
              f"{r['nDCG@10']:.4f} | {r['R@100']:.4f} | {band} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
