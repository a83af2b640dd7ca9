"""What the synthesis deployment serves: search results in, an answer with citations out.

``SynthesisService`` holds one engine; ``LocalSynthesizer`` is the pipeline's client of a service in this
process (tests, benches), and the Serve deployment (``deployments.serve.synthesis``) is that same class with a
replica around it. Ray-free.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING

from deployments.synthesis.core import Synthesizer, load_engine
from deployments.synthesis.sources import sources_from_results

if TYPE_CHECKING:
    from deployments.config import SynthesisConfig


async def iterate_in_thread(make: Callable[[], Iterator]) -> AsyncIterator:
    """Drive a blocking iterator on a worker thread, handing its items to the event loop as they come."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    done = object()
    stop = threading.Event()  # set when the consumer goes away: generation stops at the next item

    def run() -> None:
        items = make()
        try:
            for item in items:
                if stop.is_set():
                    break
                loop.call_soon_threadsafe(queue.put_nowait, item)
        except BaseException as exc:  # handed to the consumer, raised there
            loop.call_soon_threadsafe(queue.put_nowait, exc)
        finally:
            if hasattr(items, "close"):
                items.close()
            loop.call_soon_threadsafe(queue.put_nowait, done)

    threading.Thread(target=run, daemon=True, name="synthesis-stream").start()
    try:
        while (item := await queue.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


class SynthesisService:
    """One model per replica, one generation at a time (a lock): on CPU two generations would only share the
    same cores, and a torch model is not made to be driven by two threads at once."""

    def __init__(self, cfg: SynthesisConfig, engine=None):
        self.cfg = cfg
        self.engine = engine if engine is not None else load_engine(cfg)
        self.synthesizer = Synthesizer(self.engine, cfg.max_new_tokens)
        self.llm_rerank = cfg.llm_rerank
        self._lock = threading.Lock()

    def _sources(self, results: list[dict]):
        return sources_from_results(results, self.cfg.max_sources, self.cfg.max_source_chars)

    def answer(self, query: str, results: list[dict], max_new_tokens: int | None = None) -> dict:
        with self._lock:
            return asdict(self.synthesizer.answer(query, self._sources(results), max_new_tokens))

    def stream(self, query: str, results: list[dict], max_new_tokens: int | None = None) -> Iterator[dict]:
        with self._lock:
            yield from self.synthesizer.stream(query, self._sources(results), max_new_tokens)

    def relevance(self, query: str, passages: list[str]) -> list[float]:
        if not self.llm_rerank:
            raise PermissionError("LLM reranking is off on this service (synthesis.llm_rerank)")
        with self._lock:
            return [float(x) for x in self.synthesizer.relevance(query, passages)]

    def info(self) -> dict:
        return {"engine": type(self.engine).__name__, "model": self.cfg.model, "llm_rerank": self.llm_rerank}


class LocalSynthesizer:
    """The pipeline's synthesizer client over a service in this process (tests, benches); the Serve
    deployment is this same class with a replica around it."""

    def __init__(self, service: SynthesisService):
        self.service = service
        self.llm_rerank = service.llm_rerank

    async def answer(self, query: str, results: list[dict], max_new_tokens: int | None) -> dict:
        return await asyncio.to_thread(self.service.answer, query, results, max_new_tokens)

    async def stream(self, query: str, results: list[dict], max_new_tokens: int | None) -> AsyncIterator[dict]:
        async for event in iterate_in_thread(lambda: self.service.stream(query, results, max_new_tokens)):
            yield event

    async def relevance(self, query: str, passages: list[str]) -> list[float]:
        return await asyncio.to_thread(self.service.relevance, query, passages)
