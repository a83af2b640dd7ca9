"""A worker pool's threads carry their names for the system, where ``top -H`` and the serving bench read them."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.cpu import cpu_by_thread
from deployments.threads import name_os_thread, named_pool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="system thread names are read from /proc")


def _comm(tid: int) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().strip()


def test_a_pool_s_threads_are_named_for_the_system_and_their_cpu_is_counted_together():
    pool = named_pool(2, "probe-pool")
    started = threading.Barrier(2)

    def spin() -> int:
        started.wait()  # both workers at once: the pool makes its second thread
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        return threading.get_native_id()

    try:
        tids = {f.result() for f in [pool.submit(spin), pool.submit(spin)]}
        assert sorted(_comm(t) for t in tids) == ["probe-pool_0", "probe-pool_1"]
        spent = cpu_by_thread(os.getpid())
        assert "probe-pool" in spent and "probe-pool_0" not in spent  # the pool's threads as one
        assert spent["probe-pool"] >= 0.05  # both spun 50 ms; a clock tick is 10 ms
    finally:
        pool.shutdown()


def test_a_long_name_is_cut_to_what_the_system_keeps():
    def named() -> str:
        assert name_os_thread("a-name-longer-than-fifteen-bytes")
        return _comm(threading.get_native_id())

    pool = named_pool(1, "x")
    try:
        assert pool.submit(named).result() == "a-name-longer-t"
    finally:
        pool.shutdown()
