"""POST /feedback and GET /feedback/qrels, Ray-free: a judgment belongs to the caller's key, only a document the
caller can see is judged, and a tenant reads back its own judgments; an unknown collection is the one 404."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from deployments.api.feedback import Feedback
from deployments.edge.errors import status_of
from deployments.edge.guard import Caller
from deployments.edge.schemas import FeedbackRequest
from deployments.errors import ServiceError, UnknownCollection
from deployments.judgments import JudgmentStore, query_id
from deployments.search.clients import collection

T1 = Caller("k1", ("t1",), admin=False, writer=False)
T2 = Caller("k2", ("t2",), admin=False, writer=False)


class Pipeline:
    """The search pipeline as a stand-in: in "docs", d1 is seen by t1 only; d2 by everyone."""

    default_collection = "docs"

    async def can_see(self, collection, doc_id, chunk_id, principals):
        return doc_id == "d2" or (doc_id == "d1" and "t1" in principals)


def _feedback(tmp_path, keys_on: bool = True) -> Feedback:
    return Feedback(Pipeline(), {"docs": JudgmentStore(tmp_path / "docs"), "news": JudgmentStore(tmp_path / "news")},
                    keys_on)


def test_a_judgment_belongs_to_the_key_and_is_read_back_by_its_tenant(tmp_path):
    feedback = _feedback(tmp_path)
    done = asyncio.run(feedback.add(FeedbackRequest(query="q", chunk_id="d1#3", label=2), T1))
    assert (done.collection, done.doc_id, done.query_id, done.label) == ("docs", "d1", query_id("q"), 2)
    asyncio.run(feedback.add(FeedbackRequest(query="r", doc_id="d2", label=1, tenant="t2"), T2))
    record = feedback.stores["docs"].records()[1]
    assert (record["caller"], record["principals"], record["tenant"]) == ("k2", ["t2"], None)  # keys on: the key's
    assert asyncio.run(feedback.qrels(None, T1)) == (f"query-id\tcorpus-id\tscore\n{query_id('q')}\td1\t2\n", 0)
    assert asyncio.run(feedback.qrels("news", T1)) == ("query-id\tcorpus-id\tscore\n", 0)


@pytest.mark.parametrize(("body", "caller", "status", "message"), [
    ({"query": "q", "doc_id": "d1", "label": 1}, T2, 404, "no document 'd1' in collection 'docs'"),  # not its to see
    ({"query": "q", "chunk_id": "d9#0", "label": 1}, T1, 404, "no document 'd9' with chunk 'd9#0'"),
    ({"query": "q", "doc_id": "d2", "label": 1, "tenant": "t2"}, T1, 403, "tenant 't2' is not one of this API key's"),
    ({"query": "q", "doc_id": "d2", "label": 1, "collection": "nope"}, T1, 404,
     "unknown collection 'nope'; known collections: docs, news"),
])
def test_what_cannot_be_judged(tmp_path, body, caller, status, message):
    feedback = _feedback(tmp_path)
    with pytest.raises(ServiceError, match=message) as e:
        asyncio.run(feedback.add(FeedbackRequest(**body), caller))
    assert status_of(e.value) == status and feedback.stores["docs"].records() == []


def test_with_keys_off_the_tenant_is_kept_as_given(tmp_path):
    feedback = _feedback(tmp_path, keys_on=False)
    asyncio.run(feedback.add(FeedbackRequest(query="q", doc_id="d2", label=1, tenant="t9"), Caller()))
    assert feedback.stores["docs"].records()[0]["tenant"] == "t9"


def test_an_unknown_collection_is_one_404_listing_the_known_ones():
    assert collection({"b": 2, "a": 1}, "a") == 1
    with pytest.raises(UnknownCollection) as e:
        collection({"b": 2, "a": 1}, "c")
    assert str(e.value) == "unknown collection 'c'; known collections: a, b" and status_of(e.value) == 404
    again = pickle.loads(pickle.dumps(e.value))  # as it crosses processes
    assert type(again) is UnknownCollection and str(again) == str(e.value)
