"""GPU check: what one GPU buys each stage that can use it, measured in one run with the project's own code
against the same code on the same machine's CPU cores.

Five sections, each timed on the GPU and on the CPU, with an agreement check between the two:
1. build embedding: chunks/s of MiniLM through ``SentenceTransformerEncoder.encode`` (what the index build
   calls) at float32 and float16, batch 64 to 1024, on chunks of 128 words (the default chunking);
2. query encoding: ms per call at batch 1 and 32, GPU torch against CPU torch and the CPU query path (ONNX);
3. the reranker stage: pairs/s through ``CrossEncoderScorer`` at its default batching, passages recurring
   across requests as in serving (first pass against warm token cache);
4. exact dense search: ms per query through ``TorchDenseShard`` over 1M and 10M random unit rows, its top-200
   against the CPU's, beside three ways of scoring in float32 that the shard could adopt;
5. one training step of the encoder (MultipleNegativesRankingLoss, as relevance.train_encoder) and of the
   cross-encoder (its listwise loss, as relevance.train_reranker).
The machine has no data: every text is synthetic, English-like word streams drawn from the model's own
vocabulary (seeded), which is what throughput depends on (token counts), not what relevance depends on.

The GPU machine needs torch, transformers, sentence-transformers, onnxruntime, onnx, tokenizers, safetensors
and numpy; nothing here imports ray, faiss, pyserini or pydantic. The model travels with the tree, its
weights packed at float16 (half the size) and up-cast to float32 at the start of a run:

    python -m bench.gpu_check --pack .gpu_carry/minilm-fp16          # here (make gpu-check-pack)
    # carry .gpu_carry/ with the tree to the GPU machine, then there, from the repository root:
    PYTHONPATH=. python3 -m bench.gpu_check --model .gpu_carry/minilm-fp16 --out OUT   # (make gpu-check)
    python -m bench.gpu_check --dry-run --out /tmp/gpu-check          # tiny sizes on CPU, in seconds

Writes OUT/gpu_check.json (after every section, so a run cut short keeps what it measured) and
OUT/gpu_check.md (one table: GPU and CPU rows side by side, then the checks).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from index_format.process import configure_process

PACK_RECORD = "packed.json"
WEIGHTS = "model.safetensors"
DIM = 384


@dataclass(frozen=True)
class Sizes:
    """How much each section measures. The full sizes fit about 5 minutes on one H100 with 16 CPU cores: the
    CPU sides run fewer items, and every timed loop also stops at its time share (``Clock``)."""

    chunk_words: int = 128  # index_format.chunking.Chunking.chunk_size
    chunks_gpu: int = 8192
    chunks_cpu: int = 384
    batch_sizes: tuple[int, ...] = (64, 128, 256, 512, 1024)
    cpu_batch_sizes: tuple[int, ...] = (64, 128)
    query_batches: tuple[int, ...] = (1, 32)
    latency_calls: int = 50
    warmup_calls: int = 5
    requests: int = 256
    passages_per_request: int = 40
    passage_pool: int = 2000
    passage_words: tuple[int, int] = (150, 210)  # ~200-280 tokens a pair
    cpu_requests: int = 12
    gathered_requests: int = 6  # 240 pairs: what one batch gathers under serve_config's max_batch_pairs (256)
    dense_rows: tuple[int, ...] = (1_000_000, 10_000_000)
    dense_batches: tuple[int, ...] = (1, 64)
    dense_k: int = 200
    dense_calls_gpu: int = 50
    dense_calls_cpu: int = 10
    encoder_batches_gpu: tuple[int, ...] = (32, 64)
    encoder_batch_cpu: int = 32
    reranker_batches_gpu: tuple[int, ...] = (16, 32)  # 16: relevance.train_reranker's default
    reranker_batch_cpu: int = 16
    train_steps: int = 3
    train_warmup: int = 1
    budget_s: dict = field(default_factory=lambda: {
        "embedding": 75, "queries": 50, "reranker": 70, "dense": 150, "training": 75})


DRY_RUN = Sizes(chunk_words=16, chunks_gpu=8, chunks_cpu=4, batch_sizes=(4, 8), cpu_batch_sizes=(4,),
                query_batches=(1, 4), latency_calls=3, warmup_calls=1, requests=4, passages_per_request=5,
                passage_pool=12, passage_words=(8, 16), cpu_requests=2, gathered_requests=2, dense_rows=(2000,),
                dense_batches=(1, 4), dense_calls_gpu=3, dense_calls_cpu=2, encoder_batches_gpu=(2,),
                encoder_batch_cpu=2, reranker_batches_gpu=(2,), reranker_batch_cpu=2, train_steps=1,
                train_warmup=0, budget_s=dict.fromkeys(("embedding", "queries", "reranker", "dense", "training"),
                                                       600))  # a dry run checks the code: nothing is cut short


class Clock:
    """A section's share of the run: timed loops stop when it is spent, so one slow side cannot eat the rest."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def timed_calls(fn: Callable[[], object], calls: int, clock: Clock, share: float = 0.25,
                sync: Callable[[], None] = lambda: None) -> list[float]:
    """Seconds of each call, up to ``calls`` of them but at least one, stopping once they have used ``share``
    of the time the clock has left."""
    stop = time.perf_counter() + max(clock.left(), 0) * share
    out: list[float] = []
    while len(out) < calls and (not out or time.perf_counter() < stop):
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return out


def latency_ms(seconds: list[float]) -> dict:
    ms = sorted(s * 1000 for s in seconds)
    return {"median_ms": round(statistics.median(ms), 3),
            "p90_ms": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 3), "calls": len(ms)}


def row(what: str, device: str, dtype: str, batch: int | None, value: float, unit: str, **detail) -> dict:
    """One line of the table; ``detail`` holds what a reader needs to trust the figure (counts, spreads)."""
    return {"what": what, "device": device, "dtype": dtype, "batch": batch, "value": round(float(value), 4),
            "unit": unit, **detail}


def check(name: str, ok: bool, **detail) -> dict:
    return {"check": name, "ok": bool(ok), **detail}


def speedup(rows: list[dict], what: str, gpu: tuple, label: str, cpu: tuple = ("cpu", None, None)) -> dict:
    """How many times better the GPU row is than the CPU row of the same measure: rates (units per second)
    divide GPU by CPU, times divide CPU by GPU. Keys are (device, dtype, batch); None matches any, and then
    the best matching row is taken."""
    def best(key: tuple) -> dict | None:
        found = [r for r in rows if r["what"] == what and r["value"] > 0 and all(
            k is None or r[f] == k for f, k in zip(("device", "dtype", "batch"), key, strict=True))]
        if not found:
            return None
        rate = found[0]["unit"].endswith("/s")
        return (max if rate else min)(found, key=lambda r: r["value"])

    g, c = best(gpu), best(cpu)
    if g is None or c is None:
        return {"speedup": label, "x": None}
    x = g["value"] / c["value"] if g["unit"].endswith("/s") else c["value"] / g["value"]
    return {"speedup": label, "x": round(x, 1), "gpu": f"{g['dtype']}, batch {g['batch']}",
            "cpu": f"{c['dtype']}, batch {c['batch']}"}


# ---- model: packed at float16 to travel, used at float32 -------------------------------------------------


def commit() -> str:
    """The tree's commit: git's answer, else $GIT_COMMIT (a copied tree has no .git), else unknown."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("GIT_COMMIT") or "unknown"


def _cast_weights(source: Path, target: Path, dtype) -> None:
    """The same tensors with every floating one cast to ``dtype`` (integer buffers such as position ids kept)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(source))
    save_file({k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()},
              str(target), metadata={"format": "pt"})


def pack(out: Path, source: str = "all-MiniLM-L6-v2") -> dict:
    """A copy of the model's sentence-transformers folder with float16 weights: half the bytes (~45 MB), so the
    model can travel with the tree to a machine that lacks its package. Every other file is copied as it is."""
    import torch

    from index_format.encoders import resolve_model_path

    src = Path(resolve_model_path(source))
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns(WEIGHTS, ".gitattributes", "README.md"))
    _cast_weights(src / WEIGHTS, out / WEIGHTS, torch.float16)
    record = {"source": source, "source_folder": str(src), "weights": "float16",
              "source_weights_sha256": hashlib.sha256((src / WEIGHTS).read_bytes()).hexdigest(),
              "packed_at_commit": commit(), "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
    (out / PACK_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return record


def float32_folder(model: Path, work: Path) -> tuple[Path, dict]:
    """The folder the run loads: ``model`` itself when its weights are float32, else a copy up-cast to float32
    (the float32 rows are then the packed model's numbers: the original weights rounded once to float16)."""
    import torch
    from safetensors import safe_open

    with safe_open(str(model / WEIGHTS), framework="pt") as f:
        names = f.keys()  # safe_open is not iterable
        dtypes = {f.get_slice(k).get_dtype() for k in names}
    record = json.loads((model / PACK_RECORD).read_text()) if (model / PACK_RECORD).is_file() else {}
    info = {"folder": str(model), "weights_on_disk": sorted(dtypes), "packed": record}
    if "F16" not in dtypes and "BF16" not in dtypes:
        return model, info | {"run_weights": "float32 as stored"}
    out = work / "model-fp32"
    shutil.copytree(model, out, ignore=shutil.ignore_patterns(WEIGHTS, PACK_RECORD))
    _cast_weights(model / WEIGHTS, out / WEIGHTS, torch.float32)
    return out, info | {"run_weights": "float16 on disk, up-cast to float32 for the run (float32 rows use them)"}


def default_model() -> Path | None:
    try:
        from index_format.encoders import resolve_model_path

        return Path(resolve_model_path("all-MiniLM-L6-v2"))
    except ImportError:  # the model's package is not installed: --model names the packed folder
        return None


# ---- synthetic text ----------------------------------------------------------------------------------------


class Words:
    """English-like text from a WordPiece vocabulary: whole words drawn Zipf-like by their rank in the vocabulary
    (BERT's is roughly in frequency order), some given a suffix piece (``play`` + ``ing``), commas, and
    sentences of 8-20 words. About 1.3 tokens a word, as English prose; seeded, so every run reads the same."""

    def __init__(self, vocab_file: Path, seed: int = 0):
        vocab = vocab_file.read_text(encoding="utf-8").split("\n")
        self.words = [w for w in vocab if w.isascii() and w.isalpha() and len(w) >= 2]
        self.suffixes = [w[2:] for w in vocab if w.startswith("##") and w[2:].isascii() and w[2:].isalpha()
                         and len(w) >= 4]
        weights = np.cumsum(1.0 / (np.arange(len(self.words)) + 20.0))
        self.cdf = weights / weights[-1]
        self.rng = np.random.default_rng(seed)

    def text(self, n_words: int) -> str:
        rng = self.rng
        picks = np.minimum(np.searchsorted(self.cdf, rng.random(n_words)), len(self.words) - 1)
        glued = rng.random(n_words) < 0.15
        suffix = rng.integers(len(self.suffixes), size=n_words)
        comma = rng.random(n_words) < 0.06
        out, left = [], 0
        for i in range(n_words):
            w = self.words[picks[i]] + (self.suffixes[suffix[i]] if glued[i] else "")
            if left == 0:
                w, left = w.capitalize(), int(rng.integers(8, 21))
            left -= 1
            out.append(w + ("." if left == 0 or i == n_words - 1 else "," if comma[i] else ""))
        return " ".join(out)

    def texts(self, n: int, words: int | tuple[int, int]) -> list[str]:
        if isinstance(words, int):
            return [self.text(words) for _ in range(n)]
        return [self.text(int(self.rng.integers(words[0], words[1] + 1))) for _ in range(n)]


def mean_tokens(folder: Path, texts: list[str]) -> float:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return round(float(np.mean([len(e.ids) for e in tok.encode_batch(texts)])), 1)


# ---- the run ----------------------------------------------------------------------------------------------


@dataclass
class Run:
    """What every section needs: where the "GPU" side runs (cpu in a dry run), the float32 model folder, the
    sizes, scratch space and the synthetic words."""

    device: str
    label: str  # the GPU side's device as the table shows it
    model: Path
    sizes: Sizes
    work: Path
    words: Words
    dry_run: bool
    save: Callable[[], None] = lambda: None  # writes what is measured so far (sections call it between parts)

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def gpu_dtype(self, name: str) -> str:
        """Half precisions on the GPU; a dry run's "GPU" side is the CPU, where the reranker refuses them."""
        return name if self.device == "cuda" else "float32"


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def section_embedding(run: Run, clock: Clock, out: dict) -> None:
    """Chunks/s of the build's encoder call, GPU float32 and float16 at each batch size, CPU float32 on fewer
    chunks; vectors of the same chunks compared by cosine."""
    import torch

    from index_format.encoders import SentenceTransformerEncoder

    s = run.sizes
    texts = run.words.texts(max(s.chunks_gpu, s.chunks_cpu), s.chunk_words)
    rows, checks = out["rows"], out["checks"]
    notes = {"texts": f"{len(texts)} synthetic chunks of {s.chunk_words} words",
             "mean_tokens": mean_tokens(run.model, texts[:256]),
             "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "unset")}
    gpu = SentenceTransformerEncoder(str(run.model), device=run.device)
    vectors = {}
    for dtype in ("float32", "float16"):
        if dtype == "float16":
            gpu.model.half()
        gpu.encode(texts[:s.batch_sizes[0]], batch_size=s.batch_sizes[0])  # warm-up: kernels, allocator
        for b in s.batch_sizes:
            if clock.left() <= 0:
                rows.append(row("encode chunks (skipped: out of time)", run.label, dtype, b, 0, "chunks/s"))
                continue
            t = time.perf_counter()
            gpu.encode(texts[:s.chunks_gpu], batch_size=b)
            rows.append(row("encode chunks", run.label, dtype, b, s.chunks_gpu / (time.perf_counter() - t),
                            "chunks/s", chunks=s.chunks_gpu))
            print(f"  {dtype} batch {b}: {rows[-1]['value']:.0f} chunks/s", flush=True)
        vectors[dtype] = gpu.encode(texts[:s.chunks_cpu], batch_size=s.cpu_batch_sizes[0])
        run.save()
    rows.extend(tokenizer_rows(gpu, texts[:s.chunks_gpu], run.label, clock))
    del gpu
    cpu = SentenceTransformerEncoder(str(run.model), device="cpu")
    for b in s.cpu_batch_sizes:  # the first batch size's vectors are the reference
        t = time.perf_counter()
        got = cpu.encode(texts[:s.chunks_cpu], batch_size=b)
        rows.append(row("encode chunks", "cpu", "float32", b, s.chunks_cpu / (time.perf_counter() - t),
                        "chunks/s", chunks=s.chunks_cpu, torch_threads=torch.get_num_threads()))
        vectors.setdefault("cpu", got)
    for dtype in ("float32", "float16"):
        cos = cosines(vectors[dtype], vectors["cpu"])
        checks.append(check(f"{run.label} {dtype} vs cpu float32 vectors (cosine > 0.999)", cos.min() > 0.999,
                            min_cosine=round(float(cos.min()), 6), mean_cosine=round(float(cos.mean()), 6),
                            texts=len(cos)))
    speedups = [speedup(rows, "encode chunks", (run.label, "float32", 64), "build today (float32, batch 64)"),
                speedup(rows, "encode chunks", (run.label, "float16", None), "best float16 batch")]
    out["notes"].update(notes)
    out["speedups"] += speedups


def tokenizer_rows(encoder, texts: list[str], label: str, clock: Clock) -> list[dict]:
    """The CPU work inside every GPU encode: tokenizing alone, on one thread and on all cores, and float16 at
    batch 256 again with the tokenizer on all cores (``make`` exports TOKENIZERS_PARALLELISM=false to every
    command, a build included, and the rows above ran under the caller's setting)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    out = []
    try:
        for parallel in ("false", "true"):
            os.environ["TOKENIZERS_PARALLELISM"] = parallel
            t = time.perf_counter()
            for i in range(0, len(texts), 256):
                preprocess(encoder.model, texts[i:i + 256], "cpu")
            out.append(row(f"tokenize only (TOKENIZERS_PARALLELISM={parallel})", "cpu", "-", 256,
                           len(texts) / (time.perf_counter() - t), "chunks/s", chunks=len(texts)))
        if clock.left() > 0:
            b = 256 if len(texts) >= 256 else len(texts)
            t = time.perf_counter()
            encoder.encode(texts, batch_size=b)
            out.append(row("encode chunks (TOKENIZERS_PARALLELISM=true)", label, "float16", b,
                           len(texts) / (time.perf_counter() - t), "chunks/s", chunks=len(texts)))
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
    return out


def section_queries(run: Run, clock: Clock, out: dict) -> None:
    """ms per encode call of short queries: GPU torch float32 / float16, CPU torch, and the CPU query path
    (ONNX Runtime, one thread, as the service loads it); vectors compared with CPU torch's."""
    from index_format.encoders import OnnxEncoder, SentenceTransformerEncoder, encode_queries

    s = run.sizes
    queries = run.words.texts((s.latency_calls + s.warmup_calls) * max(s.query_batches), (4, 12))
    probe = queries[:max(s.query_batches)]
    rows, checks, vectors = out["rows"], out["checks"], {}
    gpu = SentenceTransformerEncoder(str(run.model), device=run.device)
    for dtype in ("float32", "float16"):
        if dtype == "float16":
            gpu.model.half()
        rows += latency_rows(gpu, queries, run.label, dtype, clock, s)
        vectors[f"{run.label} {dtype}"] = gpu.encode(probe, batch_size=len(probe))
    del gpu
    cpu = SentenceTransformerEncoder(str(run.model), device="cpu")
    rows += latency_rows(cpu, queries, "cpu", "float32 (torch)", clock, s)
    reference = cpu.encode(probe, batch_size=len(probe))
    del cpu
    t = time.perf_counter()
    onnx = OnnxEncoder(str(run.model), threads=1)
    notes = {"onnx_export_and_load_s": round(time.perf_counter() - t, 2), "queries": "synthetic, 4-12 words",
             "mean_tokens": mean_tokens(run.model, probe)}
    rows += latency_rows(onnx, queries, "cpu", "float32 (onnx, 1 thread)", clock, s)
    vectors["cpu onnx"] = onnx.encode(probe, batch_size=len(probe))
    took = timed_calls(lambda: encode_queries(onnx, probe), s.latency_calls, clock, share=0.2)
    rows.append(row("encode_queries (groups of 4, the service's many-query path)", "cpu",
                    "float32 (onnx, 1 thread)", len(probe), latency_ms(took)["median_ms"], "ms/call",
                    **latency_ms(took)))
    for name, got in vectors.items():
        cos = cosines(got, reference)
        checks.append(check(f"{name} vs cpu torch query vectors (cosine > 0.999)", cos.min() > 0.999,
                            min_cosine=round(float(cos.min()), 6)))
    onnx_key = ("cpu", "float32 (onnx, 1 thread)")
    speedups = [speedup(rows, "encode queries", (run.label, "float16", b), f"batch {b}, vs the CPU query path",
                        onnx_key + (b,)) for b in s.query_batches]
    out["notes"].update(notes)
    out["speedups"] += speedups


def latency_rows(encoder, queries: list[str], device: str, dtype: str, clock: Clock, s: Sizes) -> list[dict]:
    """ms per ``encode`` call at each query batch size, a different slice of the queries each call."""
    out = []
    for b in s.query_batches:
        slices = [queries[i:i + b] for i in range(0, len(queries) - b + 1, b)]
        calls = iter(range(10**9))

        def one(b=b, slices=slices, calls=calls):
            encoder.encode(slices[next(calls) % len(slices)], batch_size=b)

        for _ in range(s.warmup_calls):
            one()
        stats = latency_ms(timed_calls(one, s.latency_calls, clock, share=0.1))
        out.append(row("encode queries", device, dtype, b, stats["median_ms"], "ms/call", **stats))
        print(f"  {device} {dtype} batch {b}: {stats['median_ms']:.2f} ms (p90 {stats['p90_ms']:.2f})", flush=True)
    return out


def cross_encoder_folder(model: Path, out: Path) -> Path:
    """MiniLM-L6's body with a new one-logit head (seeded): what relevance.train_reranker starts from, and the
    architecture of a 6-layer cross-encoder. No trained cross-encoder exists offline; speed depends on the
    architecture only, and a pretrained body gives the activations (and so the rounding) of a real model."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(str(model), num_labels=1).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(model)).save_pretrained(str(out))
    return out


def score_tolerance(dtype) -> float:
    """Half a unit in the last place of a score in [0.5, 1) at the forward pass's precision (bfloat16: 2^-9,
    float16: 2^-12), at least 1e-6 (float32 passes of different widths round differently by ~1e-7)."""
    import torch

    return max(torch.finfo(dtype).eps / 4, 1e-6)


def top_k_agreement(ref_scores: np.ndarray, test_rows: np.ndarray, test_scores: np.ndarray, ref_top: np.ndarray,
                    tol: float) -> dict:
    """How one query's top-k from a lower precision matches the reference's, ties allowed.

    ``ref_scores``: the reference score of every candidate (indexed by row); ``ref_top``: the reference top-k,
    best first. Agreement means: every row one list has and the other lacks scores within ``tol`` of the
    reference's k-th score (a near-tie at the cut), no row is ranked above a row whose reference score is
    higher by more than ``tol``, and every returned score is within ``tol`` of the reference's."""
    kth = ref_scores[ref_top[-1]]
    only_test = np.setdiff1d(test_rows, ref_top)
    only_ref = np.setdiff1d(ref_top, test_rows)
    set_ok = bool((ref_scores[only_test] >= kth - tol).all() and (ref_scores[only_ref] <= kth + tol).all())
    along = ref_scores[test_rows]
    inversion = float(np.max(along - np.minimum.accumulate(along))) if len(along) else 0.0
    score_diff = float(np.abs(test_scores - along).max()) if len(along) else 0.0
    return {"exact": bool(np.array_equal(test_rows, ref_top)), "overlap": len(ref_top) - len(only_ref),
            "set_ok": set_ok, "worst_inversion": inversion, "max_score_diff": score_diff,
            "ok": set_ok and inversion <= tol and score_diff <= tol}


def summarize(agreements: list[dict], k: int, tol: float) -> dict:
    return {"queries": len(agreements), "k": k, "tolerance": tol,
            "exact_lists": sum(a["exact"] for a in agreements),
            "mean_overlap": round(float(np.mean([a["overlap"] for a in agreements])), 2),
            "min_overlap": min(a["overlap"] for a in agreements),
            "within_tolerance": sum(a["ok"] for a in agreements),
            "worst_inversion": max(a["worst_inversion"] for a in agreements),
            "max_score_diff": max(a["max_score_diff"] for a in agreements)}


def section_reranker(run: Run, clock: Clock, out: dict) -> None:
    """Pairs/s through the reranker's scorer at its default batching: one request per call and a gathered
    batch (what the Serve deployment hands it under load), first with an empty passage-token cache, then warm;
    GPU at dtype auto (bfloat16) and float16, CPU float32 on fewer requests; top-10s compared."""
    from deployments.search.reranking import CrossEncoderScorer, passage_text

    s = run.sizes
    folder = cross_encoder_folder(run.model, run.work / "cross-encoder")
    pool = [passage_text(t, p) for t, p in zip(run.words.texts(s.passage_pool, (2, 6)),
                                                run.words.texts(s.passage_pool, s.passage_words), strict=True)]
    requests = [(q, [pool[i] for i in run.words.rng.choice(len(pool), s.passages_per_request, replace=False)])
                for q in run.words.texts(s.requests, (4, 12))]
    rows, scores = out["rows"], {}
    for name in ("auto", "float16"):
        if clock.left() <= 0:
            rows.append(row("score pairs (skipped: out of time)", run.label, name, None, 0, "pairs/s"))
            continue
        scorer = CrossEncoderScorer(str(folder), device=run.device, dtype=run.gpu_dtype(name))
        dtype = f"{name} ({str(scorer.dtype).replace('torch.', '')})"
        scorer.score([(q, p) for q, ps in requests[-2:] for p in ps])  # warm-up: kernels, allocator
        rows += scorer_rows(scorer, requests, run.label, dtype, (1, s.gathered_requests), clock)
        scores[dtype] = ([scorer.score([(q, p) for p in ps]) for q, ps in requests[:s.cpu_requests]],
                         score_tolerance(scorer.dtype))
        del scorer
        gc.collect()
    cpu = CrossEncoderScorer(str(folder), device="cpu")
    notes = {"weights": "MiniLM-L6 body + a random (seeded) one-logit head: speed only, scores mean nothing",
             "requests": f"{s.requests} x {s.passages_per_request} passages from a pool of {s.passage_pool}",
             "mean_tokens_per_pair": round(float(np.mean(cpu.token_lengths(
                 [(q, p) for q, ps in requests[:4] for p in ps]))), 1),
             "forward_batch_size": cpu.forward_batch_size, "max_batch_tokens": cpu.max_batch_tokens}
    rows += scorer_rows(cpu, requests[:s.cpu_requests], "cpu", "float32", (1,), clock)
    reference = [cpu.score([(q, p) for p in ps]) for q, ps in requests[:s.cpu_requests]]
    spread = round(float(np.mean([r.std() for r in reference])), 6)
    out["checks"] += [reranker_check(run.label, dtype, got, reference, tol, spread)
                      for dtype, (got, tol) in scores.items()]
    speedups = [speedup(rows, "score pairs, 1 request(s) a call, warm", (run.label, d, None),
                        f"{d}, one request a call, warm cache") for d in scores]
    out["notes"].update(notes)
    out["speedups"] += speedups


def reranker_check(label: str, dtype: str, got: list[np.ndarray], reference: list[np.ndarray], tol: float,
                   spread: float) -> dict:
    agree = []
    for ref, g in zip(reference, got, strict=True):
        top = np.argsort(-g, kind="stable")[:10]
        agree.append(top_k_agreement(ref, top, g[top], np.argsort(-ref, kind="stable")[:10], tol))
    summary = summarize(agree, 10, tol)
    # A random head spreads the scores little, which makes any tolerance wide against the spread: the
    # difference as a share of the spread is the figure that carries over to a trained model.
    return check(f"{label} {dtype} vs cpu float32 scores and top-10", all(a["ok"] for a in agree), **summary,
                 mean_cpu_score_std=spread, max_diff_over_std=round(summary["max_score_diff"] / max(spread, 1e-12), 4))


def scorer_rows(scorer, requests, device: str, dtype: str, gathered: tuple[int, ...], clock: Clock) -> list[dict]:
    """Pairs/s scoring every request, ``per_call`` requests' pairs a call: once after emptying the passage-token
    cache (each passage tokenized once, as for chunks not seen before), once more warm."""
    out = []
    pairs = sum(len(ps) for _, ps in requests)
    for per_call in gathered:
        calls = [[(q, p) for q, ps in requests[i:i + per_call] for p in ps]
                 for i in range(0, len(requests), per_call)]
        scorer.cache.items.clear()
        for cache in ("first pass", "warm"):
            if clock.left() <= 0:
                break
            hits, misses = scorer.cache.hits, scorer.cache.misses
            t = time.perf_counter()
            for c in calls:
                scorer.score(c)
            took = time.perf_counter() - t
            out.append(row(f"score pairs, {per_call} request(s) a call, {cache}", device, dtype, len(calls[0]),
                           pairs / took, "pairs/s", pairs=pairs, token_cache_hits=scorer.cache.hits - hits,
                           token_cache_misses=scorer.cache.misses - misses))
            print(f"  {out[-1]['what']} {device} {dtype}: {out[-1]['value']:.0f} pairs/s", flush=True)
    return out


def unit_rows(n: int, seed: int) -> np.ndarray:
    """``n`` random unit vectors (float32, seeded), drawn in parallel blocks (numpy's generators release the
    GIL): 10M x 384 in seconds rather than a minute."""
    from concurrent.futures import ThreadPoolExecutor

    out = np.empty((n, DIM), dtype=np.float32)
    edges = np.linspace(0, n, max(1, min(os.cpu_count() or 1, n // 4096)) + 1).astype(int)
    streams = np.random.SeedSequence(seed).spawn(len(edges) - 1)

    def fill(i: int) -> None:
        part = out[edges[i]:edges[i + 1]]
        np.random.default_rng(streams[i]).standard_normal(out=part, dtype=np.float32)
        part /= np.linalg.norm(part, axis=1, keepdims=True)

    with ThreadPoolExecutor(len(streams)) as pool:
        list(pool.map(fill, range(len(streams))))
    return out


def fp32_out_top(shard, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidate fix: the same float16 product, written out in float32 by cuBLAS (``torch.mm(..., out_dtype)``,
    CUDA only) instead of rounded to float16 first."""
    torch = shard.torch
    with torch.inference_mode():
        q = torch.from_numpy(queries).to(shard.device, shard.dtype)
        scores = torch.mm(q, shard.vectors.T, out_dtype=torch.float32) if shard.dtype != torch.float32 else \
            q @ shard.vectors.T
        top, rows = torch.topk(scores, k, dim=1)
    return top.cpu().numpy(), rows.cpu().numpy()


def rescored_top(shard, queries: np.ndarray, k: int, exact_rows: np.ndarray | None = None,
                 extra: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Candidate fix on any torch: scan in the shard's dtype for the best k + ``extra``, then score those few
    rows again in float32 and keep the best k: from the shard's own float16 rows (the output's rounding goes,
    the inputs' stays), or from ``exact_rows``, float32 rows in host memory (as ``DenseShard`` refines from its
    stored vectors: exact scores)."""
    torch = shard.torch
    with torch.inference_mode():
        q = torch.from_numpy(queries).to(shard.device, shard.dtype)
        cand = torch.topk(q @ shard.vectors.T, min(k + extra, shard.ntotal), dim=1).indices
        if exact_rows is None:
            scores = torch.einsum("bd,bkd->bk", q.float(), shard.vectors[cand].float())
            top, pos = torch.topk(scores, k, dim=1)
            return top.cpu().numpy(), torch.gather(cand, 1, pos).cpu().numpy()
    cand = cand.cpu().numpy()
    scores = np.einsum("bd,bkd->bk", queries, exact_rows[cand])
    pos = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, pos, axis=1), np.take_along_axis(cand, pos, axis=1)


def section_dense(run: Run, clock: Clock, out: dict) -> None:
    """ms per query of exact search through TorchDenseShard, GPU float16 against CPU float32 through the same
    class, and the GPU's top-k against the CPU's; beside it three ways of scoring in float32 the shard could
    adopt (it stores float16 rows and writes float16 scores, both rounded: see ``fp16_tolerance``)."""
    s = run.sizes
    rows, checks = out["rows"], out["checks"]
    notes = {"vectors": f"random unit rows (seeded), {DIM}-d", "k": s.dense_k,
             "tolerance": "float16 rounding of inputs (2^-10 for unit vectors) + one float16 ulp of the query's "
                          "best score (see fp16_tolerance); exact_lists and overlaps are the raw counts"}
    for n in s.dense_rows:
        if clock.left() < (60 if n >= 5_000_000 else 0):
            rows.append(row(f"search {n:,} rows (skipped: out of time)", run.label, "float16", None, 0, "ms/query"))
            continue
        got_rows, got_checks = dense_scale(run, n, clock)
        rows += got_rows
        checks += got_checks
        run.save()
    speedups = [speedup(rows, f"search {n:,} rows, top {s.dense_k}", (run.label, None, b), f"{n:,} rows, batch {b}",
                        ("cpu", None, b)) for n in s.dense_rows for b in s.dense_batches]
    out["notes"].update(notes)
    out["speedups"] += speedups


def fp16_tolerance(scores: np.ndarray) -> float:
    """How far a float16 inner product of unit vectors may be from the float32 one: each input rounded to
    float16 (unit roundoff u = 2^-11) moves a product v_i q_i by at most 2u |v_i q_i|, and sum |v_i q_i| <= 1 for
    unit vectors, so 2^-10 in all; plus one float16 unit in the last place at the query's best score for the
    output's rounding and the float32 sum's (2^-12 for scores in [0.25, 0.5)). Rows closer than this are ties
    a float16 search cannot order."""
    top = float(np.abs(scores).max())
    return float(2.0 ** -10 + 2.0 ** (np.floor(np.log2(max(top, 2 ** -14))) - 10))


def dense_scale(run: Run, n: int, clock: Clock) -> tuple[list[dict], list[dict]]:
    import torch

    from deployments.shard.dense import TorchDenseShard

    s = run.sizes
    t = time.perf_counter()
    vectors = unit_rows(n, seed=n)
    queries = unit_rows(max(s.dense_batches), seed=n + 1)
    made_s = time.perf_counter() - t
    ids = range(n)  # chunk ids are not read by the search; rows are what is compared
    t = time.perf_counter()
    gpu = TorchDenseShard(vectors, ids, device=run.device, dtype="float16")
    load_s = time.perf_counter() - t
    print(f"  {n:,} rows: made in {made_s:.1f} s, on {run.label} in {load_s:.1f} s", flush=True)
    dtype = str(gpu.dtype).replace("torch.", "")
    what = f"search {n:,} rows, top {s.dense_k}"
    rows = search_rows(gpu, queries, what, run.label, dtype, s.dense_calls_gpu, clock, s)
    answers = {"TorchDenseShard": gpu.search(queries, s.dense_k)}
    variants = (("float32 out (torch.mm out_dtype)", fp32_out_top),
                ("float16 scan + rescore of its float16 rows in float32", rescored_top),
                ("float16 scan + rescore from float32 rows in host memory",
                 lambda shard, q, k: rescored_top(shard, q, k, exact_rows=vectors)))
    for name, fn in variants:
        try:
            for b in s.dense_batches:
                fn(gpu, queries[:b], s.dense_k)
                took = timed_calls(lambda fn=fn, gpu=gpu, b=b: fn(gpu, queries[:b], s.dense_k),
                                   s.dense_calls_gpu if b == 1 else max(2, s.dense_calls_gpu // 5), clock, share=0.05)
                stats = latency_ms(took)
                rows.append(row(f"{what}, {name}", run.label, dtype, b, stats["median_ms"] / b, "ms/query", **stats))
            top, found = fn(gpu, queries, s.dense_k)
            answers[name] = list(zip(found, top, strict=True))
        except Exception as e:  # out_dtype is CUDA-only and recent: record it, keep the section
            rows.append(row(f"{what}, {name} (failed)", run.label, dtype, None, 0, "ms/query",
                            error=f"{type(e).__name__}: {e}"[:300]))
    del gpu
    if run.device == "cuda":
        torch.cuda.empty_cache()
    cpu = TorchDenseShard(vectors, ids, device="cpu")
    reference = cpu.search(queries, s.dense_k)  # also the CPU's warm-up
    rows += search_rows(cpu, queries, what, "cpu", "float32", s.dense_calls_cpu, clock, s, warm=False)
    tolerance = fp16_tolerance if dtype != "float32" else (lambda scores: 1e-6)
    checks = [dense_check(f"{n:,} rows: {run.label} {name} top-{s.dense_k} vs cpu float32", vectors, queries,
                          reference, answer, tolerance, s.dense_k) for name, answer in answers.items()]
    return rows, checks


def search_rows(shard, queries: np.ndarray, what: str, device: str, dtype: str, calls: int, clock: Clock,
                s: Sizes, warm: bool = True) -> list[dict]:
    out = []
    for b in s.dense_batches:
        if clock.left() <= 0:
            break
        if warm:
            shard.search(queries[:b], s.dense_k)
        took = timed_calls(lambda b=b: shard.search(queries[:b], s.dense_k), calls if b == 1 else max(2, calls // 5),
                           clock, share=0.15)
        stats = latency_ms(took)
        out.append(row(what, device, dtype, b, stats["median_ms"] / b, "ms/query", **stats))
        print(f"  {what} {device} batch {b}: {out[-1]['value']:.3f} ms/query", flush=True)
    return out


def dense_check(name: str, vectors: np.ndarray, queries: np.ndarray, reference, answer, tolerance, k: int) -> dict:
    agree = []
    for q, (ref_rows, ref_scores), (got_rows, got_scores) in zip(queries, reference, answer, strict=True):
        # Only the rows either list holds are scored again (float32, numpy): positions in their union.
        union = np.union1d(ref_rows, got_rows)
        agree.append(top_k_agreement(vectors[union] @ q, np.searchsorted(union, got_rows), np.asarray(got_scores),
                                     np.searchsorted(union, ref_rows), tolerance(ref_scores)))
    return check(name, all(a["ok"] for a in agree), **summarize(agree, k, max(tolerance(r[1]) for r in reference)))


def training_triples(run: Run, n: int) -> tuple[list[str], list[str], list[str]]:
    s = run.sizes
    return (run.words.texts(n, (4, 12)), run.words.texts(n, s.chunk_words), run.words.texts(n, s.chunk_words))


def preprocess(model, texts: list[str], device: str) -> dict:
    """A sentence-transformers model's features for ``texts`` on ``device`` (``preprocess`` in 6.x, ``tokenize``
    before it)."""
    import torch

    features = model.preprocess(texts) if hasattr(model, "preprocess") else model.tokenize(texts)
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in features.items()}


def step_timer(run: Run, device: str, model, loss_fn: Callable[[], object], lr: float, clock: Clock,
               autocast=None) -> dict:
    """Seconds of one optimizer step (forward, loss, backward, AdamW), median of a few after a warm-up."""
    import contextlib

    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sync = run.sync if device == "cuda" else (lambda: None)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=autocast) if autocast else contextlib.nullcontext():
            loss = loss_fn()
        loss.backward()
        opt.step()

    for _ in range(run.sizes.train_warmup):
        step()
        sync()
    took = timed_calls(step, run.sizes.train_steps, clock, share=0.3, sync=sync)
    return {"median_s": round(statistics.median(took), 4), "steps": len(took)}


def section_training(run: Run, clock: Clock, out: dict) -> None:
    """One optimizer step of each fine-tuning, done directly (the GPU machine has no ``datasets`` for the
    trainers): the encoder with MultipleNegativesRankingLoss over (query, positive, hard negative) triples at
    relevance.train_encoder's lr, the cross-encoder with its listwise MultipleNegativesRankingLoss (4 in-batch
    negatives, max_length 256) from MiniLM's weights, as relevance.train_reranker. float32, as both trainers
    run today; a bfloat16-autocast row shows what mixed precision would give."""
    import torch

    s = run.sizes
    triples = training_triples(run, max(s.encoder_batches_gpu + s.reranker_batches_gpu +
                                        (s.encoder_batch_cpu, s.reranker_batch_cpu)))
    rows = out["rows"]
    notes = {"learned_ranker": "not measured: no learned ranker exists yet",
             "texts": f"synthetic: queries of 4-12 words, documents of {s.chunk_words} words",
             "tokenizing": "done once before the timed steps (the trainers' collator does it on CPU each step)"}
    plans = [("encoder", s.encoder_batches_gpu, s.encoder_batch_cpu),
             ("cross-encoder", s.reranker_batches_gpu, s.reranker_batch_cpu)]
    for kind, gpu_batches, cpu_batch in plans:
        sides = [(run.device, run.label, b, None) for b in gpu_batches]
        sides.append((run.device, run.label, max(gpu_batches), torch.bfloat16))
        sides.append(("cpu", "cpu", cpu_batch, None))
        for device, label, batch, autocast in sides:
            dtype = "bfloat16 autocast" if autocast else "float32"
            if clock.left() <= 0:
                rows.append(row(f"{kind} training step (skipped: out of time)", label, dtype, batch, 0, "s/step"))
                continue
            got = train_step_seconds(run, kind, device, batch, triples, clock, autocast)
            rows.append(row(f"{kind} training step", label, dtype, batch, got["median_s"], "s/step", **got))
            print(f"  {kind} {label} {dtype} batch {batch}: {got['median_s']:.3f} s/step", flush=True)
            run.save()
    speedups = [speedup(rows, f"{kind} training step", (run.label, "float32", cpu_batch),
                        f"{kind}, batch {cpu_batch}, float32", ("cpu", "float32", cpu_batch))
                for kind, _, cpu_batch in plans]
    out["notes"].update(notes)
    out["speedups"] += speedups


def train_step_seconds(run: Run, kind: str, device: str, batch: int, triples, clock: Clock, autocast) -> dict:
    """A fresh model and loss of ``kind`` on ``device``, timed over a few optimizer steps of ``batch`` triples."""
    import warnings

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.cross_encoder import CrossEncoder
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss as ListwiseLoss

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the import relevance.train_encoder uses
        from sentence_transformers.losses import MultipleNegativesRankingLoss

    if kind == "encoder":
        model = SentenceTransformer(str(run.model), device=device)
        loss, lr = MultipleNegativesRankingLoss(model), 4e-5
        data = [preprocess(model, column[:batch], device) for column in triples]
    else:
        model = CrossEncoder(str(run.model), num_labels=1, max_length=256, device=device)
        loss, lr = ListwiseLoss(model, num_negatives=4), 2e-5
        data = [column[:batch] for column in triples]
    got = step_timer(run, device, model, lambda: loss(data, None), lr, clock, autocast)
    model = loss = data = None  # the next side's model needs the memory
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return got


SECTIONS = {"embedding": section_embedding, "queries": section_queries, "reranker": section_reranker,
            "dense": section_dense, "training": section_training}


def machine(device: str) -> dict:
    import importlib.metadata as meta

    import torch

    def version(name: str) -> str:
        try:
            return meta.version(name)
        except meta.PackageNotFoundError:
            return "absent"

    info = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit(),
            "cpu": _cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "cuda": torch.version.cuda, "device": device,
            "versions": {n: version(n) for n in ("torch", "transformers", "sentence-transformers", "onnxruntime",
                                                 "onnx", "tokenizers", "numpy")}}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        info["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = done.stdout.strip() or done.stderr.strip()[:200]
    except (OSError, subprocess.SubprocessError) as e:
        info["nvidia_smi"] = f"unavailable ({type(e).__name__})"
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def markdown(record: dict) -> str:
    m = record["machine"]
    head = [f"# GPU check{' (dry run: the GPU side ran on CPU)' if record['dry_run'] else ''}", "",
            f"{m.get('gpu', 'no GPU')}, driver {m.get('nvidia_smi', '?')}; {m['cpu_count']} CPU cores ({m['cpu']}, "
            f"torch {m['torch_threads']} threads); torch {m['versions']['torch']} (CUDA {m['cuda']}), "
            f"transformers {m['versions']['transformers']}, sentence-transformers "
            f"{m['versions']['sentence-transformers']}, onnxruntime {m['versions']['onnxruntime']}; "
            f"commit {m['commit'][:12]}; {m['date']}.", "",
            f"Model: {record['model'].get('run_weights', '?')}. Texts: {record['data']}", "",
            "| section | measure | device | dtype | batch | value | unit | detail |", "|---|---|---|---|---|---|---|---|"]
    lines, checks = head, []
    for name, section in record["sections"].items():
        for r in section.get("rows", []):
            extra = {k: v for k, v in r.items() if k not in ("what", "device", "dtype", "batch", "value", "unit")}
            lines.append(f"| {name} | {r['what']} | {r['device']} | {r['dtype']} | {r['batch'] or ''} | "
                         f"{_fmt(r['value'])} | {r['unit']} | {_brief(extra)} |")
        checks += [(name, c) for c in section.get("checks", [])]
        if section.get("error"):
            lines.append(f"| {name} | ERROR | | | | | | {section['error'].splitlines()[-1][:200]} |")
    lines += ["", "| section | GPU against CPU | times | GPU row | CPU row |", "|---|---|---|---|---|"]
    for name, section in record["sections"].items():
        for x in section.get("speedups", []):
            lines.append(f"| {name} | {x['speedup']} | {x['x'] if x['x'] is not None else 'n/a'} | "
                         f"{x.get('gpu', '')} | {x.get('cpu', '')} |")
    lines += ["", "| section | check | ok | detail |", "|---|---|---|---|"]
    for name, c in checks:
        extra = {k: v for k, v in c.items() if k not in ("check", "ok")}
        lines.append(f"| {name} | {c['check']} | {'yes' if c['ok'] else 'NO'} | {_brief(extra)} |")
    lines += ["", "Section seconds: " + ", ".join(f"{k} {v.get('seconds', '?')}" for k, v in
                                                  record["sections"].items())]
    return "\n".join(lines) + "\n"


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def _brief(detail: dict) -> str:
    return "; ".join(f"{k} {_fmt(v) if isinstance(v, float) else v}" for k, v in detail.items())[:240]


def write(out: Path, record: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    try:
        (out / "gpu_check.md").write_text(markdown(record))
    except Exception as e:  # the JSON holds everything; a table that cannot be drawn must not stop the run
        (out / "gpu_check.md").write_text(f"table failed: {type(e).__name__}: {e}\n")


def run_sections(run: Run, names: list[str], record: dict, out: Path, budget_s: float) -> None:
    """Each section in turn, in its own share of the time; one that fails records its error and the rest go on."""
    import torch

    started = time.perf_counter()
    for name in names:
        left = budget_s - (time.perf_counter() - started)
        share = min(run.sizes.budget_s[name], left)
        print(f"== {name} (up to {share:.0f} s of timed work)", flush=True)
        t = time.perf_counter()
        parallelism = os.environ.get("TOKENIZERS_PARALLELISM")
        result = record["sections"][name] = {"rows": [], "checks": [], "notes": {}, "speedups": []}
        try:
            if share <= 0:
                raise TimeoutError(f"the run's {budget_s:.0f} s were spent before this section")
            SECTIONS[name](run, Clock(share), result)  # fills result as it goes: a failure keeps what was measured
        except Exception:
            result["error"] = traceback.format_exc()[-3000:]
            print(result["error"], file=sys.stderr, flush=True)
        finally:
            # The GPU reranker turns the tokenizer's threads on for the process: each section starts alike.
            if parallelism is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = parallelism
            gc.collect()
            if run.device == "cuda":
                torch.cuda.empty_cache()
        result["seconds"] = round(time.perf_counter() - t, 1)
        print(f"== {name}: {result['seconds']} s", flush=True)
        write(out, record)


def verdict(record: dict) -> dict:
    sections = record["sections"]
    return {"errors": [n for n, s in sections.items() if s.get("error")],
            "failed_checks": [f"{n}: {c['check']}" for n, s in sections.items() for c in s.get("checks", [])
                              if not c["ok"]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", type=Path, metavar="DIR",
                    help="only write MiniLM with float16 weights to DIR (to carry to a GPU machine), then exit")
    ap.add_argument("--model", type=Path, help="the MiniLM folder to measure (a --pack output or a float32 "
                    "folder; default: the installed all-MiniLM-L6-v2 package's)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/gpu_check"),
                    help="folder for gpu_check.json and gpu_check.md (default: %(default)s)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny sizes, everything on CPU (the GPU rows then run on CPU, labelled so): checks the "
                         "script itself in seconds")
    ap.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS),
                    help="run only these sections (default: all, in this order)")
    ap.add_argument("--budget-s", type=float,
                    help="seconds for the whole run; sections past it are recorded as skipped (default: the "
                         "sum of the sections' shares, 420 s, which keeps an H100 run under 8 minutes)")
    args = ap.parse_args(argv)
    configure_process()
    if args.pack:
        record = pack(args.pack)
        size = sum(f.stat().st_size for f in args.pack.rglob("*") if f.is_file())
        print(f"packed {record['source_folder']} at float16 into {args.pack} ({size / 2**20:.1f} MiB)")
        return 0
    return measure(args)


def measure(args) -> int:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    t0 = time.perf_counter()
    model = args.model or default_model()
    if model is None:
        raise SystemExit("no model: pass --model with the folder `python -m bench.gpu_check --pack DIR` wrote")
    device = "cpu" if args.dry_run else "cuda" if torch.cuda.is_available() else None
    if device is None:
        raise SystemExit("torch sees no GPU; use --dry-run to check the script on CPU")
    if args.dry_run:
        torch.set_num_threads(1)  # it checks the code, not the speed: one thread does not fight a small machine
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    # The ONNX export is part of what the query section measures, and must not land in the user's cache.
    os.environ["RAYSEARCH_CACHE"] = str(work / "cache")
    try:
        folder, model_info = float32_folder(model, work)
        sizes = DRY_RUN if args.dry_run else Sizes()
        run = Run(device=device, label="cpu (dry run)" if args.dry_run else "cuda", model=folder, sizes=sizes,
                  work=work, words=Words(folder / "vocab.txt"), dry_run=args.dry_run)
        record = {"kind": "gpu_check", "dry_run": args.dry_run, "machine": machine(device), "model": model_info,
                  "data": "synthetic English-like text: whole words of the model's vocabulary, Zipf-weighted by "
                          "rank, seeded (the GPU machine has no data); dense vectors random unit rows, seeded",
                  "sizes": asdict(sizes), "sections": {}}
        run.save = lambda: write(args.out, record)
        print(f"gpu check on {record['machine'].get('gpu', device)}; model {model_info['run_weights']}", flush=True)
        run_sections(run, args.sections, record, args.out, args.budget_s or sum(sizes.budget_s.values()))
        record["verdict"] = verdict(record)
        record["total_s"] = round(time.perf_counter() - t0, 1)
        write(args.out, record)
        print(markdown(record), flush=True)
        print(f"total {record['total_s']} s -> {args.out}/gpu_check.json", flush=True)
        return 0 if not record["verdict"]["errors"] else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
