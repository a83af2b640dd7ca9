"""Cross-encoder reranking, Ray-free: a CrossEncoder that scores many requests' pairs at once.

A reranker's cost is padding, small batches and, on a GPU, the CPU work of tokenizing: a naive
``predict`` per request tokenizes every (query, passage) pair afresh, and an H100 then waits on one CPU
thread (measured: the GPU ran at the speed of the tokenizer). So here each passage is tokenized once
and cached (the same chunks come back across queries), each query once per batch, and pairs are joined
from those pieces by the tokenizer's own post-processor (same ids, truncation and special tokens as
tokenizing the pair). Serving gathers concurrent requests' pairs into one batch (the Serve deployment
does that); the batch is sorted by exact token length and cut into forward passes under a token budget,
so a pass of short pairs is wide and a pass of long pairs narrow.

Scores are mapped to [0, 1] (a sigmoid over a single logit, or the positive class of a two-class head)
so a ``min_relevance_score`` means the same thing for every model and every query.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from deployments.bounded import BoundedCache

Pair = tuple[str, str]


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for the reranker but torch sees no GPU; use 'cpu' or 'auto'")
    return device


def resolve_dtype(dtype: str, device: str):
    """auto: bfloat16 on a GPU that has it (float16 otherwise), float32 on CPU, where halves are slower."""
    import torch

    if dtype == "auto":
        if device != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device == "cpu" and dtype != "float32":
        raise ValueError(f"dtype {dtype!r} is for GPUs; on CPU the reranker runs in float32")
    return getattr(torch, dtype)


def length_batches(lengths: Sequence[int], max_pairs: int, max_tokens: int) -> tuple[np.ndarray, list[slice]]:
    """Order pairs longest first and cut them into passes of at most ``max_pairs`` pairs and about
    ``max_tokens`` padded tokens (longest pair x pairs in the pass); returns the order and the passes."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    passes: list[slice] = []
    start = 0
    while start < len(order):
        widest = max(1, int(lengths[order[start]]))  # the first pair of a pass is its longest
        size = max(1, min(max_pairs, max_tokens // widest))
        passes.append(slice(start, min(start + size, len(order))))
        start += size
    return order, passes


class TokenCache:
    """Token ids of passages, least recently used dropped first."""

    def __init__(self, size: int):
        self.items: BoundedCache[str, Any] = BoundedCache(size)
        self.hits = self.misses = 0

    def get_many(self, texts: list[str], encode_batch) -> list:
        missing = list(dict.fromkeys(t for t in texts if t not in self.items))
        self.misses += len(missing)
        self.hits += len(texts) - len(missing)
        fresh = dict(zip(missing, encode_batch(missing), strict=True)) if missing else {}
        out = []
        for t in texts:
            enc = fresh.get(t)
            out.append(self.items.get(t) if enc is None else enc)
        for t, enc in fresh.items():
            self.items.put(t, enc)
        return out


class CrossEncoderScorer:
    """A sentence-transformers ``CrossEncoder`` loaded once, scoring pairs in length-sorted passes."""

    def __init__(self, model: str, device: str = "auto", dtype: str = "auto", max_length: int = 512,
                 forward_batch_size: int = 32, max_batch_tokens: int = 16384, cache_passages: int = 50_000):
        from sentence_transformers import CrossEncoder

        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.model_name = model
        self.encoder = CrossEncoder(model, device=self.device, max_length=max_length)
        self.encoder.to(self.dtype)
        self.max_length = max_length
        self.forward_batch_size = forward_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.tokenizer = self.encoder.tokenizer
        self.cache = TokenCache(cache_passages)
        self._backend = self._pair_tokenizer()
        if self.device == "cuda":
            # Tokenizing is the GPU's bottleneck: let the tokenizer use every core of a GPU node.
            os.environ["TOKENIZERS_PARALLELISM"] = "true"

    def _pair_tokenizer(self):
        """A private copy of the fast tokenizer's backend, truncating pairs as ``predict`` does; None when
        the model is not a plain sequence classifier with a fast tokenizer (then ``predict`` does it all)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        modules = list(self.encoder)
        plain = len(modules) == 1 and type(modules[0]).__name__ == "Transformer" and \
            type(self.encoder.model).__name__.endswith("ForSequenceClassification")
        if backend is None or not plain:
            return None
        from tokenizers import Tokenizer

        copy = Tokenizer.from_str(backend.to_str())
        copy.no_padding()
        copy.enable_truncation(self.max_length, strategy="longest_first")
        return copy

    @property
    def num_labels(self) -> int:
        return self.encoder.num_labels

    def token_lengths(self, pairs: Sequence[Pair]) -> list[int]:
        """Tokens of each pair as the model will see it (cut at max_length): what padding is made of."""
        if self._backend is not None:
            return [len(ids) for ids, _ in self._encode(list(pairs))]
        enc = self.tokenizer([q for q, _ in pairs], [p for _, p in pairs], truncation=True,
                             max_length=self.max_length, return_attention_mask=False, return_token_type_ids=False)
        return [len(ids) for ids in enc["input_ids"]]

    def _encode(self, pairs: list[Pair]) -> list[tuple[list[int], list[int]]]:
        """(input ids, token type ids) of each pair, from cached passage tokens and once-per-query tokens."""
        b = self._backend

        def pieces(texts: list[str]) -> list:
            return b.encode_batch(texts, add_special_tokens=False)

        queries = list(dict.fromkeys(q for q, _ in pairs))
        query_tokens = dict(zip(queries, pieces(queries), strict=True))
        passage_tokens = self.cache.get_many([p for _, p in pairs], pieces)
        joined = [b.post_process(query_tokens[q], pt, add_special_tokens=True)
                  for (q, _), pt in zip(pairs, passage_tokens, strict=True)]
        return [(e.ids, e.type_ids) for e in joined]

    def _forward(self, encoded: list[tuple[list[int], list[int]]]) -> np.ndarray:
        import torch

        width = max(len(ids) for ids, _ in encoded)
        ids = np.full((len(encoded), width), self.tokenizer.pad_token_id or 0, dtype=np.int64)
        types = np.zeros((len(encoded), width), dtype=np.int64)
        mask = np.zeros((len(encoded), width), dtype=np.int64)
        for row, (i, t) in enumerate(encoded):
            ids[row, :len(i)] = i
            types[row, :len(t)] = t
            mask[row, :len(i)] = 1
        features = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.tokenizer.model_input_names:
            features["token_type_ids"] = types
        with torch.inference_mode():
            logits = self.encoder.model(**{k: torch.from_numpy(v).to(self.device) for k, v in features.items()}).logits
            logits = logits.float()
            scores = torch.sigmoid(logits[:, 0]) if logits.shape[1] == 1 else torch.softmax(logits, dim=1)[:, -1]
        return scores.cpu().numpy()

    def _predict(self, pairs: list[Pair]) -> np.ndarray:
        import torch

        if self.num_labels == 1:
            # Sigmoid explicitly: a model whose config names no activation would return raw logits.
            scores = self.encoder.predict(pairs, batch_size=len(pairs), activation_fn=torch.nn.Sigmoid(),
                                          show_progress_bar=False)
        else:
            scores = self.encoder.predict(pairs, batch_size=len(pairs), apply_softmax=True,
                                          show_progress_bar=False)[:, -1]
        return np.asarray(scores, dtype=np.float32).reshape(len(pairs))

    def score(self, pairs: Sequence[Pair]) -> np.ndarray:
        """Scores in [0, 1], in the order of ``pairs``; the same as ``CrossEncoder.predict`` gives them."""
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        pairs = list(pairs)
        out = np.empty(len(pairs), dtype=np.float32)
        if self._backend is not None:
            encoded = self._encode(pairs)
            order, passes = length_batches([len(ids) for ids, _ in encoded], self.forward_batch_size,
                                           self.max_batch_tokens)
            for part in passes:
                idx = order[part]
                out[idx] = self._forward([encoded[i] for i in idx])
        else:
            order, passes = length_batches(self.token_lengths(pairs), self.forward_batch_size, self.max_batch_tokens)
            for part in passes:
                idx = order[part]
                out[idx] = self._predict([pairs[i] for i in idx])
        return np.clip(out, 0.0, 1.0)


def passage_text(title: str, text: str) -> str:
    """What the cross-encoder reads of a chunk: its title (when it has one) and its text."""
    return f"{title}\n{text}" if title and not text.startswith(title) else text
