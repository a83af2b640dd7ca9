"""The change log of a root in object storage (a local S3 server): gapless sequence numbers from conditional
creates, with writers racing on several threads and processes, readers starting anywhere, compaction under a
reader, a store that is down, and a log kept on a node's disk imported once. The folder log's segment roll-over
with a stale listing is at the end."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from index_format import change_log, store_log
from index_format.change_log import ChangeLog, WriteNotStored, segment_name, segments
from index_format.collection_log import open_change_log
from index_format.store import open_store
from index_format.store_log import COMPACTED_PREFIX, LOG_PREFIX, StoreChangeLog, object_name
from tests.unit.test_change_log import _state as replay  # each document's final text, as replaying leaves it


def doc(i: int | str, text: str = "") -> dict:
    return {"id": f"d{i}", "title": "", "text": text or f"text {i}", "metadata": {}}


def test_writers_that_read_nothing_get_the_next_seq_and_see_what_came_first(s3_root):
    a, b = open_change_log(s3_root), open_change_log(s3_root)
    assert isinstance(a, StoreChangeLog)
    first, seen = a.append([doc(1)], [])
    assert first.seq == 1 and seen == []
    second, seen = b.append([], ["d1"], by="k1")  # b never read: its create of seq 1 loses, it reads and goes on
    assert second.seq == 2 and [c.seq for c in seen] == [1]
    changes, seen = a.append_many([([doc(2)], [], None), ([doc(3)], [], "k2")])
    assert [c.seq for c in changes] == [3, 4] and [c.seq for c in seen] == [2]
    got = StoreChangeLog(s3_root).read_new()
    assert [(c.seq, c.deletes, c.by) for c in got] == [(1, [], None), (2, ["d1"], "k1"), (3, [], None), (4, [], "k2")]
    assert sorted(open_store(s3_root).list(LOG_PREFIX)) == [LOG_PREFIX + object_name(n) for n in (1, 2, 3)]


def _write(root: str, who: str, n: int, go) -> None:
    go.wait()
    log = StoreChangeLog(root)
    for i in range(n):
        log.append([doc(f"{who}-{i}")], [])


def test_writers_in_several_processes_and_threads_leave_one_gapless_log(s3_root):
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    procs = [ctx.Process(target=_write, args=(s3_root, who, 15, go)) for who in ("p", "q")]
    for p in procs:
        p.start()
    threads = [threading.Thread(target=_write, args=(s3_root, who, 15, go)) for who in ("t", "u")]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(120)
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    changes = StoreChangeLog(s3_root).read_new()
    assert [c.seq for c in changes] == list(range(1, 61))  # unique, gapless, in order
    ids = [c.upserts[0]["id"] for c in changes]
    for who in "pqtu":  # every acknowledged write once, each writer's in its own order
        assert [i for i in ids if i.startswith(f"d{who}")] == [f"d{who}-{i}" for i in range(15)]


def test_a_reader_starts_past_a_versions_seq_and_tails_the_writers(s3_root):
    log = StoreChangeLog(s3_root)
    log.append_many([([doc(i)], [], None) for i in range(1, 6)])  # seqs 1-5 in one object
    for i in range(6, 9):
        log.append([doc(i)], [])
    reader = StoreChangeLog(s3_root, after=3)  # inside the first object
    assert [c.seq for c in reader.read_new()] == [4, 5, 6, 7, 8]
    assert reader.read_new() == []
    log.append([doc(9)], [])
    assert [c.seq for c in reader.read_new()] == [9]
    assert StoreChangeLog(s3_root, after=9).read_new() == []


def test_compaction_keeps_each_documents_last_write_for_every_start_and_a_reader_left_behind(s3_root, monkeypatch):
    monkeypatch.setattr(store_log, "LIST_EVERY", 2)
    log = StoreChangeLog(s3_root)
    writes = [([doc(i % 4, f"v{i}")], [], None) for i in range(1, 13)] + [([], ["d1"], None)]
    for w in writes:
        log.append_many([w])
    behind = StoreChangeLog(s3_root)
    behind_got = [c for c in behind.read_new() if c.seq <= 13]
    assert len(behind_got) == 13
    every = {after: replay(c for c in StoreChangeLog(s3_root).read_new() if c.seq > after) for after in (0, 5, 11)}
    summary = log.compact(through=11)
    assert summary.segments == 11 and summary.changes_dropped > 0
    assert sorted(open_store(s3_root).list(COMPACTED_PREFIX)) == [COMPACTED_PREFIX + object_name(11)]
    assert sorted(open_store(s3_root).list(LOG_PREFIX)) == [LOG_PREFIX + object_name(n) for n in (12, 13)]
    for after, want in every.items():  # every start replays to the same documents as the whole log
        assert replay(StoreChangeLog(s3_root, after=after).read_new()) == want
    log.append([doc(7)], [])
    log.compact()  # the previous compaction's object is merged into the new one
    assert sorted(open_store(s3_root).list(COMPACTED_PREFIX)) == [COMPACTED_PREFIX + object_name(13)]
    assert [c.seq for c in StoreChangeLog(s3_root).read_new()][-1] == 14
    assert replay(StoreChangeLog(s3_root).read_new()) == every[0] | {"d7": "text 7"}
    # A reader that had read through 13 before both compactions goes on from 14.
    got = []
    for _ in range(3):
        got += behind.read_new()
    assert [c.seq for c in got] == [14]


def test_a_store_that_is_down_stores_nothing_and_says_so(s3_server):
    log = StoreChangeLog("s3://no-such-bucket-here/idx")
    with pytest.raises(WriteNotStored, match="not stored"):
        log.append([doc(1)], [])


def test_a_log_kept_on_the_nodes_disk_by_an_earlier_release_is_imported_once(s3_root, tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSEARCH_STATE", str(tmp_path / "state"))
    from index_format.versions import state_dir

    old = ChangeLog(state_dir(s3_root) / change_log.CHANGES_DIR)
    for i in range(1, 4):
        old.append([doc(i)], [])
    log = open_change_log(s3_root)
    assert [c.seq for c in log.read_new()] == [1, 2, 3]
    change, _ = log.append([doc(4)], [])
    assert change.seq == 4
    old.append([doc(99)], [])  # not imported again: the store's log is the log now
    assert [c.seq for c in open_change_log(s3_root).read_new()] == [1, 2, 3, 4]


def test_a_folder_writer_with_a_stale_listing_never_reuses_a_segment_name(tmp_path, monkeypatch):
    """Two writers on a file system whose locks do not reach across machines: the second, with a listing taken
    before the first started a new segment, would reopen that segment and overwrite its acknowledged line."""
    a, b = ChangeLog(tmp_path, segment_bytes=200), ChangeLog(tmp_path, segment_bytes=200)
    for i in range(1, 3):  # two lines fill the first segment
        a.append([doc(i, "x" * 60)], [])
    b.read_new()  # b has read the full segment
    full = segments(tmp_path)
    assert len(full) == 1 and full[0][1].stat().st_size >= 200
    mine, _ = a.append([doc("a", "acknowledged")], [])  # a starts segment 3
    assert (tmp_path / segment_name(3)).exists()
    stale = iter([full, full])  # what b lists first (before its writes and in its read)
    real = change_log.segments
    monkeypatch.setattr(change_log, "segments", lambda folder: next(stale, None) or real(folder))
    monkeypatch.setattr(ChangeLog, "_writers_turn", lambda self: threading.Lock())  # the lock does not hold
    theirs, seen = b.append([doc("b")], [])
    assert (mine.seq, theirs.seq) == (3, 4) and [c.seq for c in seen] == [3]
    assert [(c.seq, c.upserts[0]["id"]) for c in ChangeLog(tmp_path).read_new()][-2:] == [(3, "da"), (4, "db")]
