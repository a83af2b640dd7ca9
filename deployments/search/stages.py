"""What every stage of a search shares: the search as they see it (``SearchContext``), the record they write as
they go (``Work``: stage times and spans, the debug trace, warnings), deadlines, and how a failure reads in a
warning."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: the stages module is imported by every stage
    import numpy as np

    from deployments.config import RouterSettings
    from deployments.edge.schemas import SearchRequest
    from deployments.search.clients import Collection
    from deployments.search.plan import SearchPlan


@dataclass(frozen=True)
class Span:
    """A stage's time, for traces (``deployments.search.tracing``): perf_counter seconds, and the stage it ran
    under (None: the request itself)."""

    name: str
    start: float
    end: float
    parent: str | None = None


@dataclass
class Work:
    """What a search's stages write as they go: stage times (``timings_ms``), their spans, each shard's search
    time, the debug trace, warnings."""

    timings: dict[str, float] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    shard_ms: dict[str, float] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def mark(self, stage: str, started: float) -> None:
        """A stage's time in ``timings_ms`` (summed when it runs again), and its span."""
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + (now - started) * 1000
        self.spans.append(Span(stage, started, now))


@dataclass(frozen=True)
class SearchContext:
    """One search as every stage sees it: the request (its tuned defaults applied, its query corrected), its
    plan, the collections searched, the settings it runs under, who asks, and what the earlier stages made of
    the query. Made once the plan is fixed and passed whole to each stage; a stage that adds to it (the
    corrected query, the query's vectors) hands on a copy (``replace``). ``work`` is the one part stages
    write to."""

    req: SearchRequest
    plan: SearchPlan
    targets: list[Collection]
    settings: RouterSettings
    work: Work
    started: float  # perf_counter when the request came
    asked_query: str  # the query as the caller sent it
    acl: tuple[str, list[str]] | None = None  # (field, principals): who may see what
    rerank: bool = False
    rendered: bool = False  # the caller only sends the response on (``SearchPipeline.search``)
    text: str = ""  # the query as searched (normalized, synonyms, history)
    corrected: str | None = None  # the spell-corrected query, when corrected
    vectors: dict[str, np.ndarray] = field(default_factory=dict)  # the query's vector per collection
    model: Any = None  # the collection's ranking model (``search.learned.RankingModel``) when it ranks this search
    writes: dict[str, int] = field(default_factory=dict)  # each collection's last applied write (``write_seqs``)
    first_page_at: float | None = None  # when this search's first page was ranked (a cursor's; None: this is it)

    @property
    def versions(self) -> dict[str, str]:
        return {c.name: c.version for c in self.targets}

    @property
    def ranked_by(self) -> dict[str, str]:
        return ranked_by(self.targets, self.model)


def ranked_by(targets: list[Collection], model) -> dict[str, str]:
    """What a cursor names as the ranking its pages come from: each collection's version, and the ranking model
    when one orders the search (a page is never served from another)."""
    return {c.name: c.version if model is None else f"{c.version}+{model.id}" for c in targets}


def write_seqs(targets: list[Collection]) -> dict[str, int]:
    """Each collection's last write applied (its fresh segment's sequence number; 0: none past the version), taken
    when a search starts: a write changes what a collection ranks as a version switch does, so a cursor names it
    too (``paging``)."""
    return {c.name: c.fresh.applied_seq if c.fresh is not None else 0 for c in targets}


def failure(exc: BaseException) -> str:
    return "timed out" if isinstance(exc, asyncio.TimeoutError | TimeoutError) else f"failed ({type(exc).__name__})"


def redact(text: str) -> str:
    return f"<redacted sha256:{hashlib.sha256(text.encode()).hexdigest()[:12]} chars:{len(text)}>"


async def within(awaitable, timeout_s: float):
    """``await awaitable`` under a deadline (``TimeoutError`` past it), in the calling task.
    ``asyncio.wait_for`` runs it in a task of its own: a task and a turn of the event loop more for each
    of the several calls a request makes, all of them on the router's one event loop."""
    async with asyncio.timeout(timeout_s):
        return await awaitable


async def gathered(awaitables: list, return_exceptions: bool = False) -> list:
    """``asyncio.gather``, without its task when there is a single awaitable (one shard group, one
    collection: the default)."""
    if len(awaitables) != 1:
        return await asyncio.gather(*awaitables, return_exceptions=return_exceptions)
    try:
        return [await awaitables[0]]
    except Exception as exc:  # not a cancellation: that ends the request, as it does through gather
        if not return_exceptions:
            raise
        return [exc]
