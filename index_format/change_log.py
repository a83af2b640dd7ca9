"""The change log of a collection's documents: durable before acknowledged, one line per write, in order.

Every write (a batch of upserts and deletes) is one JSON line, ``{"seq": n, ...}``, appended with one
``write`` and made durable with ``fsync`` before the caller is answered: a write the client was told about
survives a crash of the process, the replica or the machine. The line is the unit of atomicity: a batch is
applied whole or not at all, because a line is complete only once its final newline is on disk, and a reader
takes complete lines only. A writer killed mid-line leaves a torn tail (no newline): never acknowledged,
never read, and cut off by the next writer before it appends.

Several router replicas (processes, possibly on several machines sharing the index root's file system) may
write the same collection: a writer holds an exclusive ``flock`` on ``changes/lock`` from reading the last
sequence number to its ``fsync``, so sequence numbers are unique, gapless and in file order. Readers take no
lock: they read up to the last newline, so a line being written is read on a later poll. A sequence number is
never reused, so a change is applied once: a reader applies only what is past the last number it applied.

Segments. The log is a series of files, ``log-<first seq>.jsonl`` (Kafka's log segments, Elasticsearch's
translog generations); writers append to the newest and start a new one once it holds ``segment_bytes``
(64 MiB). A reader that needs only the writes past a version's ``log_seq`` opens the segment holding the next one
and those after it, so a replica starting on a folded version reads the writes that version lacks, not the
log's whole history. A log written before segments (one ``log.jsonl``) is read as the first segment.

Compaction (``compact``). The segments a writer no longer appends to are rewritten into one that keeps only each
document's last write (its upsert, or its delete) under that write's seq, as Kafka's log compaction does. Whatever
``log_seq`` a reader starts from, replaying the compacted log leaves every document as replaying the whole log
would: a document's last write past the start is kept, and one written last at or before it was in the version
already. So no version, however old, and no full build (``log_seq`` 0) loses a write, while the log stops growing
with rewrites of the same documents: it holds what the API wrote once per document, plus the newest segment.

A root in object storage keeps its log in the store instead (``index_format.store_log``: no node's disk, ordered by
conditional creates). Both keep one contract (``index_format.changes``); ``index_format.collection_log`` opens a
root's, either kind.

This is the log alone (``ChangeLog``), on disk beside the versions, so both sides use it: the service appends the
API's writes and keeps them searchable (``deployments.documents``), the job folds them into a version and compacts
the log (``index_build.fold``). What it cannot do it raises as its own kinds (``ChangeLogError``); the service's edge
answers each with a status (``deployments.edge.errors``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from index_format.changes import (
    Change,
    ChangeLogError,
    CompactionSummary,
    LogCorrupt,
    LogFull,
    WriteNotStored,
    last_writes,
)
from index_format.store import fsync_dir

__all__ = ["Change", "ChangeLogError", "CompactionSummary", "LogCorrupt", "LogFull", "WriteNotStored"]

CHANGES_DIR = "changes"  # beside the versions in an index root: <root>/changes/log-<first seq>.jsonl ...
LEGACY_NAME = "log.jsonl"  # the one file of a log written before segments: its first segment
LOCK_NAME = "lock"  # writers (and compaction) take turns on this file
SEGMENT_BYTES = 64 << 20  # a segment at or past this size is closed: the next write starts a new one
_SEGMENT = re.compile(r"log-(\d+)\.jsonl")
_SEQ_KEY = b'{"seq":'  # how ``Change.line`` starts every line


def segment_name(first_seq: int) -> str:
    return f"log-{first_seq:012d}.jsonl"


def segments(folder: Path) -> list[tuple[int, Path]]:
    """The log's segments as (first seq, path), oldest first. A segment's first seq sorts it: every line in it is
    at or after that seq and before the next segment's."""
    out = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    for name in names:
        m = _SEGMENT.fullmatch(name)
        if m:
            out.append((int(m.group(1)), Path(folder) / name))
        elif name == LEGACY_NAME:
            out.append((1, Path(folder) / name))
    return sorted(out)


class ChangeLog:
    """The append-only log of one collection: the segments in ``folder``.

    ``after``: the changes at or before it are not returned (a reader for a version that holds the log through
    ``log_seq``), and the segments wholly before it are not opened. ``segment_bytes``: the size past which a
    writer starts a new segment."""

    def __init__(self, folder: Path, after: int = 0, segment_bytes: int = SEGMENT_BYTES):
        self.folder = Path(folder)
        self.after = after
        self.segment_bytes = segment_bytes
        self.path: Path | None = None  # the segment being read (the newest, once everything is read)
        self.first = 0  # its first seq
        self.inode = 0  # its inode: a compaction replaces the file under the same name
        self.offset = 0  # bytes of it read so far: every line before it has been taken
        self.last_seq = 0  # the last sequence number read (returned or skipped as at or before ``after``)
        self._lock = threading.Lock()  # a poll and a write of one process do not interleave their reads

    def __getstate__(self):  # a log travels to another process as its folder and how far it was read
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ reading

    def read_new(self) -> list[Change]:
        """The changes written since the last call (by this process or another), complete lines only."""
        with self._lock:
            return self._read()

    def _read(self) -> list[Change]:
        out: list[Change] = []
        while True:
            listed = segments(self.folder)  # listed before reading: a segment closed by then is read to its end
            if not listed:
                return out
            if self.path is None or self.path not in {p for _, p in listed}:
                self._position(listed)
            try:
                with open(self.path, "rb") as f:
                    inode = os.fstat(f.fileno()).st_ino
                    if inode != self.inode:  # compacted (or first opened): its lines are read again from the start,
                        self.inode, self.offset = inode, 0  # those at or before the last seq read skipped
                    f.seek(self.offset)
                    data = f.read()
            except FileNotFoundError:  # compacted away meanwhile: the next listing places the reader again
                self.path = None
                continue
            later = [(first, path) for first, path in listed if first > self.first]
            out.extend(self._take(data))
            if not later:
                return out
            self.first, self.path = later[0]  # closed before the listing: everything in it has been taken
            self.inode = self.offset = 0

    def _position(self, listed: list[tuple[int, Path]]) -> None:
        """Start at the segment holding the first seq not read yet (the log's first one if none does)."""
        want = max(self.after, self.last_seq) + 1
        at = [s for s in listed if s[0] <= want]
        self.first, self.path = at[-1] if at else listed[0]
        self.inode = self.offset = 0

    def _take(self, data: bytes) -> list[Change]:
        end = data.rfind(b"\n") + 1  # a line still being written (or torn) waits
        out = []
        for line in data[:end].splitlines():
            if line.strip():
                if line.startswith(_SEQ_KEY):  # a line at or before ``after`` is passed over unparsed
                    seq = int(line[len(_SEQ_KEY):line.index(b",")])
                    if self.last_seq < seq <= self.after:
                        self.last_seq = seq
                        continue
                change = _parse(line, self.path)
                if change.seq <= self.last_seq:
                    if self.offset == 0 and self.last_seq >= self.first:  # a segment read again (compacted, or
                        continue  # the reader placed anew): what was read already is skipped
                    raise LogCorrupt(f"{self.path}: sequence {change.seq} after {self.last_seq}: the log is not in "
                                     "order; was it edited by hand? Restore the changes folder from a copy")
                self.last_seq = change.seq
                if change.seq > self.after:
                    out.append(change)
        self.offset += end
        return out

    # ------------------------------------------------------------------ writing

    def append(self, upserts: Sequence[dict[str, Any]], deletes: Sequence[str], by: str | None = None
               ) -> tuple[Change, list[Change]]:
        """Write one change durably and return it, with every change other writers made since this log's last
        read (in order, the new one last among all). Raises ``LogFull`` or ``WriteNotStored`` when the line
        could not be made durable: nothing of it is then acknowledged, and nothing of it stays in the log."""
        changes, seen = self.append_many([(upserts, deletes, by)])
        return changes[0], seen

    def append_many(self, writes: Sequence[tuple[Sequence[dict[str, Any]], Sequence[str], str | None]]
                    ) -> tuple[list[Change], list[Change]]:
        """Several changes (upserts, deletes, by) made durable together, one line each in one write and one
        ``fsync`` (a group commit: writes that arrive together share the disk's flush); each line is still a
        change of its own, applied whole or not at all. Returns them, and what other writers wrote before."""
        with self._lock, self._writers_turn():
            return self._append(writes)

    @contextlib.contextmanager
    def _writers_turn(self) -> Iterator[None]:
        """An exclusive ``flock`` on ``LOCK_NAME`` (made if missing), across processes, for a ``with`` block."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _append(self, writes) -> tuple[list[Change], list[Change]]:
        seen: list[Change] = []
        while True:
            written = self._append_once(writes, seen)
            if written is not None:
                return written, seen

    def _append_once(self, writes, seen: list[Change]) -> list[Change] | None:
        """Append after what this writer reads; None when another writer started the segment this one was about
        to start (its listing was stale: a lock the file system does not honour across machines), to read on and
        try again. A segment is only ever created exclusively, so no writer opens one another has written in."""
        if not segments(self.folder):
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.folder / segment_name(1), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644))
            fsync_dir(self.folder)  # the file's name is durable too
        seen.extend(self._read())  # to the end of the newest segment (no other writer can start one meanwhile)
        fd = os.open(self.path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if self.offset < size:  # a torn tail: a writer died mid-line, unacknowledged; cut it off
                os.ftruncate(fd, self.offset)
            if self.offset >= self.segment_bytes:  # full: the next segment starts with this write
                os.close(fd)
                fd = -1
                path = self.folder / segment_name(self.last_seq + 1)
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    return None
                fsync_dir(self.folder)
                self.first, self.path, self.inode, self.offset = self.last_seq + 1, path, os.fstat(fd).st_ino, 0
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
                kind = LogFull if e.errno in (errno.ENOSPC, errno.EDQUOT) else WriteNotStored
                raise kind(f"the write was not stored (nothing of it was applied): {e.strerror or e}") from None
            self.offset += len(data)
            self.last_seq = changes[-1].seq
            return changes
        finally:
            if fd >= 0:
                os.close(fd)

    # ------------------------------------------------------------------ compaction

    def compact(self) -> CompactionSummary:
        """Rewrite the closed segments (all but the newest) into one holding each document's last write in them,
        under that write's seq (a batch keeps those of its documents that no later write replaced). Readers are
        safe throughout: the compacted segment replaces the oldest under its name in one rename (a reader in it
        reads it again, skipping what it had read), then the others are removed (a reader in one moves on)."""
        with self._writers_turn():  # a writer closing a segment meanwhile would change which ones are closed
            listed = segments(self.folder)
        closed = listed[:-1]
        before = sum(p.stat().st_size for _, p in closed)
        if not closed or (len(closed) == 1 and _compacted(closed[0][1])):  # (a one-file log never starts so)
            return CompactionSummary(len(closed), before, before, 0)
        read = [0]  # changes in the closed segments (counted on each of the rule's two passes)

        def changes() -> Iterator[Change]:
            read[0] = 0
            for change in _changes_in(closed):
                read[0] += 1
                yield change

        first = closed[0][0]
        target = self.folder / segment_name(first)
        tmp = self.folder / f".compacting-{first}"
        kept = 0
        with open(tmp, "wb") as f:
            f.write(COMPACTED_MARK)
            for change in last_writes(changes):
                f.write(change.line())
                kept += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)  # the oldest segment's name, so the order of names holds throughout
        fsync_dir(self.folder)
        for _, path in closed:
            if path != target:
                path.unlink(missing_ok=True)
        fsync_dir(self.folder)
        return CompactionSummary(len(closed), before, target.stat().st_size, read[0] - kept)


COMPACTED_MARK = b"\n"  # a compacted segment starts with an empty line: it is not compacted again for nothing


def _changes_in(listed: list[tuple[int, Path]]):
    """The segments' changes in seq order, each once: a compaction that died after its rename but before removing
    the segments it had read leaves their lines in the compacted one too (readers skip them the same way)."""
    last = 0
    for _, path in listed:
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    change = _parse(line, path)
                    if change.seq > last:
                        last = change.seq
                        yield change


def _parse(line: bytes, path: Path) -> Change:
    try:
        return Change.parse(line)
    except (ValueError, KeyError, TypeError) as e:  # (json's errors are ValueErrors)
        raise LogCorrupt(f"{path}: a line that is not a change ({e!r}): {line[:80]!r}; was it edited by hand? "
                         "Restore the changes folder from a copy") from None


def _compacted(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(1) == COMPACTED_MARK
