"""What every stage of a search shares: the record it writes as it goes (``Work``: stage times, the debug
trace, warnings), stage timing, deadlines, and how a failure reads in a warning."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Work:
    """What a search's stages write as they go: stage times, the debug trace, warnings."""

    timings: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def mark(timings: dict, stage: str, started: float) -> None:
    """A stage's time in ``timings_ms`` (summed when it runs again), and its span: (name, start, end, parent)
    in perf_counter seconds, for traces (``deployments.search.tracing``)."""
    now = time.perf_counter()
    timings[stage] = timings.get(stage, 0.0) + (now - started) * 1000
    timings.setdefault("_stages", []).append((stage, started, now, None))


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
