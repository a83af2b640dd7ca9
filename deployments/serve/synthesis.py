"""Serve deployment: answers with citations from the final results (``SynthesisService``)."""

from __future__ import annotations

from ray import serve

from deployments.config import SynthesisConfig
from deployments.synthesis.service import LocalSynthesizer, SynthesisService


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=16)
class Synthesis(LocalSynthesizer):
    """``answer``, ``stream`` (a generator: the handle streams it) and ``relevance`` come from
    ``LocalSynthesizer``; the replica only sets its thread count and loads the model."""

    def __init__(self, config: dict):
        import torch

        cfg = SynthesisConfig.model_validate(config)
        torch.set_num_threads(cfg.threads or max(1, int(cfg.num_cpus)))
        super().__init__(SynthesisService(cfg))

    async def info(self) -> dict:
        return self.service.info()
