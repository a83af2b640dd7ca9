"""Leases in a root's store: a holder's claim on something that lapses unless the holder renews it.

A lease is one small object, ``leases/<kind>/<subject>/<holder>.json``, written by its holder when it takes it and
rewritten every third of its time to live by a thread of the holder's process; released, it is deleted. A holder
that dies (its process, its node) stops renewing, and its lease lapses ``ttl_s`` after the last renewal: nothing is
held for ever by a process that is gone, and no one has to notice the death.

Whether a lease is live is judged on the store's clock alone: the time the store gave the lease's last write
against the time it gives a probe written just then (``store_now``). The clocks of the holders' machines never
enter it, so their skew cannot make a live lease look lapsed.

The root uses three kinds (``index_format.root``):

- ``version/<name>``: a process serving version ``<name>``; the version cannot be removed while one is live;
- ``publish/-``: a job (a build, a fold, ``add_encoder``) that may count on files already in the store and skip
  uploading them; garbage collection leaves every file while one is live;
- ``collect/-``: a garbage collection deleting files; a publish waits for it to end before it lists what is there.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from .store import Store

LEASES = "leases"
VERSION_TTL_S = 60.0  # a serving replica's lease on its version: removal waits at most this long after it dies
PUBLISH_TTL_S = 900.0  # a job's publish intent: renewed every 5 minutes, so a busy driver never lets it lapse
COLLECT_TTL_S = 120.0


def holder_id() -> str:
    """This process, readable (host and pid) and unique (a pid is reused; a random part is not)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def lease_prefix(kind: str, subject: str = "-") -> str:
    return f"{LEASES}/{kind}/{subject}/"


@dataclass(frozen=True)
class LiveLease:
    key: str
    holder: str
    host: str
    pid: int
    seconds_left: float


class Lease:
    """A lease this process holds until ``release`` (a context manager too). Renewed by a daemon thread; a renewal
    the store refuses is tried again at the next tick (the lease lapses only if the store stays unreachable for
    ``ttl_s``)."""

    def __init__(self, store: Store, kind: str, subject: str = "-", ttl_s: float = VERSION_TTL_S):
        self.store, self.ttl_s = store, ttl_s
        self.holder = holder_id()
        self.key = f"{lease_prefix(kind, subject)}{self.holder}.json"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        body = {"holder": self.holder, "host": socket.gethostname(), "pid": os.getpid(), "ttl_s": self.ttl_s}
        self.store.put(self.key, json.dumps(body).encode(), durable=False)

    def take(self) -> Lease:
        self._write()
        self._thread = threading.Thread(target=self._renew, name=f"lease {self.key}", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self._write()
            except Exception:  # noqa: BLE001 (the next tick tries again; the lease lapses only after ttl_s of this)
                continue

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):  # unreachable store: the lease lapses by itself in ttl_s
            self.store.delete([self.key])

    def __enter__(self) -> Lease:
        return self.take()

    def __exit__(self, *exc) -> None:
        self.release()


def store_now(store: Store) -> float:
    """The store's clock: the modification time it gives a probe written now (then deleted)."""
    folder = f"{LEASES}/clock/"
    key = f"{folder}{holder_id()}"
    store.put(key, b"", durable=False)
    try:
        return store.modified(folder)[key]
    finally:
        store.delete([key])


def live_leases(store: Store, kind: str, subject: str = "-", now: float | None = None) -> list[LiveLease]:
    """The leases of ``kind`` on ``subject`` still live by the store's clock (``now``: its reading, when taken)."""
    written = store.modified(lease_prefix(kind, subject))
    if not written:
        return []
    now = store_now(store) if now is None else now
    out = []
    for key, at in sorted(written.items()):
        data, _ = store.get_tagged(key)
        if data is None:
            continue  # released meanwhile
        body = json.loads(data)
        left = at + float(body.get("ttl_s", VERSION_TTL_S)) - now
        if left > 0:
            out.append(LiveLease(key, body.get("holder", "?"), body.get("host", "?"), int(body.get("pid", 0)), left))
    return out


def clear_lapsed(store: Store, kind: str, keep: str | None = None) -> int:
    """Delete the lapsed leases of ``kind`` (left by holders that died; never ``keep``); returns how many."""
    live = {keep}
    prefix = f"{LEASES}/{kind}/"
    keys = list(store.modified(prefix))
    now = store_now(store) if keys else 0.0  # one reading of the store's clock for every subject
    for subject in {k[len(prefix):].split("/", 1)[0] for k in keys}:
        live |= {lease.key for lease in live_leases(store, kind, subject, now)}
    doomed = [k for k in keys if k not in live]
    store.delete(doomed)
    return len(doomed)


def wait_until_none(store: Store, kind: str, subject: str = "-", timeout_s: float = COLLECT_TTL_S,
                    poll_s: float = 0.5) -> None:
    """Return once no lease of ``kind`` on ``subject`` is live (at most ``timeout_s``: then every one has lapsed)."""
    deadline = time.monotonic() + timeout_s
    while live_leases(store, kind, subject) and time.monotonic() < deadline:
        time.sleep(poll_s)
