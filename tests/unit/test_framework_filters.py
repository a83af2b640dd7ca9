"""Each framework's own filter objects, translated by ``raysearch_client.filters`` and evaluated by the API's filter
(``MetadataTable``, as a shard applies it), against the framework's own rule where it ships one: Haystack's
``document_matches_filter``, LlamaIndex's ``build_metadata_filter_fn`` (what ``SimpleVectorStore`` applies).
LangChain has no reference evaluator; its cases are those LangChain's SQL vector stores test against
(langchain-postgres' filtering fixtures, copied by langchain-mariadb), with their expected ids. Then each adapter
sends the translation (over a scripted transport) and refuses what it cannot translate before sending anything."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from haystack import Document
from haystack.utils.filters import document_matches_filter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)
from llama_index.core.vector_stores.utils import build_metadata_filter_fn
from raysearch_client import SearchClient
from raysearch_client.filters import from_haystack, from_langchain, from_llamaindex, haystack_selection

from deployments.shard.filters import FilterError, MetadataTable


def api_rows(api_filter: dict, metadatas: list[dict]) -> list[int]:
    """The rows the API's filter lets a search return (a field no row holds is missing from every row)."""
    allowed = MetadataTable(metadatas).searchable_rows(api_filter)
    return list(range(len(metadatas))) if allowed is None else allowed.tolist()


# --- LangChain ----------------------------------------------------------------------------------------------------

# langchain-postgres tests/unit_tests/fixtures/filtering_test_cases.py: the metadata and (filter, expected ids).
PG_METADATAS = [
    {"name": "adam", "date": "2021-01-01", "count": 1, "is_active": True, "tags": ["a", "b"], "location": [1.0, 2.0],
     "id": 1, "height": 10.0, "happiness": 0.9, "sadness": 0.1},
    {"name": "bob", "date": "2021-01-02", "count": 2, "is_active": False, "tags": ["b", "c"], "location": [2.0, 3.0],
     "id": 2, "height": 5.7, "happiness": 0.8, "sadness": 0.1},
    {"name": "jane", "date": "2021-01-01", "count": 3, "is_active": True, "tags": ["b", "d"], "location": [3.0, 4.0],
     "id": 3, "height": 2.4, "happiness": None},  # sadness missing
]
PG_CASES = [
    ({"id": 1}, [1]), ({"name": "adam"}, [1]), ({"is_active": True}, [1, 3]), ({"is_active": False}, [2]),
    ({"id": 1, "is_active": True}, [1]), ({"id": 1, "is_active": False}, []),
    ({"id": {"$ne": 1}}, [2, 3]), ({"id": {"$gt": 1}}, [2, 3]), ({"id": {"$gte": 1}}, [1, 2, 3]),
    ({"id": {"$lt": 1}}, []), ({"id": {"$lte": 1}}, [1]), ({"name": {"$eq": "adam"}}, [1]),
    ({"name": {"$ne": "adam"}}, [2, 3]), ({"is_active": {"$eq": True}}, [1, 3]), ({"is_active": {"$ne": True}}, [2]),
    ({"height": {"$gt": 5.0}}, [1, 2]), ({"height": {"$gte": 5.0}}, [1, 2]), ({"height": {"$lt": 5.0}}, [3]),
    ({"height": {"$lte": 5.8}}, [2, 3]),
    ({"$or": [{"id": 1}, {"id": 2}]}, [1, 2]), ({"$or": [{"id": 1}, {"name": "bob"}]}, [1, 2]),
    ({"$and": [{"id": 1}, {"id": 2}]}, []), ({"$or": [{"id": 1}, {"id": 2}, {"id": 3}]}, [1, 2, 3]),
    ({"$not": {"id": 1}}, [2, 3]), ({"$not": [{"id": 1}]}, [2, 3]), ({"$not": {"name": "adam"}}, [2, 3]),
    ({"$not": [{"name": "adam"}]}, [2, 3]), ({"$not": {"is_active": True}}, [2]), ({"$not": [{"is_active": True}]}, [2]),
    ({"$not": {"height": {"$gt": 5.0}}}, [3]), ({"$not": [{"height": {"$gt": 5.0}}]}, [3]),
    ({"name": {"$in": ["adam", "bob"]}}, [1, 2]), ({"id": {"$in": [1, 2]}}, [1, 2]),
    ({"name": {"$nin": ["adam", "bob"]}}, [3]), ({"id": {"$nin": [1, 2]}}, [3]),
    ({"sadness": {"$exists": False}}, [3]), ({"sadness": {"$exists": True}}, [1, 2]),
    ({"happiness": {"$exists": False}}, [3]),  # null is no value
]


@pytest.mark.parametrize(("filter_", "ids"), PG_CASES)
def test_langchain_filters_select_what_langchain_s_sql_stores_select(filter_, ids):
    rows = api_rows(from_langchain(filter_), PG_METADATAS)
    assert [PG_METADATAS[r]["id"] for r in rows] == ids


@pytest.mark.parametrize(("filter_", "api"), [
    ({"id": {"$in": [1, 2]}, "name": "adam"}, {"id": {"in": [1, 2]}, "name": "adam"}),
    ({"$and": [{"name": {"$eq": "adam"}}, {"is_active": {"$ne": True}}]},
     {"$and": [{"name": {"eq": "adam"}}, {"is_active": {"ne": True}}]}),
    ({"$not": [{"id": 1}, {"name": "bob"}]}, {"$not": {"$or": [{"id": 1}, {"name": "bob"}]}}),  # PGVector: none of them
    ({"height": {"$gte": 2, "$lt": 6}}, {"height": {"gte": 2, "lt": 6}}),  # several operators AND, as in the API
])
def test_langchain_translations(filter_, api):
    assert from_langchain(filter_) == api


def test_the_api_s_own_syntax_passes_through_unchanged():
    api = {"year": {"gte": 2005}, "topic": ["a", "b"], "lang": "en",
           "$or": [{"tags": {"nin": ["x"]}}, {"$not": {"draft": True}}], "$and": [{"year": {"lt": 2010}}]}
    assert from_langchain(api) == api


@pytest.mark.parametrize(("filter_", "named"), [
    ({"name": {"$like": "a%"}}, "'$like'"), ({"name": {"$ilike": "A%"}}, "'$ilike'"),
    ({"name": {"$nlike": "a%"}}, "'$nlike'"),
    ({"id": {"$between": [1, 2]}}, '"$gte": low, "$lte": high'), ({"tags": {"$contain": "a"}}, "'$contain'"),
    ({"$or": [{"id": 1}, {"name": {"$regex": "^a"}}]}, "'$regex'"),
    ({"$nor": [{"id": 1}]}, "unsupported LangChain logical operator '$nor'"),
    ({"$or": []}, "'$or' takes a non-empty list"), ({"$and": [{}]}, "each filter inside '$and' is a non-empty dict"),
    ({"id": {"$eq": 1, "eq": 2}}, "gives 'eq' twice"),
])
def test_langchain_operators_with_no_exact_equivalent_are_refused(filter_, named):
    with pytest.raises(ValueError, match="supported|takes|inside|twice") as err:
        from_langchain(filter_)
    assert named in str(err.value)


def test_a_callable_filter_is_refused():
    with pytest.raises(ValueError, match="callable filter"):
        from_langchain(lambda doc: True)


def test_string_ranges_are_refused_by_the_api():
    """PGVector orders strings (``{"name": {"$gt": "jane"}}``); the API's ranges take numbers and ISO dates only."""
    with pytest.raises(FilterError, match="range operators need a number or date field"):
        api_rows(from_langchain({"name": {"$gt": "jane"}}), PG_METADATAS)


def test_ne_matches_a_missing_field_as_in_chroma():
    """Row 3 has no ``sadness``: Chroma's $ne matches it (and the API's); PGVector's SQL (NULL <> 0.1) does not."""
    assert api_rows(from_langchain({"sadness": {"$ne": 0.1}}), PG_METADATAS) == [2]
    assert api_rows(from_langchain({"$not": {"sadness": {"$gt": 0}}}), PG_METADATAS) == [2]


# --- Haystack -----------------------------------------------------------------------------------------------------

DOCS_EXAMPLE = {  # https://docs.haystack.deepset.ai/docs/metadata-filtering
    "operator": "AND",
    "conditions": [
        {"field": "meta.type", "operator": "==", "value": "article"},
        {"field": "meta.date", "operator": ">=", "value": 1420066800},
        {"field": "meta.date", "operator": "<", "value": 1609455600},
        {"field": "meta.rating", "operator": ">=", "value": 3},
        {"operator": "OR", "conditions": [
            {"field": "meta.genre", "operator": "in", "value": ["economy", "politics"]},
            {"field": "meta.publisher", "operator": "==", "value": "nytimes"},
        ]},
    ],
}


def test_haystack_s_documented_example():
    assert from_haystack(DOCS_EXAMPLE) == {
        "type": {"eq": "article"}, "date": {"gte": 1420066800, "lt": 1609455600}, "rating": {"gte": 3},
        "$or": [{"genre": {"in": ["economy", "politics"]}}, {"publisher": {"eq": "nytimes"}}],
    }
    metas = [{"type": "article", "date": 1500000000, "rating": 4, "genre": "politics"},
             {"type": "article", "date": 1500000000, "rating": 4, "publisher": "nytimes", "genre": "sport"},
             {"type": "article", "date": 1700000000, "rating": 5, "genre": "economy"},
             {"type": "review", "date": 1500000000, "rating": 3, "publisher": "nytimes"}]
    docs = [Document(content="x", meta=m) for m in metas]
    assert api_rows(from_haystack(DOCS_EXAMPLE), metas) == [i for i, d in enumerate(docs)
                                                           if document_matches_filter(DOCS_EXAMPLE, d)] == [0, 1]


@pytest.mark.parametrize(("filters", "api"), [
    ({"field": "meta.year", "operator": "!=", "value": 2005}, {"year": {"ne": 2005}}),
    ({"field": "year", "operator": "not in", "value": [1, 2]}, {"year": {"nin": [1, 2]}}),  # a bare name is meta
    ({"operator": "NOT", "conditions": [{"field": "meta.topic", "operator": "==", "value": "x"}]},
     {"topic": {"ne": "x"}}),  # NOT of one eq is ne, the API's rule, a missing field included
    ({"operator": "NOT", "conditions": [{"field": "meta.a", "operator": ">", "value": 1},
                                        {"field": "meta.b", "operator": "==", "value": 2}]},
     {"$not": {"a": {"gt": 1}, "b": {"eq": 2}}}),  # not all of them
    ({"operator": "OR", "conditions": [{"operator": "OR", "conditions": [
        {"field": "meta.a", "operator": "==", "value": 1}, {"field": "meta.a", "operator": "==", "value": 2}]},
        {"field": "meta.b", "operator": "==", "value": 3}]},
     {"$or": [{"a": {"eq": 1}}, {"a": {"eq": 2}}, {"b": {"eq": 3}}]}),  # kept shallow
    ({"operator": "AND", "conditions": []}, {}),  # everything, as all([]) is
    ({"operator": "OR", "conditions": [{"operator": "OR", "conditions": []},  # nothing, dropped from an OR
                                       {"field": "meta.a", "operator": "<", "value": 1}]}, {"a": {"lt": 1}}),
])
def test_haystack_translations(filters, api):
    assert from_haystack(filters) == api


@pytest.mark.parametrize(("filters", "named"), [
    ({"field": "meta.name", "operator": "like", "value": "a%"}, "unsupported Haystack comparison operator 'like'"),
    ({"operator": "XOR", "conditions": []}, "unsupported Haystack logical operator 'XOR'"),
    ({"field": "content", "operator": "==", "value": "x"}, "'content' is not metadata"),
    ({"field": "meta.author.name", "operator": "==", "value": "x"}, "'meta.author.name' names no top-level"),
    ({"field": "meta.year", "operator": "in", "value": 2005}, "takes a list of values"),
    ({"field": "meta.year", "operator": "not in", "value": (2005, 2006)}, "refuses any other iterable"),
    ({"field": "meta.year", "operator": "in", "value": [2005, None]}, "None among the values"),
    ({"field": "meta.year", "operator": ">", "value": None}, "matches nothing"),  # a search cannot say it
    ({"field": "meta.tags", "operator": "==", "value": ["a", "b"]}, "takes one value"),
    ({"operator": "NOT", "conditions": []}, "matches nothing"),
    ({"operator": "OR", "conditions": []}, "matches nothing"),
    ({"year": {"gte": 2005}}, "search_kwargs={'filters': ...}"),  # the API's syntax, given where Haystack's goes
])
def test_haystack_filters_with_no_exact_equivalent_are_refused(filters, named):
    with pytest.raises(ValueError) as err:
        from_haystack(filters)
    assert named in str(err.value)


HAYSTACK_POOLS = {"year": [1999, 2000, 2001.5, 2005, 2010], "topic": ["music", "sailing", "cooking"],
                  "published": ["2020-01-01", "2020-01-02T10:00:00", "2020-01-03T00:00:00+00:00",
                                "2019-12-31T23:00:00Z"], "draft": [True, False]}
HAYSTACK_EXTRA = {"year": [1998, 2005.0], "topic": ["nope"], "published": ["2020-01-02T10:00:00+00:00", "2018-05-05"],
                  "draft": [], "ghost": ["x"]}
RANGED = ("year", "published", "ghost")
HAYSTACK_ANCHOR = {"year": 2000, "topic": "music", "published": "2020-01-01", "draft": True}  # pins each field's kind


def haystack_comparison(field):
    value = st.sampled_from(HAYSTACK_POOLS.get(field, []) + HAYSTACK_EXTRA[field])
    ops = ["==", "!=", "in", "not in"] + ([">", ">=", "<", "<="] if field in RANGED else [])
    return st.sampled_from(ops).flatmap(lambda op: st.fixed_dictionaries({
        "field": st.just(f"meta.{field}"), "operator": st.just(op),
        "value": st.lists(value, max_size=3) if op in ("in", "not in") else
        st.one_of(value, st.none()) if op in ("==", "!=") else value}))


haystack_filters = st.recursive(
    st.sampled_from([*HAYSTACK_POOLS, "ghost"]).flatmap(haystack_comparison),
    lambda children: st.fixed_dictionaries({"operator": st.sampled_from(["AND", "OR", "NOT"]),
                                            "conditions": st.lists(children, min_size=1, max_size=3)}),
    max_leaves=8)
haystack_metas = st.lists(st.fixed_dictionaries({}, optional={
    f: st.one_of(st.none(), st.sampled_from(pool)) for f, pool in HAYSTACK_POOLS.items()}), min_size=3, max_size=10)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metas=haystack_metas, filters=haystack_filters)
def test_haystack_filters_select_what_document_matches_filter_selects(metas, filters):
    metas = [*metas, HAYSTACK_ANCHOR]
    docs = [Document(content="x", meta=m) for m in metas]
    assert api_rows(from_haystack(filters), metas) == [i for i, d in enumerate(docs)
                                                       if document_matches_filter(filters, d)]


NONE_METAS = [{"year": 1999}, {"year": 2010}, {"topic": "music"}, {}]


@pytest.mark.parametrize("filters", [
    *({"field": "meta.year", "operator": op, "value": None} for op in (">", ">=", "<", "<=")),
    {"operator": "NOT", "conditions": [{"field": "meta.year", "operator": "<=", "value": None}]},
    {"operator": "OR", "conditions": [{"field": "meta.year", "operator": ">", "value": None},
                                      {"field": "meta.topic", "operator": "==", "value": "music"}]},
    {"operator": "AND", "conditions": [{"field": "meta.year", "operator": ">=", "value": None},
                                       {"field": "meta.topic", "operator": "!=", "value": "music"}]},
    {"operator": "NOT", "conditions": [{"operator": "AND", "conditions": [
        {"field": "meta.year", "operator": "<", "value": None}, {"field": "meta.year", "operator": ">", "value": 2000}]}]},
])
def test_a_haystack_range_with_none_selects_what_document_matches_filter_selects(filters):
    """Haystack's ranges are false when either side is None: the selection is None (nothing) where the whole filter
    matches nothing, else an API filter selecting what Haystack selects."""
    docs = [Document(content="x", meta=m) for m in NONE_METAS]
    expected = [i for i, d in enumerate(docs) if document_matches_filter(filters, d)]
    selection = haystack_selection(filters)
    assert (api_rows(selection, NONE_METAS) if selection is not None else []) == expected


def test_where_haystack_differs_a_list_field():
    """Haystack's == compares a whole list; the API's eq matches a list field when any element does."""
    filters = {"field": "meta.tags", "operator": "==", "value": "a"}
    assert not document_matches_filter(filters, Document(content="x", meta={"tags": ["a", "b"]}))
    assert api_rows(from_haystack(filters), [{"tags": ["a", "b"]}]) == [0]


# --- LlamaIndex ---------------------------------------------------------------------------------------------------


def mf(key, value, op=FilterOperator.EQ):
    return MetadataFilter(key=key, value=value, operator=op)


@pytest.mark.parametrize(("filters", "api"), [
    (MetadataFilters(filters=[mf("year", 2005, FilterOperator.GTE), mf("year", 2010, FilterOperator.LT),
                              mf("topic", "music")]),
     {"year": {"gte": 2005, "lt": 2010}, "topic": {"eq": "music"}}),
    (MetadataFilters(filters=[mf("topic", "music"), mf("topic", ["a", "b"], FilterOperator.NIN)],
                     condition=FilterCondition.OR),
     {"$or": [{"topic": {"eq": "music"}}, {"topic": {"nin": ["a", "b"]}}]}),
    (MetadataFilters(filters=[mf("topic", "music"), mf("year", 2005, FilterOperator.GT)],
                     condition=FilterCondition.NOT),
     {"$not": {"$or": [{"topic": {"eq": "music"}}, {"year": {"gt": 2005}}]}}),  # none of them
    (MetadataFilters(filters=[mf("topic", "music")], condition=FilterCondition.NOT), {"topic": {"ne": "music"}}),
    (MetadataFilters(filters=[mf("tags", "a", FilterOperator.CONTAINS), mf("tags", ["b", "c"], FilterOperator.ANY)]),
     {"tags": {"eq": "a", "in": ["b", "c"]}}),
    (MetadataFilters(filters=[mf("tags", ["a", "b"], FilterOperator.ALL)]),
     {"tags": {"eq": "a"}, "$and": [{"tags": {"eq": "b"}}]}),
    (MetadataFilters(filters=[mf("lang", "en"), MetadataFilters(
        filters=[mf("year", 2000, FilterOperator.LT), mf("topic", "music")], condition=FilterCondition.OR)]),
     {"lang": {"eq": "en"}, "$or": [{"year": {"lt": 2000}}, {"topic": {"eq": "music"}}]}),
    (MetadataFilters(filters=[]), {}),
])
def test_llamaindex_translations(filters, api):
    assert from_llamaindex(filters) == api


@pytest.mark.parametrize("operator", [FilterOperator.TEXT_MATCH, FilterOperator.TEXT_MATCH_INSENSITIVE,
                                      FilterOperator.IS_EMPTY])
def test_llamaindex_operators_with_no_exact_equivalent_are_refused(operator):
    filters = MetadataFilters(filters=[mf("year", 2005, FilterOperator.GT), mf("title", "gzip", operator)])
    with pytest.raises(ValueError, match=f"unsupported LlamaIndex filter operator {operator.name} ") as err:
        from_llamaindex(filters)
    assert "on key 'title'" in str(err.value)


@pytest.mark.parametrize(("filters", "named"), [
    (MetadataFilters(filters=[mf("topic", "music", FilterOperator.IN)]), "IN on key 'topic' takes a list"),
    (MetadataFilters(filters=[mf("tags", ["a"])]), "EQ on key 'tags' takes one value"),
    (MetadataFilters(filters=[mf("tags", [], FilterOperator.ALL)]), "non-empty list"),
    (MetadataFilters(filters=[mf("year", None)]), "cannot test for a missing value"),
    ({"year": 2005}, "expected LlamaIndex MetadataFilters"),
])
def test_llamaindex_filters_refused_with_the_reason(filters, named):
    with pytest.raises(ValueError) as err:
        from_llamaindex(filters)
    assert named in str(err.value)


LI_POOLS = {"year": [1999, 2000, 2001.5, 2005], "topic": ["music", "sailing", "cooking"]}
LI_OPS = {"year": ["==", "!=", ">", ">=", "<", "<=", "in", "nin"], "topic": ["==", "!=", "in", "nin"],
          "tags": ["contains", "any", "all"]}  # on a list field only the array operators mean the same in both
LI_ANCHOR = {"year": 2000, "topic": "music", "tags": ["a"]}


def li_filter(key):
    pool = LI_POOLS.get(key, ["a", "b", "c", "z"])
    return st.sampled_from(LI_OPS[key]).flatmap(lambda op: (
        st.lists(st.sampled_from(pool), min_size=op == "all", max_size=3) if op in ("in", "nin", "any", "all")
        else st.sampled_from(pool)).map(lambda v: mf(key, v, FilterOperator(op))))


li_leaves = st.lists(st.sampled_from(sorted(LI_OPS)).flatmap(li_filter), min_size=0, max_size=3)
li_conditions = st.sampled_from([FilterCondition.AND, FilterCondition.OR, FilterCondition.NOT])
li_metas = st.lists(st.fixed_dictionaries({}, optional={
    "year": st.one_of(st.none(), st.sampled_from(LI_POOLS["year"])),
    "topic": st.one_of(st.none(), st.sampled_from(LI_POOLS["topic"])),
    "tags": st.lists(st.sampled_from(["a", "b", "c"]), max_size=3, unique=True)}), min_size=3, max_size=10)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metas=li_metas, leaves=li_leaves, condition=li_conditions)
def test_llamaindex_filters_select_what_the_in_memory_store_selects(metas, leaves, condition):
    metas = [*metas, LI_ANCHOR]
    filters = MetadataFilters(filters=leaves, condition=condition)
    matches = build_metadata_filter_fn(lambda i: metas[i], filters)
    assert api_rows(from_llamaindex(filters), metas) == [i for i in range(len(metas)) if matches(i)]


def llamaindex_rule(filters, metadata) -> bool:
    """Nested MetadataFilters, which the in-memory store refuses: each filter by the store's own function, combined
    by LlamaIndex's conditions (and: all, or: any, not: none)."""
    found = [llamaindex_rule(f, metadata) if isinstance(f, MetadataFilters)
             else build_metadata_filter_fn(lambda _: metadata, MetadataFilters(filters=[f]))("row") for f in filters.filters]
    if not found:
        return True
    return {"and": all, "or": any, "not": lambda xs: not any(xs)}[filters.condition.value](found)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metas=li_metas, filters=st.recursive(
    st.builds(lambda fs, c: MetadataFilters(filters=fs, condition=c), li_leaves, li_conditions),
    lambda children: st.builds(lambda fs, c: MetadataFilters(filters=fs, condition=c),
                               st.lists(st.one_of(children, st.sampled_from(sorted(LI_OPS)).flatmap(li_filter)),
                                        min_size=1, max_size=3), li_conditions),
    max_leaves=6))
def test_nested_llamaindex_filters_follow_llamaindex_s_conditions(metas, filters):
    metas = [*metas, LI_ANCHOR]
    expected = [i for i, m in enumerate(metas) if llamaindex_rule(filters, m)]
    try:
        api = from_llamaindex(filters)
    except ValueError as e:  # a NOT of filters that match everything: nothing, whatever the metadata
        assert "matches nothing" in str(e) and expected == []
        return
    assert api_rows(api, metas) == expected


def test_where_llamaindex_differs_contains_on_a_string_field():
    """CONTAINS is an array operator (LlamaIndex's definition), eq in the API; on a string field LlamaIndex's in-memory
    store tests a substring instead, which the API never does (TEXT_MATCH, which would say so, is refused)."""
    filters = MetadataFilters(filters=[mf("title", "zip", FilterOperator.CONTAINS)])
    assert build_metadata_filter_fn(lambda _: {"title": "gzip"}, filters)("row")
    assert api_rows(from_llamaindex(filters), [{"title": "gzip"}, {"title": "zip"}]) == [1]


# --- the adapters send the translation, and refuse before sending ------------------------------------------------

OK = {"query": "q", "method": "hybrid", "method_used": "hybrid", "results": [], "total": 0, "total_results": 0,
      "index_version": {"default": "v1"}, "timings_ms": {}, "coverage": {"shards_asked": 1, "shards_answered": 1,
                                                                          "ratio": 1.0, "degraded": False}}


def scripted(adapter):
    """The filters of each search the adapter sends, answered with an empty page."""
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.read()).get("filters"))
        return httpx.Response(200, json=OK)

    adapter._connection._sync = SearchClient("http://x", transport=httpx.MockTransport(handler))
    return sent


def test_the_langchain_adapters_send_langchain_s_filter_translated():
    from raysearch_client.langchain import RaySearchRetriever, RaySearchVectorStore

    retriever = RaySearchRetriever(url="http://x", search_kwargs={"filter": {"year": {"$gte": 2005}}})
    sent = scripted(retriever)
    retriever.invoke("q")
    retriever.invoke("q", filter={"$or": [{"topic": "music"}, {"year": {"$lt": 2000}}]})  # a call's filter wins
    retriever.invoke("q", filters={"topic": {"ne": "music"}})  # the API's own field, as it is
    assert sent == [{"year": {"gte": 2005}}, {"$or": [{"topic": "music"}, {"year": {"lt": 2000}}]},
                    {"topic": {"ne": "music"}}]

    store = RaySearchVectorStore(url="http://x", collection="notes")
    sent = scripted(store)
    store.similarity_search("q", k=2, filter={"kind": {"$in": ["notes", "other"]}})
    store.as_retriever(search_kwargs={"k": 1, "filter": {"$not": {"kind": "notes"}}}).invoke("q")
    store.max_marginal_relevance_search("q", k=2, filter={"n": {"$gt": 1}})
    store.similarity_search("q")
    assert sent == [{"kind": {"in": ["notes", "other"]}}, {"$not": {"kind": "notes"}}, {"n": {"gt": 1}}, None]
    with pytest.raises(ValueError, match="'\\$like'"):
        store.similarity_search("q", filter={"kind": {"$like": "no%"}})
    with pytest.raises(ValueError, match="'\\$regex'"):
        RaySearchRetriever(url="http://x", search_kwargs={"filter": {"kind": {"$regex": "x"}}})
    with pytest.raises(ValueError, match="give one"):
        retriever.invoke("q", filter={"a": 1}, filters={"b": 2})
    assert len(sent) == 4  # nothing more was sent


def test_the_haystack_component_sends_haystack_s_filters_translated():
    from raysearch_client.haystack import RaySearchRetriever

    component = RaySearchRetriever(url="http://x", search_kwargs={"filters": {"kind": "function"}})
    sent = scripted(component)
    component.run("q")  # the component's own search_kwargs, in the API's syntax
    component.run("q", filters={"operator": "AND", "conditions": [
        {"field": "meta.kind", "operator": "==", "value": "function"},
        {"field": "meta.year", "operator": ">=", "value": 2005}]})
    assert sent == [{"kind": "function"}, {"kind": {"eq": "function"}, "year": {"gte": 2005}}]
    with pytest.raises(ValueError, match="unsupported Haystack comparison operator 'like'"):
        component.run("q", filters={"field": "meta.kind", "operator": "like", "value": "f%"})
    with pytest.raises(ValueError, match="give one"):
        component.run("q", filters={"field": "meta.kind", "operator": "==", "value": "x"},
                      search_kwargs={"filters": {"kind": "y"}})
    assert len(sent) == 2


def test_the_llamaindex_retriever_sends_metadata_filters_translated():
    from raysearch_client.llamaindex import RaySearchRetriever

    filters = MetadataFilters(filters=[mf("kind", "class"), mf("year", 2005, FilterOperator.GTE)],
                              condition=FilterCondition.OR)
    retriever = RaySearchRetriever("http://x", filters=filters)
    sent = scripted(retriever)
    retriever.retrieve("q")
    assert sent == [{"$or": [{"kind": {"eq": "class"}}, {"year": {"gte": 2005}}]}]
    assert retriever.filters is filters
    with pytest.raises(ValueError, match="TEXT_MATCH"):
        RaySearchRetriever("http://x", filters=MetadataFilters(filters=[mf("t", "x", FilterOperator.TEXT_MATCH)]))
    with pytest.raises(ValueError, match="give one"):
        RaySearchRetriever("http://x", filters=filters, search_kwargs={"filters": {"kind": "class"}})


def test_the_translations_import_no_framework():
    code = ("import sys\n"
            "for name in ('langchain_core', 'haystack', 'llama_index', 'llama_index.core'):\n"
            "    sys.modules[name] = None\n"
            "import raysearch_client.filters\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('langchain_core', 'haystack', 'llama_index')"
            " and sys.modules[m] is not None))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="client")
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
