"""Judgments: durable, safe under concurrent writers (separate processes), read back as qrels."""

from __future__ import annotations

import multiprocessing as mp

from deployments.edge.errors import status_of
from deployments.judgments import JudgmentStore, main, query_id
from index_format.chunk_ids import doc_of


def _write_many(folder: str, worker: int, n: int) -> None:
    store = JudgmentStore(folder)
    for i in range(n):
        store.add(f"query {worker}", f"d{i}", i % 4, chunk_id=f"d{i}#0", user=f"u{worker}")


def test_concurrent_writers_in_separate_processes_lose_nothing(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), w, 100)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    records = JudgmentStore(tmp_path).records()  # a new store: what a restarted service reads
    assert len(records) == 400
    assert sorted((r["user"], r["doc_id"]) for r in records) == sorted(
        (f"u{w}", f"d{i}") for w in range(4) for i in range(100))


def test_qrels_take_each_users_latest_label_and_average_across_users(tmp_path):
    store = JudgmentStore(tmp_path)
    store.add("What is BM25?", "d1", 0, user="ann")
    store.add("what is  bm25?", "d1", 3, user="ann")  # same query normalized; ann changed her mind
    store.add("What is BM25?", "d1", 1, user="bob")
    store.add("What is BM25?", "d2", 1)
    store.add("other query", "d9", 2, user="ann")
    texts, qrels = store.qrels()
    q = query_id("What is BM25?")
    assert qrels == {q: {"d1": 2, "d2": 1}, query_id("other query"): {"d9": 2}}  # (3 + 1) / 2 = 2
    assert texts[q] == "What is BM25?"


def test_export_writes_a_beir_folder(tmp_path, capsys):
    JudgmentStore(tmp_path / "root" / "judgments").add("telescope", doc_of("doc-7#2"), 1)
    assert main(["export", str(tmp_path / "root"), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "qrels" / "test.tsv").read_text().splitlines() == [
        "query-id\tcorpus-id\tscore", f"{query_id('telescope')}\tdoc-7\t1"]
    assert '"text": "telescope"' in (tmp_path / "out" / "queries.jsonl").read_text()
    assert "1 judgments of 1 queries" in capsys.readouterr().out


def test_ids_that_would_forge_qrels_rows_are_refused(tmp_path):
    import pytest

    from deployments.errors import ServiceError

    store = JudgmentStore(tmp_path)
    for doc_id, chunk_id in (("d1\tq-forged\td9\t3", None), ("d1\nq2\td2\t3", None), ("d1", "d1#0\r")):
        with pytest.raises(ServiceError, match="control character") as err:
            store.add("q", doc_id, 1, chunk_id=chunk_id)
        assert status_of(err.value) == 422
    assert store.records() == []


def test_torn_and_malformed_lines_are_skipped_and_counted_not_fatal(tmp_path):
    store = JudgmentStore(tmp_path)
    store.add("first", "d1", 1)
    with open(store.path, "a") as f:
        f.write('{"query_id": "q1", "doc_id": "d\\tforged", "query": "x", "label": 1}\n')  # written by hand
        f.write('{"query_id": "q2", "doc_id": "d2", "query": "x", "label": "high"}\n')
        f.write('{"query_id": "q3", "doc_id": "d3", "qu')  # a writer killed mid-line
    store.add("second", "d2", 2)  # starts a new line: the torn one does not swallow it
    assert [r["doc_id"] for r in store.records()] == ["d1", "d2"] and store.skipped == 3
    _, qrels = store.qrels()
    assert qrels == {query_id("first"): {"d1": 1}, query_id("second"): {"d2": 2}}


def test_a_write_the_disk_refuses_is_an_error_not_a_201(tmp_path):
    import os

    import pytest

    from deployments.errors import ServiceError

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    store = JudgmentStore(tmp_path)
    store.path.symlink_to("/dev/full")  # every write: ENOSPC
    with pytest.raises(ServiceError, match="not stored") as err:
        store.add("q", "d1", 1)
    assert status_of(err.value) == 507


def test_each_tenant_reads_back_only_the_judgments_of_its_keys(tmp_path):
    store = JudgmentStore(tmp_path)
    store.add("q one", "d1", 1, caller="k1", principals=["t1"])
    store.add("q two", "d2", 2, caller="k2", principals=["t2", "staff"])
    store.add("q three", "d3", 1, caller="k3", principals=["staff", "t2"])  # the same tenant, another key
    assert set(store.qrels(["t1"])[1]) == {query_id("q one")}
    assert set(store.qrels(["t2", "staff"])[1]) == {query_id("q two"), query_id("q three")}
    assert store.qrels(["t3"])[1] == {} and len(store.qrels()[1]) == 3  # None: everything (an admin, the export)
    assert store.records()[0]["caller"] == "k1" and store.records()[1]["principals"] == ["staff", "t2"]
