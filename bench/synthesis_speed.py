"""Synthesis speed: tokens/s of the answer writer on a RAG prompt (sources from a BEIR corpus).

Measured through the product's own engine and prompt (``TransformersEngine`` + ``Synthesizer``):
time to the whole answer, completion tokens per second of that time, and decode tokens/s with the
prompt's prefill subtracted (a 1-token generation of the same prompt).

``--random-weights-from DIR`` builds the model from a folder holding only a config and a tokenizer,
with random weights: the speed of an architecture where its weights cannot be carried (the GPU run).
Random weights rarely stop early, but the completion is counted as produced, whatever its length.

    python -m bench.synthesis_speed --data ../shared/data/scifact --queries 5
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import machine, write_record


def random_model(config_dir: Path) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    out = tempfile.mkdtemp(prefix="random-llm-")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(config_dir).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="BEIR folder: queries and passages for the prompts")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--random-weights-from", type=Path, help="config + tokenizer folder; random weights")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--queries", type=int, default=5)
    ap.add_argument("--sources", type=int, default=6)
    ap.add_argument("--source-chars", type=int, default=600)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import torch

    from deployments.synthesis.core import Synthesizer
    from deployments.synthesis.prompts import build_messages
    from deployments.synthesis.sources import Source, cut_text
    from deployments.synthesis.transformers_engine import TransformersEngine

    model = random_model(args.random_weights_from) if args.random_weights_from else args.model
    t = time.perf_counter()
    engine = TransformersEngine(model, device=args.device, dtype=args.dtype, threads=args.threads)
    load_s = time.perf_counter() - t
    synth = Synthesizer(engine, args.max_new_tokens)
    sync = torch.cuda.synchronize if engine.device == "cuda" else (lambda: None)

    rng = random.Random(0)
    with open(args.data / "queries.jsonl") as f:
        queries = [json.loads(line)["text"] for line in f]
    with open(args.data / "corpus.jsonl") as f:
        docs = [json.loads(line) for line in f]
    rows = []
    synth.answer("warm up", [Source(1, "c", "d", "t", "text")], 8)
    for q in rng.sample(queries, args.queries):
        sources = [Source(i + 1, d["_id"], d["_id"], d.get("title", ""), cut_text(d["text"], args.source_chars))
                   for i, d in enumerate(rng.sample(docs, args.sources))]
        sync()
        t = time.perf_counter()
        engine.generate(build_messages(q, sources), 1)
        sync()
        prefill_s = time.perf_counter() - t
        t = time.perf_counter()
        answer = synth.answer(q, sources)
        sync()
        total_s = time.perf_counter() - t
        decode_s = max(total_s - prefill_s, 1e-9)
        rows.append({"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
                     "total_s": round(total_s, 3), "prefill_s": round(prefill_s, 3),
                     "tokens_per_s": round(answer.completion_tokens / total_s, 1),
                     "decode_tokens_per_s": round(max(answer.completion_tokens - 1, 0) / decode_s, 1)})
        print(rows[-1], flush=True)
    result = {
        "machine": machine(), "model": args.model if not args.random_weights_from else
        f"{args.random_weights_from.name} (random weights)", "engine": "transformers", "device": engine.device,
        "dtype": engine.dtype, "threads": torch.get_num_threads(), "load_s": round(load_s, 1), "rows": rows,
        "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
        "median_decode_tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in rows),
        "median_prompt_tokens": statistics.median(r["prompt_tokens"] for r in rows),
    }
    if engine.device == "cuda":
        result["machine"]["gpu"] = torch.cuda.get_device_name(0)
    if args.out:
        write_record(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
