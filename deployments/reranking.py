"""Cross-encoder reranking, Ray-free: a CrossEncoder that scores many requests' pairs at once.

A reranker's cost is padding and small batches. Serving gathers the (query, passage) pairs of
concurrent requests into one batch (the Serve deployment does that); here that batch is sorted by
length as a whole, cut into forward passes under a token budget, so a pass of short pairs is wide and
a pass of long pairs is narrow, and mapped back to the callers' order.

Scores are mapped to [0, 1] (a sigmoid over a single logit, or the positive class of a two-class head)
so a ``min_relevance_score`` means the same thing for every model and every query.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

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


class CrossEncoderScorer:
    """A sentence-transformers ``CrossEncoder`` loaded once, scoring pairs in length-sorted passes."""

    def __init__(self, model: str, device: str = "auto", dtype: str = "auto", max_length: int = 512,
                 forward_batch_size: int = 32, max_batch_tokens: int = 16384):
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

    @property
    def num_labels(self) -> int:
        return self.encoder.num_labels

    def token_lengths(self, pairs: Sequence[Pair]) -> list[int]:
        """Tokens of each pair as the model will see it (cut at max_length): what padding is made of."""
        queries = [q for q, _ in pairs]
        passages = [p for _, p in pairs]
        enc = self.tokenizer(queries, passages, truncation=True, max_length=self.max_length,
                             return_attention_mask=False, return_token_type_ids=False)
        return [len(ids) for ids in enc["input_ids"]]

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
        order, passes = length_batches(self.token_lengths(pairs), self.forward_batch_size, self.max_batch_tokens)
        out = np.empty(len(pairs), dtype=np.float32)
        for part in passes:
            idx = order[part]
            out[idx] = self._predict([pairs[i] for i in idx])
        return np.clip(out, 0.0, 1.0)


def passage_text(title: str, text: str) -> str:
    """What the cross-encoder reads of a chunk: its title (when it has one) and its text."""
    return f"{title}\n{text}" if title and not text.startswith(title) else text
