"""POST /search/batch's items, Ray-free: each search checked as POST /search checks it, the answers put back in the
order sent, and the body written as the one ``json.dumps`` of its items would be."""

from __future__ import annotations

import json

import pytest

from deployments.api.batch import STREAM_REFUSED, answers_in_order, batch_json, checked, item
from deployments.edge.schemas import (
    Coverage,
    Result,
    SearchRequest,
    SearchResponse,
    StageScores,
    response_json,
)
from deployments.errors import DeadlineExceeded, UnknownCollection


def _response(query: str, rendered: bool = False) -> SearchResponse:
    results = [Result(rank=1, chunk_id="d1#0", doc_id="d1", collection="docs", content='a "quoted" text', source="d1",
                      title="T", section="", metadata={"year": 2020}, relevance_score=1.0, score=2.5,
                      scores=StageScores(keyword=2.5), char_start=0, char_end=15)]
    response = SearchResponse(query=query, method="keyword", method_used="keyword", results=[] if rendered else results,
                              total=1, total_results=1, index_version={"docs": "v1"}, timings_ms={"total": 1.0},
                              coverage=Coverage(shards_asked=1, shards_answered=1, ratio=1.0, degraded=False))
    if rendered:  # the results as a rendered search leaves them: JSON kept per chunk, the list empty
        response._results_json = json.dumps([r.model_dump(mode="json", exclude_none=True) for r in results])
    return response


def test_each_search_is_checked_on_its_own():
    checks = checked([{"query": "a"}, {"query": ""}, {"query": "b", "stream": True, "synthesize": True}, {"limit": 5}])
    assert isinstance(checks[0], SearchRequest) and checks[0].query == "a"
    assert checks[1]["status"] == 422 and checks[1]["error"] == "invalid request"
    assert [p["field"] for p in checks[1]["detail"]] == ["query"]
    assert checks[2] == {"status": 400, "error": STREAM_REFUSED}
    assert checks[3]["status"] == 422 and [p["field"] for p in checks[3]["detail"]] == ["query"]


def test_the_answers_go_back_where_their_searches_were_sent():
    checks = [{"status": 422}, SearchRequest(query="a"), {"status": 400}, SearchRequest(query="b")]
    a, b = _response("a"), DeadlineExceeded("too slow")
    assert answers_in_order(checks, [a, b]) == [{"status": 422}, a, {"status": 400}, b]


def test_each_items_status_is_the_one_its_search_alone_would_get():
    assert item(UnknownCollection("x", ["docs"])) == {
        "status": 404, "error": "unknown collection 'x'; known collections: docs"}
    assert item(DeadlineExceeded("too slow")) == {"status": 504, "error": "too slow"}
    assert item({"status": 400, "error": STREAM_REFUSED}) == {"status": 400, "error": STREAM_REFUSED}
    assert item(_response("a")) == {"status": 200, "response": json.loads(response_json(_response("a")))}


@pytest.mark.parametrize("rendered", [False, True])
def test_the_spliced_body_is_the_json_of_its_items(rendered):
    """The fast path (responses spliced in as the JSON they already are) against the plain one."""
    answers = [_response("a", rendered), {"status": 422, "error": "invalid request", "detail": [{"field": "query"}]},
               UnknownCollection("x", ["docs"]), _response('b "two"', rendered)]
    body = json.loads(batch_json(answers, 'rid-"1"'))
    assert body == {"responses": [item(a) for a in answers], "request_id": 'rid-"1"'}
    assert body["responses"][0]["response"]["results"][0]["content"] == 'a "quoted" text'
    assert json.loads(batch_json([], None)) == {"responses": [], "request_id": None}
