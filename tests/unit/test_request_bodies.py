"""Request bodies no field may hold are refused at the edge with the field's path (a 422), before any
stage could fail on them with a 500: lone surrogates, deep nesting, NaN and Infinity, huge numbers."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from deployments.edge.schemas import MAX_NESTING, ActivateRequest, FeedbackRequest, SearchRequest


def _nested(levels: int):
    value: object = 1
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize("body, where", [
    ({"query": "\ud800"}, "query: not valid Unicode"),
    ({"query": "ok", "filters": {"topic\udfff": "x"}}, "filters.topic"),
    ({"query": "ok", "conversation_history": ["fine", "bad \udc80"]}, "conversation_history[1]"),
    ({"query": "ok", "filters": _nested(300)}, f"nested more than {MAX_NESTING} levels"),
    ({"query": "ok", "filters": {"year": {"gte": float("nan")}}}, "filters.year.gte: NaN"),
    ({"query": "ok", "mmr_lambda": float("inf")}, "mmr_lambda: NaN and Infinity"),
    ({"query": "ok", "filters": {"year": 10**400}}, "filters.year: "),
    ({"query": "ok", "limit": 10**30}, "limit: "),
])
def test_unservable_bodies_are_refused_with_the_field(body, where):
    with pytest.raises(ValidationError, match=None) as err:
        SearchRequest.model_validate(body)
    assert where in str(err.value)


def test_what_json_decodes_to_is_checked_the_same_way():
    # What a client sends on the wire: the surrogate as an escape, NaN as a bare token.
    for raw in ('{"query": "\\ud800"}', '{"query": "x", "min_relevance_score": NaN}'):
        with pytest.raises(ValidationError):
            SearchRequest.model_validate(json.loads(raw))


def test_other_bodies_are_checked_too_and_ordinary_ones_pass():
    with pytest.raises(ValidationError, match="not valid Unicode"):
        FeedbackRequest.model_validate({"query": "q", "doc_id": "d\ud800", "label": 1})
    with pytest.raises(ValidationError, match="not valid Unicode"):
        ActivateRequest.model_validate({"version": "\ud800"})
    ok = SearchRequest.model_validate({"query": "naïve café ☕ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "filters": {
        "year": {"gte": 2010, "lt": 2020.5}, "topic": ["a", "b"], "tags": {"in": [["x"]]}}, "limit": 100})
    assert ok.limit == 100
