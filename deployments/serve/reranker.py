"""Serve deployment: the cross-encoder reranker, batching concurrent requests' pairs into one pass.

A batch is counted in (query, passage) pairs, not requests (``batch_size_fn``): one request of 100
candidates and ten of 10 weigh the same. A request larger than a batch is split into batch-sized
pieces, which may share a batch with other requests' pieces. The batching knobs are the deployment's
``user_config`` (``RerankerBatching``), so they change without restarting a replica.
"""

from __future__ import annotations

import asyncio

from ray import serve

from deployments.config import RerankerBatching
from deployments.search.reranking import CrossEncoderScorer


def _pairs_in(items: list[tuple[str, list[str]]]) -> int:
    return sum(len(passages) for _, passages in items)


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=64)
class Reranker:
    def __init__(self, model: str, device: str = "auto", dtype: str = "auto", max_length: int = 512,
                 threads: int = 1):
        import torch

        torch.set_num_threads(max(1, threads))
        self.scorer = CrossEncoderScorer(model, device=device, dtype=dtype, max_length=max_length)
        self.batching = RerankerBatching()
        self.stats = {"batches": 0, "pairs": 0, "largest_batch_pairs": 0, "largest_batch_requests": 0}
        self.reconfigure({})

    def reconfigure(self, user_config: dict) -> None:
        self.batching = RerankerBatching(**(user_config or {}))
        self._score_batch.set_max_batch_size(self.batching.max_batch_pairs)
        self._score_batch.set_batch_wait_timeout_s(self.batching.batch_wait_s)
        self.scorer.forward_batch_size = self.batching.forward_batch_size

    async def score(self, query: str, passages: list[str]) -> list[float]:
        """Scores in [0, 1] for each passage against the query, in the passages' order."""
        step = self.batching.max_batch_pairs
        pieces = [passages[i:i + step] for i in range(0, len(passages), step)]
        scored = await asyncio.gather(*(self._score_batch((query, piece)) for piece in pieces))
        return [s for piece in scored for s in piece]

    async def info(self) -> dict:
        return {"model": self.scorer.model_name, "device": self.scorer.device, "dtype": str(self.scorer.dtype),
                "batching": self.batching.model_dump(), "stats": dict(self.stats)}

    @serve.batch(max_batch_size=256, batch_wait_timeout_s=0.005, batch_size_fn=_pairs_in)
    async def _score_batch(self, items: list[tuple[str, list[str]]]) -> list[list[float]]:
        pairs = [(query, p) for query, passages in items for p in passages]
        st = self.stats
        st["batches"] += 1
        st["pairs"] += len(pairs)
        st["largest_batch_pairs"] = max(st["largest_batch_pairs"], len(pairs))
        st["largest_batch_requests"] = max(st["largest_batch_requests"], len(items))
        # The forward passes run off the event loop, so the next batch gathers meanwhile.
        scores = (await asyncio.to_thread(self.scorer.score, pairs)).tolist()
        out, start = [], 0
        for _, passages in items:
            out.append(scores[start:start + len(passages)])
            start += len(passages)
        return out
