"""Metric records held for a moment and made together (``edge.metrics.Held``), and the log file's cheaper rollover
check (``serve.logs``): what reaches Ray's metrics and the log files is what was recorded, all of it."""

from __future__ import annotations

import asyncio
import logging
import logging.handlers
from pathlib import Path

import pytest

from deployments.edge import metrics
from deployments.edge.metrics import Held
from deployments.serve.logs import cheaper_rollover


class Sink:
    """Stands where a Ray metric would: what it was asked to record, in order."""

    def __init__(self):
        self.calls: list[tuple[float, dict]] = []

    def inc(self, value, tags):
        self.calls.append((value, tags))

    observe = inc


def test_outside_an_event_loop_records_are_made_at_once():
    held, counter, histogram = Held(), Sink(), Sink()
    held.record([(histogram, 2.5, {"stage": "embed"})], [(counter, (("method", "hybrid"),))])
    assert histogram.calls == [(2.5, {"stage": "embed"})] and counter.calls == [(1.0, {"method": "hybrid"})]


def test_in_a_loop_they_wait_then_every_observation_is_made_and_counts_are_summed(monkeypatch):
    monkeypatch.setattr(metrics, "HOLD_S", 0.05)
    held, counter, histogram = Held(), Sink(), Sink()

    async def requests():
        for i in range(5):
            held.record([(histogram, float(i), {"stage": "embed"})],
                        [(counter, (("method", "hybrid"), ("outcome", "ok" if i % 2 else "degraded")))])
        assert counter.calls == histogram.calls == []  # not yet
        await asyncio.sleep(0.2)
        held.record([(histogram, 9.0, {"stage": "fuse"})], [(counter, (("method", "hybrid"), ("outcome", "ok")))])
        await asyncio.sleep(0.2)

    asyncio.run(requests())
    assert histogram.calls == [(float(i), {"stage": "embed"}) for i in range(5)] + [(9.0, {"stage": "fuse"})]
    assert sorted(counter.calls, key=repr) == sorted([
        (2.0, {"method": "hybrid", "outcome": "ok"}), (3.0, {"method": "hybrid", "outcome": "degraded"}),
        (1.0, {"method": "hybrid", "outcome": "ok"})], key=repr)


def test_records_due_on_a_loop_that_stopped_are_made_by_the_next_one(monkeypatch):
    monkeypatch.setattr(metrics, "HOLD_S", 0.05)
    held, histogram = Held(), Sink()

    async def one(value):
        held.record([(histogram, value, {})])

    asyncio.run(one(1.0))  # the loop ends before its flush is due
    assert histogram.calls == []
    import time

    time.sleep(0.25)
    asyncio.run(one(2.0))  # long past due: made now, with this one
    assert [v for v, _ in histogram.calls] == [1.0, 2.0]


@pytest.mark.parametrize("lines", [1, 40, 400])
def test_the_cheaper_rollover_loses_no_line_and_rolls_near_max_bytes(tmp_path: Path, lines):
    """As Serve writes a replica's log: a rotating file behind a memory handler of capacity 1."""
    name = f"test-rollover-{lines}"
    target = logging.handlers.RotatingFileHandler(tmp_path / "replica.log", maxBytes=2_000, backupCount=1_000)
    target.setFormatter(logging.Formatter("%(message)s"))
    memory = logging.handlers.MemoryHandler(capacity=1, target=target)
    logger = logging.getLogger(name)
    logger.propagate, logger.level = False, logging.INFO
    logger.addHandler(memory)
    try:
        assert cheaper_rollover(name) == 1
        written = [f"line {i} " + "x" * (i % 50) for i in range(lines)]
        for line in written:
            logger.info(line)
        memory.flush()
    finally:
        logger.removeHandler(memory)
        memory.close()
        target.close()
    files = sorted(tmp_path.glob("replica.log*"), key=lambda p: -int(p.suffix[1:]) if p.suffix[1:].isdigit() else 0)
    assert [line for f in files for line in f.read_text().splitlines()] == written  # every line, in order
    longest = max(len(line) + 1 for line in written)
    assert all(f.stat().st_size < 2_000 + longest for f in files)
    # A file rolls over once what it holds reaches max_bytes, before the next line.
    assert (len(files) > 1) == (sum(len(line) + 1 for line in written[:-1]) >= 2_000)
