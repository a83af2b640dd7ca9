"""Waiting for the thing itself (a status, a file, a log line, an answer), polled against a deadline, never for a
time that ought to be long enough: a wait that runs out fails saying what never happened."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _failure(timeout_s: float, what: str | Callable[[], str]) -> AssertionError:
    return AssertionError(f"not within {timeout_s} s: {what() if callable(what) else what}")


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str | Callable[[], str], every_s: float = 0.05) -> T:
    """Call ``predicate`` until it returns something truthy, and return that. After ``timeout_s`` fail with
    ``what``: what should have happened, or a function that says it from the state the last poll left (called once,
    at the failure). ``every_s`` apart: raise it where a poll costs the service under test work (a scrape, a
    search); it paces the polls and is no part of what is waited for."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise _failure(timeout_s, what)
        time.sleep(every_s)
    return value


async def until(predicate: Callable[[], T], timeout_s: float, what: str | Callable[[], str]) -> T:
    """``wait_until`` inside a test's event loop: between polls it yields to the loop, so the tasks the predicate
    waits on run (no timer: the order is the test's own)."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise _failure(timeout_s, what)
        await asyncio.sleep(0)
    return value
