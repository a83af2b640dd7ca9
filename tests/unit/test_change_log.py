"""The change log: a write is one durable line, in order, applied whole or not at all, with several writers."""

from __future__ import annotations

import asyncio
import errno
import json
import multiprocessing
import os
import random

import pytest
from starlette.requests import Request

from deployments.edge.errors import status_of
from deployments.edge.http import app
from index_format.change_log import (
    LEGACY_NAME,
    SEGMENT_BYTES,
    Change,
    ChangeLog,
    LogCorrupt,
    LogFull,
    WriteNotStored,
    segments,
)


def doc(i: int) -> dict:
    return {"id": f"d{i}", "title": "", "text": f"text {i}", "metadata": {}}


def test_writes_get_gapless_sequence_numbers_and_a_reader_sees_them_in_order(tmp_path):
    log = ChangeLog(tmp_path)
    first, _ = log.append([doc(1), doc(2)], [])
    second, _ = log.append([], ["d1"], by="k1")
    assert (first.seq, second.seq) == (1, 2)
    reader = ChangeLog(tmp_path)
    got = reader.read_new()
    assert [(c.seq, [d["id"] for d in c.upserts], c.deletes, c.by) for c in got] == [
        (1, ["d1", "d2"], [], None), (2, [], ["d1"], "k1")]
    assert reader.read_new() == []  # nothing new
    third, _ = log.append([doc(3)], [])
    assert [c.seq for c in reader.read_new()] == [3] and third.seq == 3


def test_a_torn_tail_is_never_read_and_the_next_writer_cuts_it_off(tmp_path):
    log = ChangeLog(tmp_path)
    log.append([doc(1)], [])
    torn = Change(2, [doc(2) | {"text": "long " * 100}]).line()[:-7]  # a writer killed mid-line: no newline
    with open(log.path, "ab") as f:
        f.write(torn)
    reader = ChangeLog(tmp_path)
    assert [c.seq for c in reader.read_new()] == [1]  # the torn batch is not half-applied: not at all
    writer = ChangeLog(tmp_path)
    change, seen = writer.append([doc(3)], [])
    assert change.seq == 2 and [c.seq for c in seen] == [1]  # the torn line's number was never given out
    assert [(c.seq, c.upserts[0]["id"]) for c in reader.read_new()] == [(2, "d3")]
    assert log.path.read_bytes().count(b"\n") == 2 and log.path.read_bytes().endswith(b"\n")  # no torn bytes left


def test_a_write_that_fails_is_an_error_and_leaves_nothing(tmp_path, monkeypatch):
    log = ChangeLog(tmp_path)
    log.append([doc(1)], [])
    size = log.path.stat().st_size
    real = os.pwrite
    calls = []

    def short_then_full(fd, data, offset):
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, data[:5], offset)  # a short write: continued
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", short_then_full)
    with pytest.raises(LogFull, match="not stored"):
        log.append([doc(2)], [])
    monkeypatch.setattr(os, "pwrite", real)
    assert log.path.stat().st_size == size  # the 5 bytes written were cut off again
    assert log.append([doc(3)], [])[0].seq == 2
    assert [c.seq for c in ChangeLog(tmp_path).read_new()] == [1, 2]


@pytest.mark.parametrize(("code", "kind", "status"), [(errno.ENOSPC, LogFull, 507), (errno.EDQUOT, LogFull, 507),
                                                      (errno.EIO, WriteNotStored, 503)])
def test_a_write_not_stored_is_answered_as_the_service_answers_its_own(tmp_path, monkeypatch, code, kind, status):
    """The log raises its own kinds (the index format never imports the service); the edge's one table answers
    them as it answers the service's for the same case: 507 for a full disk, 503 and Retry-After for the rest."""
    log = ChangeLog(tmp_path)

    def refused(fd, data, offset):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "pwrite", refused)
    with pytest.raises(kind, match="not stored") as err:
        log.append([doc(1)], [])
    assert status_of(err.value) == status
    # As the app answers it: its handler is found the way Starlette finds one, along the error's class's MRO.
    handler = next(app.exception_handlers[k] for k in type(err.value).__mro__ if k in app.exception_handlers)
    response = asyncio.run(handler(Request({"type": "http", "headers": []}), err.value))
    assert response.status_code == status and json.loads(response.body)["error"].startswith("the write was not")
    assert response.headers.get("retry-after") == ("2" if status == 503 else None)


def test_a_log_out_of_order_is_corrupt_and_answered_as_the_servers_fault(tmp_path):
    (tmp_path / LEGACY_NAME).write_bytes(Change(1, [doc(1)]).line() + Change(3, [doc(3)]).line())
    reader = ChangeLog(tmp_path)
    assert [c.seq for c in reader.read_new()] == [1, 3]
    with open(tmp_path / LEGACY_NAME, "ab") as f:  # a line no writer would write: a seq already given out
        f.write(Change(2, [doc(2)]).line())
    with pytest.raises(LogCorrupt, match="sequence 2 after 3: the log is not in order") as err:
        reader.read_new()
    assert status_of(err.value) == 500


def _write_many(folder, who: str, n: int, go, segment_bytes: int = SEGMENT_BYTES) -> None:
    log = ChangeLog(folder, segment_bytes=segment_bytes)
    go.wait()  # every writer starts at once
    for i in range(n):
        log.append([{"id": f"{who}-{i}", "title": "", "text": "x" * (i * 37 % 900), "metadata": {}}], [])


@pytest.mark.parametrize("segment_bytes", [SEGMENT_BYTES, 4096])
def test_writers_in_several_processes_never_corrupt_the_log(tmp_path, segment_bytes):
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    procs = [ctx.Process(target=_write_many, args=(tmp_path, who, 60, go, segment_bytes)) for who in ("a", "b", "c")]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    changes = ChangeLog(tmp_path).read_new()
    assert [c.seq for c in changes] == list(range(1, 181))  # unique, gapless, in file order
    ids = [c.upserts[0]["id"] for c in changes]
    for who in "abc":  # each writer's own writes in its order
        assert [i for i in ids if i.startswith(who)] == [f"{who}-{i}" for i in range(60)]
    if segment_bytes < SEGMENT_BYTES:  # the writers rolled over into new segments as they went
        assert len(segments(tmp_path)) > 3


def test_a_group_of_changes_is_one_write_with_a_seq_each(tmp_path):
    log = ChangeLog(tmp_path)
    log.append([doc(1)], [])
    changes, seen = log.append_many([([doc(2)], [], "k1"), ([], ["d1"], None), ([doc(3), doc(4)], [], None)])
    assert [c.seq for c in changes] == [2, 3, 4] and seen == []
    assert [c.deletes for c in changes] == [[], ["d1"], []] and changes[0].by == "k1"
    assert [c.seq for c in ChangeLog(tmp_path).read_new()] == [1, 2, 3, 4]


# ---------------------------------------------------------------- segments


def test_writes_roll_over_into_segments_and_readers_follow_them(tmp_path):
    log = ChangeLog(tmp_path, segment_bytes=300)
    reader = ChangeLog(tmp_path)
    for i in range(1, 11):
        log.append([doc(i)], [])
    assert [c.seq for c in reader.read_new()] == list(range(1, 11))
    files = segments(tmp_path)
    assert len(files) >= 4 and all(p.stat().st_size < 300 + 200 for _, p in files)
    assert [first for first, _ in files][0] == 1
    other = ChangeLog(tmp_path, segment_bytes=300)  # a second writer that never read: it sees all, rolls on
    change, seen = other.append([doc(11)], [])
    assert change.seq == 11 and [c.seq for c in seen] == list(range(1, 11))
    for i in range(12, 20):
        log.append([doc(i)], [])
    assert [c.seq for c in reader.read_new()] == list(range(11, 20))  # across the segments started meanwhile
    assert [c.seq for c in ChangeLog(tmp_path).read_new()] == list(range(1, 20))


def test_a_reader_past_a_seq_opens_only_the_segments_holding_later_writes(tmp_path):
    log = ChangeLog(tmp_path, segment_bytes=300)
    for i in range(1, 13):
        log.append([doc(i)], [])
    files = segments(tmp_path)
    first_of_last = files[-1][0]
    for _, path in files[:-2]:  # what a reader past them must never open: it would fail to parse
        path.write_bytes(b"not json\n")
    after = first_of_last - 1
    got = ChangeLog(tmp_path, after=after).read_new()
    assert [c.seq for c in got] == list(range(after + 1, 13))
    within = files[-2][0] + 1  # inside the second-to-last segment: its earlier lines are passed over unparsed
    lines = files[-2][1].read_bytes().split(b"\n")
    lines[0] = lines[0][:lines[0].index(b",") + 1] + b" not json"
    files[-2][1].write_bytes(b"\n".join(lines))
    assert [c.seq for c in ChangeLog(tmp_path, after=within).read_new()] == list(range(within + 1, 13))
    with pytest.raises(LogCorrupt, match="a line that is not a change"):
        ChangeLog(tmp_path).read_new()  # (the broken segments are really there)


def test_a_log_written_before_segments_is_read_and_continued(tmp_path):
    (tmp_path / LEGACY_NAME).write_bytes(b"".join(Change(i, [doc(i)]).line() for i in range(1, 6)))
    reader = ChangeLog(tmp_path)
    assert [c.seq for c in reader.read_new()] == [1, 2, 3, 4, 5]
    log = ChangeLog(tmp_path, segment_bytes=100)  # the old file is already past it: the next write rolls over
    assert log.append([doc(6)], [])[0].seq == 6
    assert [p.name for _, p in segments(tmp_path)] == [LEGACY_NAME, "log-000000000006.jsonl"]
    assert [c.seq for c in reader.read_new()] == [6]
    assert [c.seq for c in ChangeLog(tmp_path, after=5).read_new()] == [6]


# ---------------------------------------------------------------- compaction


def _state(changes, state=None) -> dict:
    """Each document's text (None: deleted) after applying the changes in order, as the fresh segment does."""
    state = dict(state or {})
    for change in changes:
        for d in change.deletes:
            state[d] = None
        for r in change.upserts:
            state[r["id"]] = r["text"]
    return state


def test_compaction_keeps_each_documents_last_write_so_every_start_replays_the_same(tmp_path):
    rng = random.Random(7)
    log = ChangeLog(tmp_path, segment_bytes=2000)
    log.append([doc(99)], [])  # written once: kept in the compacted segment under seq 1
    for n in range(1, 300):  # batches rewriting and deleting 20 documents over and over
        ids = rng.sample(range(20), rng.randint(1, 3))
        upserts = [{"id": f"d{i}", "title": "", "text": f"v{n}", "metadata": {}} for i in ids[1:]]
        log.append(upserts, [f"d{ids[0]}"] if rng.random() < 0.3 else [])
    everything = ChangeLog(tmp_path).read_new()
    assert [c.seq for c in everything] == list(range(1, 301))
    final = _state(everything)
    laggards = []  # readers stopped inside closed segments when the compaction runs: the oldest (replaced under
    for at in (0, -2):  # its name by the compacted one) and the last closed one (removed)
        reader = ChangeLog(tmp_path)
        (reader.first, reader.path), inside = segments(tmp_path)[at], segments(tmp_path)[at][1].read_bytes()
        reader.offset = inside.index(b"\n", len(inside) // 2) + 1  # a line boundary inside it
        reader.inode = os.stat(reader.path).st_ino
        reader.last_seq = Change.parse(inside[:reader.offset].splitlines()[-1]).seq
        laggards.append((reader, [c for c in everything if c.seq <= reader.last_seq]))

    before = sum(p.stat().st_size for _, p in segments(tmp_path))
    summary = ChangeLog(tmp_path).compact()
    after = sum(p.stat().st_size for _, p in segments(tmp_path))
    assert summary.segments > 10 and after < before / 5 and summary.bytes_after < summary.bytes_before
    assert len(segments(tmp_path)) == 2  # the compacted one and the newest, still written to

    for start in (0, 1, 57, 150, 299, 300):  # every version, whatever it holds, ends with the same documents
        version = _state(c for c in everything if c.seq <= start)
        replayed = ChangeLog(tmp_path, after=start).read_new()
        assert all(c.seq > start for c in replayed)
        assert _state(replayed, version) == final, start
    deleted = [d for d, text in final.items() if text is None]
    assert deleted  # tombstones stay: a version built with the document must still lose it
    for reader, seen in laggards:  # each read the compacted segment again, skipping what it had read
        assert _state(seen + reader.read_new()) == final

    assert ChangeLog(tmp_path).compact().changes_dropped == 0  # nothing new to compact

    # A compaction that died after its rename, before removing what it had read: a closed segment read twice.
    newest = segments(tmp_path)[-1]
    leftover = tmp_path / f"log-{newest[0] - 5:012d}.jsonl"
    leftover.write_bytes(b"".join(c.line() for c in everything if newest[0] - 5 <= c.seq < newest[0]))
    assert _state(ChangeLog(tmp_path).read_new()) == final  # readers skip what they read already
    ChangeLog(tmp_path).compact()
    assert not leftover.exists() and _state(ChangeLog(tmp_path).read_new()) == final
    compacted = segments(tmp_path)[0][1].read_bytes().splitlines()
    seqs = [Change.parse(line).seq for line in compacted if line.strip()]
    assert seqs == sorted(set(seqs))  # each write once in the file, in order
    log.append([doc(1)], [])
    assert _state(ChangeLog(tmp_path).read_new()) == final | {"d1": "text 1"}
