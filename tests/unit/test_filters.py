import json
import random
import re
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployments.shard.filters import FilterError, MetadataTable, filter_conditions

ROWS = [
    {"year": 2001, "topic": "music", "tags": ["a", "b"], "published": "2020-01-31", "draft": False},
    {"year": 2005, "topic": "sailing", "tags": ["b"], "published": "2020-01-31T10:00:00Z", "draft": True},
    {"year": 2010.5, "topic": "music", "tags": [], "published": "2021-06-01T00:00:00+02:00"},
    {"topic": None, "tags": ["c", 3]},
    {"year": 2005, "topic": "cooking", "published": "2019-12-31"},
]
TABLE = MetadataTable(ROWS)


def rows(filter_):
    out = TABLE.allowed_rows(filter_)
    assert out.dtype == np.int64
    return out.tolist()


def test_field_kinds():
    table = MetadataTable([
        {"n": 1, "f": 1.5, "s": "x", "d": "2020-01-01", "t": "2020-01-01T00:00:00Z", "b": True, "l": ["x", 1],
         "m": "x", "id": "20200131", "half": "2020-01-01", "nothing": None},
        {"n": 2, "f": None, "s": "y", "d": "1999-12-31", "t": "2020-01-01T09:30", "b": False, "l": [],
         "m": 2, "id": "20200201", "half": "soon"},
    ])
    assert table.fields() == {
        "b": "bool", "d": "date", "f": "number", "half": "string", "id": "string", "l": "list", "m": "mixed",
        "n": "number", "nothing": "mixed", "s": "string", "t": "date",
    }


@pytest.mark.parametrize(
    ("filter_", "expected"),
    [
        ({"topic": "music"}, [0, 2]),
        ({"topic": ["music", "cooking", "nope"]}, [0, 2, 4]),
        ({"topic": {"ne": "music"}}, [1, 3, 4]),  # row 3 (topic null) matches ne
        ({"topic": {"nin": ["music", "sailing"]}}, [3, 4]),
        ({"year": 2005}, [1, 4]),
        ({"year": 2005.0}, [1, 4]),
        ({"year": {"gte": 2005, "lt": 2010.5}}, [1, 4]),
        ({"year": {"gt": 2005}}, [2]),
        ({"year": {"lte": 2001}}, [0]),
        ({"year": {"ne": 2005}}, [0, 2, 3]),  # row 3 has no year
        ({"tags": "b"}, [0, 1]),
        ({"tags": ["c", "a"]}, [0, 3]),
        ({"tags": 3}, [3]),
        ({"tags": "3"}, []),  # a string is not the number 3
        ({"tags": {"nin": ["b"]}}, [2, 3, 4]),  # empty list and missing match nin
        ({"draft": True}, [1]),
        ({"draft": {"ne": True}}, [0, 2, 3, 4]),
        # Dates compare as instants: "2020-01-31" is midnight UTC; +02:00 is two hours earlier in UTC.
        ({"published": {"gte": "2020-01-31"}}, [0, 1, 2]),
        ({"published": {"gt": "2020-01-31"}}, [1, 2]),
        ({"published": {"lt": "2021-06-01"}}, [0, 1, 2, 4]),
        ({"published": "2020-01-31T00:00:00Z"}, [0]),
        ({"published": {"gte": "2020-01-01", "lt": "2020-02-01"}}, [0, 1]),
        ({"topic": "music", "year": {"gt": 2005}}, [2]),  # fields are ANDed
        ({"topic": []}, []),
        ({"topic": {"nin": []}}, [0, 1, 2, 3, 4]),
    ],
)
def test_conditions(filter_, expected):
    assert rows(filter_) == expected


def test_no_filter():
    assert TABLE.allowed_rows(None) is None
    assert TABLE.allowed_rows({}) is None


def test_unknown_field_lists_known_fields():
    with pytest.raises(FilterError) as err:
        TABLE.allowed_rows({"yaer": 2005})
    assert str(err.value) == "unknown filter field 'yaer'; known fields: draft, published, tags, topic, year"


@pytest.mark.parametrize(
    ("filter_", "message"),
    [
        ({"year": {"between": [1, 2]}}, "unknown operator 'between'"),
        ({"year": {}}, "empty condition"),
        ({"topic": {"gt": "m"}}, "range operators need a number or date field"),
        ({"tags": {"lt": "b"}}, "range operators need a number or date field"),
        ({"draft": {"gte": True}}, "range operators need a number or date field"),
        ({"year": "2005"}, "is not a number"),
        ({"year": {"gt": True}}, "is not a number"),
        ({"year": ["2005", 2006]}, "is not a number"),
        ({"topic": 5}, "is not a string"),
        ({"draft": 1}, "is not true or false"),
        ({"published": {"gt": "last week"}}, "is not an ISO-8601 date string"),
        ({"published": {"gt": "2020-02-30"}}, "is not an ISO-8601 date string"),
        ({"published": {"gt": 2020}}, "is not an ISO-8601 date string"),
        ({"topic": {"eq": ["music"]}}, "use 'in'"),
        ({"topic": {"in": "music"}}, "'in' and 'nin' take a JSON array"),
        ({"topic": None}, "missing values never equal anything"),
    ],
)
def test_bad_filters_name_the_field_and_the_fix(filter_, message):
    with pytest.raises(FilterError, match=message) as err:
        TABLE.allowed_rows(filter_)
    assert f"'{next(iter(filter_))}'" in str(err.value)


def test_filter_must_be_an_object():
    with pytest.raises(FilterError, match="must be a JSON object"):
        TABLE.allowed_rows([{"topic": "music"}])


# --- logical keys: $and, $or, $not ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filter_", "expected"),
    [
        ({"$or": [{"year": {"lt": 2002}}, {"topic": "cooking"}]}, [0, 4]),
        ({"topic": "music", "$or": [{"year": {"gt": 2005}}, {"tags": "a"}]}, [0, 2]),  # keys of one object AND
        ({"$and": [{"tags": "a"}, {"tags": "b"}]}, [0]),  # two conditions on one field
        ({"$or": [{"topic": "music"}]}, [0, 2]),
        # $not is the complement over all rows: the rule of ne, so a row missing the field is kept.
        ({"$not": {"topic": "music"}}, [1, 3, 4]),
        ({"topic": {"ne": "music"}}, [1, 3, 4]),
        ({"$not": {"year": {"gt": 2005}}}, [0, 1, 3, 4]),  # row 3 has no year ...
        ({"year": {"lte": 2005}}, [0, 1, 4]),  # ... and lte leaves it out
        ({"$not": {"$not": {"topic": "music"}}}, [0, 2]),
        ({"$not": {"$or": [{"topic": "music"}, {"draft": True}]}}, [3, 4]),  # none of them
        ({"$not": {"topic": "music", "year": 2001}}, [1, 2, 3, 4]),  # not both
        ({"$or": [{"$and": [{"topic": "music"}, {"year": 2001}]}, {"$not": {"tags": {"nin": ["c"]}}}]}, [0, 3]),
        ({"draft": {"ne": True}, "$not": {"topic": "sailing"}}, [0, 2, 3, 4]),
        ({"$or": [{"topic": []}, {"year": {"gt": 3000}}]}, []),
    ],
)
def test_logical_keys(filter_, expected):
    assert rows(filter_) == expected


@pytest.mark.parametrize(
    ("filter_", "message"),
    [
        ({"$xyz": [{"topic": "music"}]}, "unknown logical operator '$xyz'; use $and, $or or $not"),
        ({"$or": [{"$Or": [{"topic": "music"}]}]}, "unknown logical operator '$Or'"),
        ({"$or": {"topic": "music"}}, "'$or' takes a non-empty JSON array of filters"),
        ({"$or": []}, "'$or' takes a non-empty JSON array of filters"),
        ({"$and": []}, "'$and' takes a non-empty JSON array of filters"),
        ({"$and": "topic"}, "'$and' takes a non-empty JSON array of filters"),
        ({"$not": [{"topic": "music"}]}, "'$not' takes one filter"),
        ({"$not": {}}, "each filter inside '$not' must be a non-empty JSON object"),
        ({"$or": [{}, {"topic": "music"}]}, "each filter inside '$or' must be a non-empty JSON object"),
        ({"$and": ["music"]}, "each filter inside '$and' must be a non-empty JSON object"),
        ({"$or": [{"yaer": 2005}]}, "unknown filter field 'yaer'"),
        ({"$not": {"year": {"between": [1, 2]}}}, "unknown operator 'between'"),
        ({"$or": [{"topic": "music"}, {"topic": {"gt": "m"}}]}, "range operators need a number or date field"),
    ],
)
def test_bad_logical_keys_name_the_key_and_the_fix(filter_, message):
    with pytest.raises(FilterError, match=re.escape(message)):
        TABLE.allowed_rows(filter_)
    if message.startswith(("unknown logical", "'$", "each filter")):
        with pytest.raises(FilterError, match=re.escape(message)):
            filter_conditions(filter_)  # the router's check meets the same errors before any shard does


def test_unknown_logical_operator_message():
    with pytest.raises(FilterError) as err:
        TABLE.allowed_rows({"$xyz": []})
    assert str(err.value) == "unknown logical operator '$xyz'; use $and, $or or $not"


def test_filter_conditions_lists_every_field():
    filter_ = {"lang": "en", "$or": [{"year": {"lt": 2000}}, {"$not": {"topic": "music", "$and": [{"tags": "a"}]}}]}
    assert filter_conditions(filter_) == [("lang", "en"), ("year", {"lt": 2000}), ("topic", "music"), ("tags", "a")]


# --- a field absent from a table (a shard that never saw it), and the ACL ------------------------------------


@pytest.mark.parametrize(
    ("filter_", "expected"),
    [
        ({"ghost": "x"}, []),
        ({"ghost": ["x", "y"]}, []),
        ({"ghost": {"gt": 1}}, []),
        ({"ghost": {"ne": "x"}}, [0, 1, 2, 3, 4]),
        ({"ghost": {"nin": ["x"]}, "topic": "music"}, [0, 2]),
        ({"$not": {"ghost": "x"}}, [0, 1, 2, 3, 4]),
        ({"$or": [{"ghost": "x"}, {"topic": "cooking"}]}, [4]),
    ],
)
def test_a_field_absent_here_is_missing_from_every_row(filter_, expected):
    assert TABLE.allowed_rows(filter_, unknown_as_missing=True).tolist() == expected
    with pytest.raises(FilterError, match="unknown filter field 'ghost'"):
        TABLE.allowed_rows(filter_)


def test_an_absent_field_still_checks_its_operators():
    with pytest.raises(FilterError, match="unknown operator 'between'"):
        TABLE.allowed_rows({"ghost": {"between": [1, 2]}}, unknown_as_missing=True)
    with pytest.raises(FilterError, match="'in' and 'nin' take a JSON array"):
        TABLE.allowed_rows({"ghost": {"in": "x"}}, unknown_as_missing=True)


@pytest.mark.parametrize("filter_", [
    {"draft": True}, {"draft": {"ne": True}}, {"$not": {"draft": False}},
    {"$or": [{"draft": True}, {"year": 2005}]}, {"$not": {"$or": [{"draft": False}, {"topic": "cooking"}]}},
    {"topic": {"nin": ["music"]}, "$not": {"draft": {"in": [True, False]}}},
])
def test_split_tables_equal_one_table(filter_):
    """Sharded equals unsharded: rows 3 and 4 as a table of their own have no draft field at all."""
    first, second = MetadataTable(ROWS[:3]), MetadataTable(ROWS[3:])
    assert "draft" not in second.fields()
    parts = [*first.searchable_rows(filter_).tolist(), *(3 + second.searchable_rows(filter_)).tolist()]
    assert parts == TABLE.allowed_rows(filter_).tolist()


ACL_TABLE = MetadataTable([
    {"acl": ["alice"], "topic": "a"},
    {"acl": ["bob"], "topic": "b"},
    {"acl": ["public", "bob"], "topic": "c"},
    {"topic": "d"},  # no ACL field: seen by nobody
])


@pytest.mark.parametrize(
    ("filter_", "acl", "expected"),
    [
        (None, None, None),
        (None, ("acl", ["bob"]), [1, 2]),
        (None, ("acl", []), []),
        ({"topic": {"ne": "zzz"}}, ("acl", ["alice", "public"]), [0, 2]),
        # Neither an $or, nor a $not, nor a filter on the ACL field itself reaches past the ACL.
        ({"$or": [{"topic": "b"}, {"topic": {"ne": "zzz"}}]}, ("acl", ["alice", "public"]), [0, 2]),
        ({"$not": {"topic": "a"}}, ("acl", ["alice", "public"]), [2]),
        ({"$or": [{"acl": "bob"}, {"topic": "d"}]}, ("acl", ["alice"]), []),
        ({"$not": {"acl": "alice"}}, ("acl", ["alice"]), []),
        ({"ghost": {"ne": 1}}, ("acl", ["alice"]), [0]),
    ],
)
def test_the_acl_is_intersected_never_widened(filter_, acl, expected):
    allowed = ACL_TABLE.searchable_rows(filter_, acl)
    assert (None if allowed is None else allowed.tolist()) == expected


def test_from_json_column():
    table = MetadataTable.from_json_column([json.dumps(r) for r in ROWS[:2]] + ["", None, '{"year": 1999}'])
    assert table.num_rows == 5
    assert table.allowed_rows({"year": {"lt": 2002}}).tolist() == [0, 4]
    for bad in ("[1, 2]", "1, 2", "{oops"):
        with pytest.raises(ValueError, match="row 1"):
            MetadataTable.from_json_column(['{"a": 1}', bad])


def test_empty_table():
    table = MetadataTable([])
    assert table.fields() == {}
    with pytest.raises(FilterError, match=r"known fields: \(none\)"):
        table.allowed_rows({"a": 1})


# --- oracle: the vectorized table against a plain-Python reading of the rules over the row dicts -----------

KINDS = {"year": "number", "topic": "string", "published": "date", "tags": "list", "draft": "bool",
         "misc": "mixed"}
POOLS = {
    "year": [1999, 2000, 2001, 2002, 2003.5, 2004, 2010],
    "topic": ["music", "sailing", "cooking", "astronomy", "databases"],
    "published": ["2020-01-01", "2020-01-02", "2020-01-01T12:00:00Z", "2020-01-02T01:00:00+02:00",
                  "2020-01-03T00:00:00", "2019-12-31"],
    "tags": ["x", "y", "z", 1, 2],
    "draft": [True, False],
    "misc": ["x", 1, 2.0, True, "2", "true"],
}


def random_row(rng):
    row = {}
    for field in KINDS:
        roll = rng.random()
        if roll < 0.15:
            continue
        if roll < 0.25:
            row[field] = None
        elif field == "tags":
            row[field] = rng.sample(POOLS["tags"], rng.randint(0, 3))
        elif field == "misc" and rng.random() < 0.3:
            row[field] = rng.sample(POOLS["misc"], 2)
        else:
            row[field] = rng.choice(POOLS[field])
    return row


def random_value(rng, field):
    extra = {"year": [1998, 2001.0], "topic": ["nope"], "published": ["2018-05-05", "2020-01-01T12:00:00+00:00"],
             "tags": ["w", 2.0], "draft": [], "misc": [False, "y"]}[field]
    return rng.choice(POOLS[field] + extra)


def random_condition(rng, field):
    ops = ["eq", "ne", "in", "nin", "exists"] + (["gt", "gte", "lt", "lte"] if KINDS[field] in ("number", "date")
                                                  else [])
    form = rng.random()
    if form < 0.2:
        return random_value(rng, field)
    if form < 0.35:
        return [random_value(rng, field) for _ in range(rng.randint(0, 3))]
    cond = {}
    for op in rng.sample(ops, rng.randint(1, 2)):
        many = op in ("in", "nin")
        cond[op] = ([random_value(rng, field) for _ in range(rng.randint(0, 3))] if many else
                    rng.random() < 0.5 if op == "exists" else random_value(rng, field))
    return cond


def as_instant(text):
    when = datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def same_value(stored, wanted):
    def tag(v):
        return "bool" if isinstance(v, bool) else "num" if isinstance(v, int | float) else "str"

    return tag(stored) == tag(wanted) and stored == wanted


def brute_force(row, field, op, value):
    stored = row.get(field)
    if op == "exists":  # null is no value; an empty list is one
        return (stored is not None) == value
    if op in ("ne", "nin"):
        return not brute_force(row, field, "eq" if op == "ne" else "in", value)
    if stored is None:
        return False
    if op == "in":
        return any(brute_force(row, field, "eq", v) for v in value)
    kind = KINDS[field]
    if kind == "date":
        stored, value = as_instant(stored), as_instant(value)
    if op == "eq":
        elements = stored if isinstance(stored, list) else [stored]
        return any(same_value(e, value) if kind in ("list", "mixed") else e == value for e in elements)
    return {"gt": stored > value, "gte": stored >= value, "lt": stored < value, "lte": stored <= value}[op]


def matches(row, filter_):
    """The filter's rule for one row, read off the module docstring: keys AND together, $not is plain negation."""
    for key, cond in filter_.items():
        if key == "$and":
            ok = all(matches(row, sub) for sub in cond)
        elif key == "$or":
            ok = any(matches(row, sub) for sub in cond)
        elif key == "$not":
            ok = not matches(row, cond)
        else:
            pairs = [("in", cond)] if isinstance(cond, list) else cond.items() if isinstance(cond, dict) else [("eq", cond)]
            ok = all(brute_force(row, key, op, value) for op, value in pairs)
        if not ok:
            return False
    return True


@pytest.mark.parametrize("seed", range(4))
def test_matches_brute_force(seed):
    rng = random.Random(seed)
    data = [random_row(rng) for _ in range(200)]
    table = MetadataTable.from_json_column([json.dumps(r) for r in data])
    assert table.fields() == KINDS
    nonempty = 0
    for _ in range(100):
        filter_ = {f: random_condition(rng, f) for f in rng.sample(sorted(KINDS), rng.randint(1, 3))}
        expected = [i for i, row in enumerate(data) if matches(row, filter_)]
        assert table.allowed_rows(filter_).tolist() == expected, filter_
        nonempty += 0 < len(expected) < len(data)
    assert nonempty > 20  # the random filters do select something, and not everything


# --- oracle for nested filters: random small tables and random $and/$or/$not trees against ``matches`` --------

EXTRA = {"year": [1998, 2001.0], "topic": ["nope"], "published": ["2018-05-05", "2020-01-01T12:00:00+00:00"],
         "tags": ["w", 2.0], "draft": [], "misc": [False, "y"], "ghost": ["x", "y"]}
# Two rows that pin every field's kind, whatever the random rows hold ("ghost" is in no row: absent everywhere).
ANCHORS = [{"year": 2000, "topic": "music", "published": "2020-01-01", "tags": ["x", 1], "draft": True, "misc": "x"},
           {"misc": ["y", 2]}]


def stored_values(field):
    if field == "tags":
        return st.lists(st.sampled_from(POOLS["tags"]), max_size=3, unique=True)
    if field == "misc":
        return st.one_of(st.sampled_from(POOLS["misc"]), st.lists(st.sampled_from(POOLS["misc"]), max_size=2))
    return st.sampled_from(POOLS[field])


table_rows = st.lists(
    st.fixed_dictionaries({}, optional={f: st.one_of(st.none(), stored_values(f)) for f in KINDS}), min_size=4, max_size=12
).map(lambda drawn: [*drawn, *ANCHORS])


def field_condition(field):
    value = st.sampled_from(POOLS.get(field, []) + EXTRA[field])
    ranged = KINDS.get(field) in ("number", "date", None)  # None: the absent field, which takes any operator
    ops = ["eq", "ne", "in", "nin", "exists"] + (["gt", "gte", "lt", "lte"] if ranged else [])
    pair = st.sampled_from(ops).flatmap(
        lambda op: st.tuples(st.just(op), st.lists(value, max_size=3) if op in ("in", "nin") else
                             st.booleans() if op == "exists" else value))
    return st.one_of(value, st.lists(value, max_size=3), st.lists(pair, min_size=1, max_size=2).map(dict))


leaf_filters = st.dictionaries(st.sampled_from([*KINDS, "ghost"]), st.just(None), min_size=1, max_size=2).flatmap(
    lambda chosen: st.fixed_dictionaries({f: field_condition(f) for f in chosen}))


def combined(children):
    many = st.lists(children, min_size=1, max_size=3)
    return st.one_of(
        many.map(lambda fs: {"$and": fs}),
        many.map(lambda fs: {"$or": fs}),
        children.map(lambda f: {"$not": f}),
        st.tuples(leaf_filters, st.sampled_from(["$and", "$or"]), many).map(lambda t: {**t[0], t[1]: t[2]}),
        st.tuples(leaf_filters, children).map(lambda t: {**t[0], "$not": t[1]}),
    )


nested_filters = st.recursive(leaf_filters, combined, max_leaves=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=table_rows, filter_=nested_filters)
def test_nested_filters_match_brute_force(data, filter_):
    table = MetadataTable(data)
    assert table.fields() == KINDS
    expected = [i for i, row in enumerate(data) if matches(row, filter_)]
    assert table.allowed_rows(filter_, unknown_as_missing=True).tolist() == expected


def test_exists_tells_rows_with_a_value_from_rows_without_one_in_every_kind():
    rows = [{"n": 1, "s": "a", "b": True, "t": ["x"], "d": "2020-01-01", "m": [1, "a"]}, {"n": None, "t": []}, {}]
    table = MetadataTable(rows)
    for field in ("n", "s", "b", "t", "d", "m", "ghost"):
        with_it = [i for i, r in enumerate(rows) if r.get(field) is not None]
        assert table.allowed_rows({field: {"exists": True}}, unknown_as_missing=True).tolist() == with_it, field
        without = [i for i in range(len(rows)) if i not in with_it]
        assert table.allowed_rows({field: {"exists": False}}, unknown_as_missing=True).tolist() == without, field
    with pytest.raises(FilterError, match="'exists'"):
        table.allowed_rows({"n": {"exists": "yes"}})
