"""The change log: a write is one durable line, in order, applied whole or not at all, with several writers."""

from __future__ import annotations

import errno
import multiprocessing
import os

import pytest

from deployments.documents.log import Change, ChangeLog
from deployments.errors import StorageFull


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
    with pytest.raises(StorageFull, match="not stored"):
        log.append([doc(2)], [])
    monkeypatch.setattr(os, "pwrite", real)
    assert log.path.stat().st_size == size  # the 5 bytes written were cut off again
    assert log.append([doc(3)], [])[0].seq == 2
    assert [c.seq for c in ChangeLog(tmp_path).read_new()] == [1, 2]


def _write_many(folder, who: str, n: int, go) -> None:
    log = ChangeLog(folder)
    go.wait()  # every writer starts at once
    for i in range(n):
        log.append([{"id": f"{who}-{i}", "title": "", "text": "x" * (i * 37 % 900), "metadata": {}}], [])


def test_writers_in_several_processes_never_corrupt_the_log(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    procs = [ctx.Process(target=_write_many, args=(tmp_path, who, 60, go)) for who in ("a", "b", "c")]
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


def test_a_group_of_changes_is_one_write_with_a_seq_each(tmp_path):
    log = ChangeLog(tmp_path)
    log.append([doc(1)], [])
    changes, seen = log.append_many([([doc(2)], [], "k1"), ([], ["d1"], None), ([doc(3), doc(4)], [], None)])
    assert [c.seq for c in changes] == [2, 3, 4] and seen == []
    assert [c.deletes for c in changes] == [[], ["d1"], []] and changes[0].by == "k1"
    assert [c.seq for c in ChangeLog(tmp_path).read_new()] == [1, 2, 3, 4]
