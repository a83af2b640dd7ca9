"""Serve deployment: answers with citations from the final results (``SynthesisService``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ray import serve

from .config import SynthesisConfig
from .synthesis_service import SynthesisService, iterate_in_thread


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=16)
class Synthesis:
    def __init__(self, config: dict):
        import torch

        cfg = SynthesisConfig.model_validate(config)
        torch.set_num_threads(cfg.threads or max(1, int(cfg.num_cpus)))
        self.service = SynthesisService(cfg)

    async def answer(self, query: str, results: list[dict], max_new_tokens: int | None = None) -> dict:
        return await asyncio.to_thread(self.service.answer, query, results, max_new_tokens)

    async def stream(self, query: str, results: list[dict], max_new_tokens: int | None = None) -> AsyncIterator[dict]:
        async for event in iterate_in_thread(lambda: self.service.stream(query, results, max_new_tokens)):
            yield event

    async def relevance(self, query: str, passages: list[str]) -> list[float]:
        return await asyncio.to_thread(self.service.relevance, query, passages)

    async def info(self) -> dict:
        return self.service.info()
