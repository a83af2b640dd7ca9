"""The contract of a collection's change log, whatever keeps it: what a change is, what a log does, what it
raises, and the rule of compaction. Two logs keep it: a folder's segments (``index_format.change_log``) and object
storage's objects (``index_format.store_log``); ``index_format.collection_log.open_change_log`` gives a root's.

Every log orders writes by a sequence number, unique, gapless and never reused; a batch is applied whole or not at
all; a write is acknowledged only once it is durable; readers take changes in sequence order past where they are.

Compaction keeps each document's last write (its upsert, or its delete) under that write's seq, as Kafka's log
compaction does (``last_writes``). Whatever ``log_seq`` a reader starts from, replaying the compacted log leaves
every document as replaying the whole log would: a document's last write past the start is kept, and one written
last at or before it was in the version already.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class ChangeLogError(Exception):
    """What the change log cannot do (the base of the kinds below)."""


class WriteNotStored(ChangeLogError):
    """A write could not be made durable (an I/O error): nothing of it is in the log; the same write can succeed
    shortly."""


class LogFull(WriteNotStored):
    """A write found no room on disk (ENOSPC, EDQUOT): retrying will not help until space is freed."""


class LogCorrupt(ChangeLogError):
    """The log holds what no writer writes (a line that is not a change, sequence numbers out of order): it was
    edited or damaged outside the log; an operator must restore it."""


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


@dataclass(frozen=True)
class CompactionSummary:
    segments: int  # closed segments read
    bytes_before: int
    bytes_after: int
    changes_dropped: int  # changes whose every document was written again later


class ChangeLogLike(Protocol):
    """What the service and the fold ask of a collection's log, either kind."""

    after: int  # changes at or before it are not returned
    last_seq: int  # every change through it has been read

    def read_new(self) -> list[Change]:
        """The changes written since the last call (by any writer), in sequence order."""
        ...

    def append(self, upserts: Sequence[dict[str, Any]], deletes: Sequence[str], by: str | None = None) -> Change:
        """One write, durable before it returns (``WriteNotStored``, ``LogFull`` otherwise)."""
        ...

    def append_many(self, writes: Sequence[tuple[Sequence[dict[str, Any]], Sequence[str], str | None]]
                    ) -> list[Change]:
        """Several writes made durable together (a group commit), each its own seq."""
        ...

    def compact(self) -> CompactionSummary:
        ...


def last_writes(changes: Callable[[], Iterable[Change]]) -> Iterator[Change]:
    """The compaction rule: of ``changes`` (in seq order, read twice by calling it: memory grows with the documents,
    not the writes), each change holding only its documents that no later change writes again; changes left with
    none are dropped."""
    last: dict[str, int] = {}  # document id -> the seq of its last write
    for change in changes():
        for doc_id in change.deletes:
            last[doc_id] = change.seq
        for record in change.upserts:
            last[record["id"]] = change.seq
    for change in changes():
        upserts = [r for r in change.upserts if last[r["id"]] == change.seq]
        deletes = [d for d in change.deletes if last[d] == change.seq]
        if upserts or deletes:
            yield Change(change.seq, upserts, deletes, change.time, change.by)
