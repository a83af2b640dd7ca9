"""The change log of a collection whose index root is in object storage: ordered by the store, durable in it.

A cluster whose nodes share no disk has no file to ``flock`` and no file to append to. Its writes are ordered by
the one primitive every object store offers for this, a conditional create (``If-None-Match: *``): a group of
changes with sequence numbers ``n..m`` is one object, ``changes/log/<n>.jsonl``, created only if absent. A writer
that has read the log through ``n - 1`` creates ``<n>``; two writers racing for ``n`` cannot both succeed: the
loser reads what the winner wrote and tries the next name. So sequence numbers are unique, gapless and in object
order, a group is applied whole or not at all (an object is written atomically), and a write is acknowledged once
the store has it: killing the writer's process or its node loses nothing acknowledged, and no node owns the log
(Delta Lake commits its table log the same way). Any router replica on any node is a writer; there is no leader
to elect or to lose. The price is one PUT per group commit (milliseconds on S3; writes arriving together share it)
and a retry when two replicas write at the same moment.

Readers tail the log with a GET of the next name (``<last + 1>``, cheap, and a 404 is the common answer), and a
LIST of the names past their position when they start, and every ``LIST_EVERY`` empty polls: a reader left
behind by a compaction finds the name it waits for gone and is sent to the compacted object by the listing.

Compaction (a fold's, as ``index_format.change_log`` does for a folder's log): the log objects wholly at or before
a sequence number are rewritten into one ``changes/compacted/<last>.jsonl`` holding each document's last write in
them (under that write's seq), together with the previous compacted object, then removed. A reader starting
before ``<last>`` replays the compacted object, then the log after it: every document ends as the whole log
would leave it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from index_format.changes import (
    Change,
    ChangeLogLike,
    CompactionSummary,
    LogCorrupt,
    WriteNotStored,
    last_writes,
)
from index_format.store import Conflict, StoreError, open_store

LOG_PREFIX = "changes/log/"
COMPACTED_PREFIX = "changes/compacted/"
GROUP_LIMIT = 1024  # changes in one object at most: a reader starting at seq n lists from n - GROUP_LIMIT
LIST_EVERY = 10  # empty polls between two listings (a lagging reader finds a compaction within that many polls)
WRITE_TRIES = 100  # conflicts one group survives before it is reported as not stored


def object_name(first_seq: int) -> str:
    return f"{first_seq:012d}.jsonl"


class StoreChangeLog:
    """The change log of the index root ``root`` (a URL), read past ``after``; the same methods as ``ChangeLog``."""

    def __init__(self, root: str, after: int = 0):
        self.root = str(root)
        self.store = open_store(root)
        self.after = after
        self.last_seq = after  # every change through it has been read (returned, or at or before ``after``)
        self._placed = False  # the first read lists the log to find where to start
        self._empty_polls = 0
        self._lock = threading.Lock()

    def __getstate__(self):  # travels to another process as its root and position; the store is opened again
        return {"root": self.root, "after": self.after, "last_seq": self.last_seq}

    def __setstate__(self, state):
        self.__init__(state["root"], state["after"])
        self.last_seq = state["last_seq"]

    # ------------------------------------------------------------------ reading

    def read_new(self) -> list[Change]:
        """The changes written since the last call, by any writer on any node."""
        with self._lock:
            return self._read()

    def _read(self) -> list[Change]:
        out: list[Change] = []
        if not self._placed or self._empty_polls >= LIST_EVERY:
            out.extend(self._read_listed())
            self._placed, self._empty_polls = True, 0
        while True:
            data, _ = self.store.get_tagged(LOG_PREFIX + object_name(self.last_seq + 1))
            if data is None:
                self._empty_polls = 0 if out else self._empty_polls + 1
                return out
            out.extend(self._take(data, LOG_PREFIX + object_name(self.last_seq + 1)))

    def _read_listed(self) -> list[Change]:
        """What a listing shows past this reader: the compacted object if the log it needs was compacted away,
        then the log objects in order, from the one holding the next seq."""
        out: list[Change] = []
        want = self.last_seq + 1
        # Placed: every object through ``last_seq`` was read whole. Starting: the object holding ``want`` starts
        # at most GROUP_LIMIT before it.
        offset = self.last_seq if self._placed else max(want - GROUP_LIMIT, 0)
        firsts = sorted(int(k[len(LOG_PREFIX):].split(".")[0])
                        for k in self.store.list(LOG_PREFIX, offset=LOG_PREFIX + object_name(offset)))
        holding = [f for f in firsts if f <= want]
        firsts = holding[-1:] + [f for f in firsts if f > want]
        if not firsts or firsts[0] > want:  # the writes after this reader were compacted away (or there are none)
            compacted = sorted(self.store.list(COMPACTED_PREFIX))
            through = int(compacted[-1][len(COMPACTED_PREFIX):].split(".")[0]) if compacted else 0
            if through >= want:
                out.extend(self._take(self.store.get(compacted[-1]), compacted[-1], through=through))
        for first in firsts:
            if first > self.last_seq + 1:
                raise LogCorrupt(f"{self.root}/{LOG_PREFIX}: no object holds seq {self.last_seq + 1} (the next is "
                                 f"{object_name(first)}); was the log edited outside the service?")
            key = LOG_PREFIX + object_name(first)
            try:
                data = self.store.get(key)
            except FileNotFoundError:  # compacted away since the listing: the next listing places the reader
                self._empty_polls = LIST_EVERY
                return out
            out.extend(self._take(data, key))
        return out

    def _take(self, data: bytes, key: str, through: int | None = None) -> list[Change]:
        out = []
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                change = Change.parse(line)
            except (ValueError, KeyError, TypeError) as e:
                raise LogCorrupt(f"{self.root}/{key}: a line that is not a change ({e!r})") from None
            if change.seq <= self.last_seq:  # read already (or before ``after``)
                continue
            if through is None and change.seq != self.last_seq + 1:
                raise LogCorrupt(f"{self.root}/{key}: sequence {change.seq} after {self.last_seq}")
            self.last_seq = change.seq
            if change.seq > self.after:
                out.append(change)
        if through is not None:
            self.last_seq = max(self.last_seq, through)
        return out

    # ------------------------------------------------------------------ writing

    def append(self, upserts: Sequence[dict[str, Any]], deletes: Sequence[str], by: str | None = None
               ) -> tuple[Change, list[Change]]:
        changes, seen = self.append_many([(upserts, deletes, by)])
        return changes[0], seen

    def append_many(self, writes: Sequence[tuple[Sequence[dict[str, Any]], Sequence[str], str | None]]
                    ) -> tuple[list[Change], list[Change]]:
        """Store the changes (upserts, deletes, by), ``GROUP_LIMIT`` to an object, each created only if its name is
        free; returns them and what other writers stored first. Raises ``WriteNotStored`` when the store cannot be
        written: nothing of the group it was storing is then in the log."""
        import time

        stored: list[Change] = []
        seen: list[Change] = []
        with self._lock:
            for start in range(0, len(writes), GROUP_LIMIT):
                group = writes[start:start + GROUP_LIMIT]
                for _ in range(WRITE_TRIES):
                    try:
                        seen.extend(self._read())
                    except StoreError as e:
                        raise WriteNotStored(f"the write was not stored (nothing of it was applied): {e}") from None
                    now = time.time()
                    changes = [Change(self.last_seq + 1 + i, list(u), list(d), now, by)
                               for i, (u, d, by) in enumerate(group)]
                    try:
                        self.store.put_if(LOG_PREFIX + object_name(changes[0].seq),
                                          b"".join(c.line() for c in changes), None)
                    except Conflict:  # another writer took this seq: read what it wrote, then take the next
                        continue
                    except StoreError as e:
                        raise WriteNotStored(f"the write was not stored (nothing of it was applied): {e}") from None
                    self.last_seq = changes[-1].seq
                    stored.extend(changes)
                    break
                else:
                    raise WriteNotStored(f"the write was not stored: {WRITE_TRIES} other writers came first; retry")
        return stored, seen

    # ------------------------------------------------------------------ compaction

    def compact(self, through: int | None = None) -> CompactionSummary:
        """Rewrite the log objects wholly at or before ``through`` (default: all but the newest), with the
        compacted object before them, into one compacted object keeping each document's last write; then remove
        what it replaces. Readers are safe throughout: the new object exists before anything is removed."""
        listed = self.store.list(LOG_PREFIX)
        names = sorted(listed)
        firsts = [int(k[len(LOG_PREFIX):].split(".")[0]) for k in names]
        # An object is wholly at or before ``through`` when the next one starts at or before ``through + 1``.
        closed = [k for k, nxt in zip(names, firsts[1:], strict=False)
                  if through is None or nxt <= through + 1]
        if not closed:
            return CompactionSummary(0, 0, 0, 0)
        old = sorted(self.store.list(COMPACTED_PREFIX))  # the newest is the one readers use
        sources = old[-1:] + closed
        before = sum(listed[k] for k in closed) + sum(self.store.list(k).get(k, 0) for k in old[-1:])
        by_seq: dict[int, Change] = {}  # (a compaction that died before its removals left some lines twice)
        for key in sources:
            by_seq.update((c.seq, c) for c in map(Change.parse, filter(bytes.strip, self.store.get(key).splitlines())))
        changes = [by_seq[seq] for seq in sorted(by_seq)]
        kept = list(last_writes(lambda: changes))
        through_seq = firsts[len(closed)] - 1  # the last seq of the last closed object
        data = b"".join(c.line() for c in kept)
        self.store.put(COMPACTED_PREFIX + object_name(through_seq), data)
        self.store.delete([k for k in old if k != COMPACTED_PREFIX + object_name(through_seq)] + closed)
        return CompactionSummary(len(closed), before, len(data), len(changes) - len(kept))


def import_folder_log(root: str, old: ChangeLogLike) -> int:
    """Move a log kept on a node's disk (``old``: where a root in object storage kept its log before the log moved
    into the store) into the store as its compacted object, once, when the store holds no log yet: the writes it
    acknowledged stay searchable. Returns the changes imported."""
    store = open_store(root)
    if store.list(LOG_PREFIX) or store.list(COMPACTED_PREFIX):
        return 0
    changes = old.read_new()
    if not changes:
        return 0
    try:
        store.put_if(COMPACTED_PREFIX + object_name(changes[-1].seq), b"".join(c.line() for c in changes), None)
    except Conflict:  # another replica imported it first
        return 0
    return len(changes)
