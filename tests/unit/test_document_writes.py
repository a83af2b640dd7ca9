"""The documents routes' work, Ray-free: the write ACL, the records of an upsert, when a fold is due, and the
refusals before anything is written (an unknown collection, a pinned one, a document the caller cannot find)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from deployments.documents.writes import DocumentWrites, checked_records, fold_due, may_write
from deployments.edge.errors import status_of
from deployments.edge.guard import Caller
from deployments.errors import Forbidden, InvalidField, ServiceError
from index_format.chunking import Chunking

SEARCH_KEY = Caller("k-search", ("t1",), admin=False, writer=False)
TENANT_WRITER = Caller("k-t1", ("t1", "staff"), admin=False, writer=True)
ADMIN = Caller("k-admin", ("t1",), admin=True, writer=True)
WRITER_WITHOUT_PRINCIPALS = Caller("k-w", (), admin=False, writer=True)


@pytest.mark.parametrize(("caller", "acl_field", "metadata", "allowed"), [
    (SEARCH_KEY, "acl", {"acl": "t1"}, False),  # a search key never writes
    (SEARCH_KEY, None, {}, False),
    (TENANT_WRITER, "acl", {"acl": "t1"}, True),
    (TENANT_WRITER, "acl", {"acl": ["t1", "staff"]}, True),  # only its principals
    (TENANT_WRITER, "acl", {"acl": ["t1", "t2"]}, False),  # one of another tenant's
    (TENANT_WRITER, "acl", {"acl": "public"}, False),  # made public: not its to do
    (TENANT_WRITER, "acl", {}, False),  # no ACL: seen by nobody, or by anybody later; refused
    (TENANT_WRITER, "acl", {"acl": 3}, False),  # neither a string nor a list: lists nothing
    (TENANT_WRITER, None, {"acl": "t2"}, True),  # no ACL field configured: no rule on values
    (ADMIN, "acl", {"acl": "t2"}, True),
    (WRITER_WITHOUT_PRINCIPALS, "acl", {"acl": "t2"}, True),
])
def test_the_write_acl(caller, acl_field, metadata, allowed):
    if allowed:
        may_write(caller, acl_field, "documents[0]", metadata)
    else:
        with pytest.raises(Forbidden) as e:
            may_write(caller, acl_field, "documents[0]", metadata)
        assert status_of(e.value) == 403


def test_a_refusal_names_the_record_the_rule_and_the_fix():
    with pytest.raises(Forbidden, match=r"documents\[2\]: its 'acl' must list only this key's principals \(t1, staff\);"
                                        r" it lists \['t2'\]"):
        may_write(TENANT_WRITER, "acl", "documents[2]", {"acl": "t2"})
    with pytest.raises(Forbidden, match="add its digest to security.write_key_digests"):
        may_write(SEARCH_KEY, "acl", "documents[0]", {"acl": "t1"})


def test_the_records_of_an_upsert():
    raw = [{"_id": 7, "title": "T", "text": " body ", "acl": "t1", "year": 2020},
           {"id": "b", "contents": "x", "metadata": {"acl": ["t1"]}}]
    assert checked_records(raw, Chunking(), TENANT_WRITER, "acl") == [
        {"id": "7", "title": "T", "text": "body", "metadata": {"acl": "t1", "year": 2020}},
        {"id": "b", "title": "", "text": "x", "metadata": {"acl": ["t1"]}},
    ]


@pytest.mark.parametrize(("raw", "error", "message"), [
    ([{"text": "no id"}], InvalidField, r"documents\[0\]: missing id"),
    ([{"_id": "a", "text": "x", "acl": "t1"}, {"_id": "a", "text": "y", "acl": "t1"}], InvalidField,
     r"documents\[1\]: id 'a' is given twice"),
    ([{"_id": "a\tb", "text": "x"}], InvalidField, r"documents\[0\]\.id .* control character"),
    ([{"_id": "a", "text": "x", "acl": "t1"}, {"_id": "b", "text": "y", "acl": "t2"}], Forbidden, r"documents\[1\]"),
])
def test_the_first_bad_record_refuses_the_batch(raw, error, message):
    with pytest.raises(error, match=message):
        checked_records(raw, Chunking(), TENANT_WRITER, "acl")


@pytest.mark.parametrize(("docs", "oldest", "after_docs", "after_s", "due"), [
    (0, None, 1, 1.0, False),  # an empty segment never is
    (10, 900.0, 10, None, True),  # 10 documents of 10
    (9, 900.0, 10, None, False),
    (1, 900.0, None, 100.0, True),  # the oldest write 1000 - 900 = 100 s old, of 100
    (1, 901.0, None, 100.0, False),  # 99 s
    (1, 901.0, 0, 0.0, False),  # both rules off
    (5, 950.0, 10, 100.0, False),  # neither
    (5, 850.0, 10, 100.0, True),  # either
])
def test_when_a_fold_is_due(docs, oldest, after_docs, after_s, due):
    assert fold_due(docs, oldest, after_docs, after_s, now=1000.0) is due


class Log:
    """A collection's documents (``CollectionDocuments``) as a stand-in: what it was asked to write."""

    def __init__(self):
        self.writes, self.segment = [], SimpleNamespace(chunking=Chunking())

    async def write(self, upserts, deletes, by):
        self.writes.append((upserts, deletes, by))
        return SimpleNamespace(seq=len(self.writes)), True


class Pipeline:
    """The search pipeline as a stand-in: two collections, one document in "docs" (another tenant's)."""

    def __init__(self):
        self.collections, self.acl_field = {"docs": object(), "pinned": object()}, "acl"

    async def document(self, collection, doc_id, principals):
        return {"id": "d1", "metadata": {"acl": "t2"}} if doc_id == "d1" else None


def _writes() -> tuple[DocumentWrites, Log]:
    log = Log()
    return DocumentWrites(Pipeline(), {"docs": log}), log


def test_writes_refused_before_anything_is_written():
    writes, log = _writes()
    cases = [
        (writes.upsert("nope", [{"_id": "a", "text": "x"}], ADMIN), 404,
         "unknown collection 'nope'; known collections: docs, pinned"),
        (writes.upsert("pinned", [{"_id": "a", "text": "x"}], ADMIN), 409, "pinned index version"),
        (writes.delete("docs", ["d1", "d9"], ADMIN), 404, "no document 'd9' in collection 'docs'; nothing was deleted"),
        (writes.delete("docs", ["d1"], TENANT_WRITER), 403, "document 'd1': its 'acl' must list only"),
        (writes.get("nope", "d1", ADMIN), 404, "unknown collection 'nope'"),
    ]
    for call, status, message in cases:
        with pytest.raises(ServiceError, match=message) as e:
            asyncio.run(call)
        assert status_of(e.value) == status
    assert log.writes == []


def test_an_upsert_and_a_delete_are_written_once_each():
    writes, log = _writes()
    done = asyncio.run(writes.upsert("docs", [{"_id": "a", "text": "x"}, {"_id": "b", "text": "y"}], ADMIN))
    assert (done.seq, done.upserted, done.deleted, done.searchable) == (1, 2, 0, True)
    done = asyncio.run(writes.delete("docs", ["d1", "d1"], ADMIN))  # an id given twice is deleted once
    assert (done.seq, done.upserted, done.deleted) == (2, 0, 1)
    assert [(len(u), d, by) for u, d, by in log.writes] == [(2, [], "k-admin"), (0, ["d1"], "k-admin")]
