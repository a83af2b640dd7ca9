"""Serve deployment: the query encoder, batching concurrent queries into one forward pass.

It embeds with the model and prompts of the versions it serves (``index_format.prompts``): each query as
``query_prompt + text``, and the documents written through the API (the fresh segment) as ``document_prompt +
text``, so both sides match the build's vectors."""

from __future__ import annotations

import asyncio

import numpy as np
from ray import serve

from index_format.prompts import EncoderSpec


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=64)
class QueryEncoder:
    def __init__(self, spec: EncoderSpec, max_batch_size: int = 32, batch_wait_s: float = 0.003, threads: int = 1,
                 device: str = "auto", backend: str = "torch"):
        from index_format.encoders import load_encoder, runs_on_torch

        if runs_on_torch(spec.model, device, backend):
            import torch

            torch.set_num_threads(max(1, threads))
        self.spec = spec
        self.encoder = load_encoder(spec.model, device, backend, threads)
        self.embed.set_max_batch_size(max_batch_size)
        self.embed.set_batch_wait_timeout_s(batch_wait_s)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.003)
    async def embed(self, texts: list[str]) -> list[np.ndarray]:
        # The forward pass runs off the event loop so the next batch can gather meanwhile.
        vectors = await asyncio.to_thread(self.encoder.encode, list(texts), len(texts), self.spec.query_prompt)
        return list(vectors)

    def token_limit(self) -> tuple[int | None, str]:
        """(the model's token limit, the query prompt): a caller asks ``token_counts`` only of a query that may
        pass it (``index_format.encoders.may_be_cut``)."""
        return getattr(self.encoder, "max_tokens", None), self.spec.query_prompt

    async def token_counts(self, text: str) -> tuple[int, int] | None:
        """(tokens embedded, tokens in all) of a query with its prompt (``index_format.encoders.token_counts``)."""
        from index_format.encoders import query_token_counts

        return await asyncio.to_thread(query_token_counts, self.encoder, self.spec.query_prompt, text)

    async def embed_documents(self, texts: list[str]) -> np.ndarray:
        """Written documents' chunks (already one batch: the documents service groups its writes)."""
        return await asyncio.to_thread(self.encoder.encode, list(texts), 64, self.spec.document_prompt)
