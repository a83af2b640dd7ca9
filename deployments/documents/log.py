"""The change log of a collection's documents: durable before acknowledged, one line per write, in order.

Every write (a batch of upserts and deletes) is one JSON line, ``{"seq": n, ...}``, appended with one
``write`` and made durable with ``fsync`` before the caller is answered: a write the client was told about
survives a crash of the process, the replica or the machine. The line is the unit of atomicity: a batch is
applied whole or not at all, because a line is complete only once its final newline is on disk, and a reader
takes complete lines only. A writer killed mid-line leaves a torn tail (no newline): never acknowledged,
never read, and cut off by the next writer before it appends.

Several router replicas (processes, possibly on several machines sharing the index root's file system) may
write the same collection: a writer holds an exclusive ``flock`` on the file from reading the last sequence
number to its ``fsync``, so sequence numbers are unique, gapless and in file order. Readers take no lock: they
read up to the last newline, so a line being written is read on a later poll. A sequence number is never
reused, so a change is applied once: a reader applies only what is past the last number it applied.

This is the log alone (``ChangeLog``); ``deployments.documents.segment`` keeps what it holds searchable.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployments.errors import StorageFull, Unavailable
from index_format.versions import fsync_dir

LOG_NAME = "log.jsonl"
CHANGES_DIR = "changes"  # beside the versions in an index root: <root>/changes/log.jsonl


@dataclass(frozen=True)
class Change:
    """One acknowledged write: its sequence number, the documents it upserts (records as the index reads
    them: id, title, text, metadata) and the ids it deletes, when and by whom (a key id, or None)."""

    seq: int
    upserts: list[dict[str, Any]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    time: float = 0.0
    by: str | None = None

    def line(self) -> bytes:
        body = {"seq": self.seq, "time": self.time, "by": self.by, "upserts": self.upserts, "deletes": self.deletes}
        return (json.dumps(body, ensure_ascii=False, separators=(",", ":")) + "\n").encode()

    @classmethod
    def parse(cls, line: bytes) -> Change:
        body = json.loads(line)
        return cls(seq=int(body["seq"]), upserts=list(body.get("upserts") or []),
                   deletes=[str(d) for d in body.get("deletes") or []], time=float(body.get("time") or 0.0),
                   by=body.get("by"))


class ChangeLog:
    """The append-only log of one collection, ``<folder>/log.jsonl``."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / LOG_NAME
        self.offset = 0  # bytes read so far: every line before it has been returned by ``read_new``
        self.last_seq = 0  # the last sequence number read
        self._lock = threading.Lock()  # a poll and a write of one process do not interleave their reads

    def __getstate__(self):  # a log travels to another process as its folder and how far it was read
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def read_new(self) -> list[Change]:
        """The changes written since the last call (by this process or another), complete lines only."""
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read()
            except FileNotFoundError:
                return []
            return self._take(data)

    def _take(self, data: bytes) -> list[Change]:
        end = data.rfind(b"\n") + 1  # a line still being written (or torn) waits
        out = []
        for line in data[:end].splitlines():
            if line.strip():
                change = Change.parse(line)
                if change.seq <= self.last_seq:
                    raise ValueError(f"{self.path}: sequence {change.seq} after {self.last_seq}: the log is not in "
                                     "order; was it edited by hand?")
                out.append(change)
                self.last_seq = change.seq
        self.offset += end
        return out

    def append(self, upserts: Sequence[dict[str, Any]], deletes: Sequence[str], by: str | None = None
               ) -> tuple[Change, list[Change]]:
        """Write one change durably and return it, with every change other writers made since this log's last
        read (in order, the new one last among all). Raises ``StorageFull`` or ``Unavailable`` when the line
        could not be made durable: nothing of it is then acknowledged, and nothing of it stays in the log."""
        changes, seen = self.append_many([(upserts, deletes, by)])
        return changes[0], seen

    def append_many(self, writes: Sequence[tuple[Sequence[dict[str, Any]], Sequence[str], str | None]]
                    ) -> tuple[list[Change], list[Change]]:
        """Several changes (upserts, deletes, by) made durable together, one line each in one write and one
        ``fsync`` (a group commit: writes that arrive together share the disk's flush); each line is still a
        change of its own, applied whole or not at all. Returns them, and what other writers wrote before."""
        with self._lock:
            return self._append(writes)

    def _append(self, writes) -> tuple[list[Change], list[Change]]:
        self.folder.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if created:
                fsync_dir(self.folder)  # the file's name is durable too
            fcntl.flock(fd, fcntl.LOCK_EX)  # one writer at a time, across processes
            size = os.fstat(fd).st_size
            data = os.pread(fd, size - self.offset, self.offset) if size > self.offset else b""
            seen = self._take(data)
            if self.offset < size:  # a torn tail: a writer died mid-line, unacknowledged; cut it off
                os.ftruncate(fd, self.offset)
            now = time.time()
            changes = [Change(self.last_seq + 1 + i, list(upserts), list(deletes), now, by)
                       for i, (upserts, deletes, by) in enumerate(writes)]
            data = b"".join(change.line() for change in changes)
            try:
                written = 0
                while written < len(data):  # a short write is continued, never left half
                    written += os.pwrite(fd, data[written:], self.offset + written)
                os.fsync(fd)
            except OSError as e:
                os.ftruncate(fd, self.offset)  # nothing of a failed write stays to be read
                kind = StorageFull if e.errno in (errno.ENOSPC, errno.EDQUOT) else Unavailable
                raise kind(f"the write was not stored (nothing of it was applied): {e.strerror or e}") from None
            self.offset += len(data)
            self.last_seq = changes[-1].seq
            return changes, seen
        finally:
            os.close(fd)  # closing releases the lock
