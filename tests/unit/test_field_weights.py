"""Which BM25 fields a search scores: a request's weights against the version's fields, else the collection's."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from deployments.config import CollectionConfig
from deployments.edge.schemas import SearchRequest
from deployments.errors import InvalidRequest
from deployments.search.field_weights import held_weights, request_weights, version_fields

TITLED = version_fields({"k1": 0.9, "fields": {"title": {"doc_count": 3}}})
OLD = version_fields({"k1": 0.9})  # a version built before fields


def test_a_version_lists_contents_then_its_other_fields():
    assert TITLED == ("contents", "title")
    assert OLD == ("contents",)


def test_the_request_wins_over_the_collection():
    assert request_weights({"title": 2.0}, {"contents": 1.0, "title": 0.5}, TITLED, "c", "v1") == {"title": 2.0}
    assert request_weights(None, {"contents": 1.0, "title": 0.5}, TITLED, "c", "v1") == {"contents": 1.0,
                                                                                          "title": 0.5}
    assert request_weights(None, None, TITLED, "c", "v1") is None  # contents alone, as before fields


def test_a_field_the_version_lacks_is_refused_naming_the_fields_it_has():
    with pytest.raises(InvalidRequest, match=r"\['title'\].*'v0'.*BM25 fields: \['contents'\]"):
        request_weights({"contents": 1.0, "title": 0.5}, None, OLD, "c", "v0")


def test_all_zero_weights_are_refused():
    with pytest.raises(InvalidRequest, match="every field 0"):
        request_weights({"contents": 0.0, "title": 0.0}, None, TITLED, "c", "v1")


def test_a_collections_weights_keep_the_fields_the_version_has():
    assert held_weights({"contents": 1.0, "title": 0.5}, TITLED) == ({"contents": 1.0, "title": 0.5}, [])
    assert held_weights({"contents": 1.0, "title": 0.5}, OLD) == ({"contents": 1.0}, ["title"])
    assert held_weights({"title": 0.5}, OLD) == (None, ["title"])  # nothing left: contents alone
    assert held_weights(None, TITLED) == (None, [])


@pytest.mark.parametrize("weights", [{"title": -0.5}, {}, {"Title!": 1.0}, {"title": 1000.0}])
def test_the_schemas_bound_the_weights(weights):
    with pytest.raises(ValidationError):
        SearchRequest(query="q", field_weights=weights)
    with pytest.raises(ValidationError):
        CollectionConfig(index="idx", field_weights=weights)


def test_the_schemas_take_weights():
    assert SearchRequest(query="q", field_weights={"contents": 1, "title": 0.5}).field_weights == {"contents": 1.0,
                                                                                                  "title": 0.5}
    assert CollectionConfig(index="idx", field_weights={"title": 0.3}).field_weights == {"title": 0.3}
