"""A replica's log file, written without measuring every line twice.

Serve writes a replica's lines through Python's ``RotatingFileHandler``, whose ``shouldRollover`` runs before every
line: it asks the file system twice whether the file is a regular one, formats the line (Serve's JSON) to learn its
length, and seeks to the end; then ``emit`` formats it again to write it. The router writes a line for every search,
so that check was about 0.27 ms of a search's CPU in a loaded replica, more than the write (bench/README.md, "A
page's scores, the log line and the metrics").

``cheaper_rollover`` gives the handlers of Serve's logger in this process a check that asks the stream where it is
(the size written so far, from the open file: no syscall beyond a seek of the buffered stream) and rolls over once
that reaches the handler's ``maxBytes``. What changes: a file rolls over after the line that takes it past
``maxBytes`` instead of before, so it may end one line longer. A handler whose stream cannot seek (not a regular file:
what the check's first two questions were for) never rolls over, as before.
"""

from __future__ import annotations

import logging
import logging.handlers


def cheaper_rollover(logger_name: str = "ray.serve") -> int:
    """Every rotating file handler of ``logger_name`` (as Serve wraps them: behind a ``MemoryHandler``) given the
    cheaper check; how many were."""
    changed = 0
    for handler in logging.getLogger(logger_name).handlers:
        target = getattr(handler, "target", handler)
        if isinstance(target, logging.handlers.RotatingFileHandler) and target.maxBytes > 0:
            target.shouldRollover = _check_of(target)
            changed += 1
    return changed


def _check_of(handler: logging.handlers.RotatingFileHandler):
    def should_rollover(record: logging.LogRecord) -> bool:  # noqa: ARG001 - the handler's signature
        stream = handler.stream
        if stream is None:  # closed, or opened lazily: the next emit opens it; nothing written to measure yet
            return False
        try:
            return stream.seekable() and stream.tell() >= handler.maxBytes
        except (OSError, ValueError):  # closed under us, or not a file whose size means anything
            return False

    return should_rollover
