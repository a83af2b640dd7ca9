"""Worker threads named where the operating system shows them.

Python names a thread for itself only: ``top -H``, ``/proc/PID/task/*/comm`` and a profiler outside the process see
every thread of a replica as ``ray::IDLE`` or the like. A replica's CPU splits into its query encoder, its index
thread and its event loop, and the split is what says whether a search's cost is the model's or the rest's
(bench/README.md, "The encoder's share, thread by thread"): so the pools that do that work name their threads for
the system too (Linux keeps the first 15 bytes; elsewhere nothing changes).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

_PR_SET_NAME = 15  # prctl(2)


def name_os_thread(name: str | None = None) -> bool:
    """The calling thread's system name set to ``name`` (its Python name by default); whether it was."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        raw = (name or threading.current_thread().name).encode()[:15]
        return libc.prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc to ask: the name is a convenience only
        return False


def named_pool(max_workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads (``name_0``, ``name_1``, ...) carry their names for the system too."""
    return ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name, initializer=name_os_thread)
