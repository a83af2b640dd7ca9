"""The vllm engine: vllm's offline ``LLM`` on a GPU node (vllm is imported when one is made, never at module
import)."""

from __future__ import annotations

from collections.abc import Iterator

from deployments.synthesis.prompts import yes_no_ids, yes_share

VLLM_MISSING = "vllm is not installed: pip install 'raysearch[gpu]' on a GPU node, or engine: transformers"


class VLLMEngine:
    """vllm's offline ``LLM`` on a GPU node (vllm is imported here, never at module import).

    ``stream()`` yields the whole reply at once: the offline API has no token stream (the Serve layer can
    still send it as one token event).
    """

    def __init__(self, model: str, dtype: str = "auto", max_model_len: int = 4096):
        try:
            import vllm
        except ImportError as e:
            raise RuntimeError(VLLM_MISSING) from e
        self._vllm = vllm
        self.llm = vllm.LLM(model=model, dtype=dtype, max_model_len=max_model_len)
        self.name = model
        self._yes, self._no = yes_no_ids(self.llm.get_tokenizer(), model)

    def generate(self, messages: list[dict], max_new_tokens: int) -> tuple[str, int, int]:
        params = self._vllm.SamplingParams(temperature=0, max_tokens=max_new_tokens)
        out = self.llm.chat(messages, params, use_tqdm=False)[0]
        completion = out.outputs[0]
        return completion.text, len(out.prompt_token_ids or []), len(completion.token_ids)

    def stream(self, messages: list[dict], max_new_tokens: int) -> Iterator[str]:
        yield self.generate(messages, max_new_tokens)[0]

    def yes_probability(self, prompts: list[list[dict]]) -> list[float]:
        """Top-20 logprobs of the first reply token; yes (or no) absent from the top 20 counts as the 20th's logprob."""
        if not prompts:
            return []
        params = self._vllm.SamplingParams(temperature=0, max_tokens=1, logprobs=20)
        outs = self.llm.chat(prompts, params, use_tqdm=False)
        scores = []
        for out in outs:
            steps = out.outputs[0].logprobs or [{}]
            top = {int(token): float(lp.logprob) for token, lp in steps[0].items()}
            scores.append(yes_share(top, self._yes, self._no))
        return scores
