"""Serve deployment: the query encoder, batching concurrent queries into one forward pass."""

from __future__ import annotations

import asyncio

import numpy as np
from ray import serve


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=64)
class QueryEncoder:
    def __init__(self, encoder: str, max_batch_size: int = 32, batch_wait_s: float = 0.003, threads: int = 1,
                 device: str = "auto", backend: str = "torch"):
        import torch

        from index_format.encoders import load_encoder

        torch.set_num_threads(max(1, threads))
        self.encoder = load_encoder(encoder, device, backend, threads)
        self.embed.set_max_batch_size(max_batch_size)
        self.embed.set_batch_wait_timeout_s(batch_wait_s)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.003)
    async def embed(self, texts: list[str]) -> list[np.ndarray]:
        # The forward pass runs off the event loop so the next batch can gather meanwhile.
        vectors = await asyncio.to_thread(self.encoder.encode, list(texts), len(texts))
        return list(vectors)
