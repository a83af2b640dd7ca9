"""Each framework's metadata filter as the API's (``POST /search``'s ``filters``), translated before anything is
sent: LangChain's (the dicts its vector stores take), Haystack 2's, and LlamaIndex's ``MetadataFilters``.

The API's filter, for reference (the service's ``deployments/shard/filters.py`` is the rule)::

    {"topic": "music", "year": {"gte": 2005}}          fields, ANDed; eq ne in nin gt gte lt lte
    {"year": {"exists": false}}                        a document without the field (or with null); true: with it
    {"topic": ["music", "sailing"]}                    membership ("in")
    {"$or": [{...}, {...}], "$and": [...], "$not": {...}}

A row missing a field matches ``ne``, ``nin`` and a ``$not`` around any other condition, nothing else; on a list
field, eq and in match when any element matches; values compare by kind (``true`` is not ``1``), ISO-8601 strings
as instants. Each translation is exact or refused: an operator with no exact equivalent raises ``ValueError``
naming it and the operators supported, before any request. Where a framework's own rule differs, its function
says so.

This module imports no framework: it reads plain dicts, and LlamaIndex's objects by their attributes.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

API_OPERATORS = ("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "exists")
LANGCHAIN_OPERATORS = {"$eq": "eq", "$ne": "ne", "$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte",
                       "$in": "in", "$nin": "nin", "$exists": "exists"}
HAYSTACK_COMPARISONS = {"==": "eq", "!=": "ne", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte", "in": "in",
                        "not in": "nin"}
HAYSTACK_LOGICAL = ("AND", "OR", "NOT")
_RANGES = ("gt", "gte", "lt", "lte")
# Haystack's Document attributes: a filter on one of them is not a metadata filter.
HAYSTACK_DOCUMENT_FIELDS = ("id", "content", "blob", "meta", "score", "embedding", "sparse_embedding")
# LlamaIndex's FilterOperator values. CONTAINS, ANY and ALL are array operators by LlamaIndex's own definition
# ("metadata array contains value"): on a list field the API's eq and in match when any element does, so CONTAINS
# is exactly eq, ANY exactly in, and ALL one eq per value. (LlamaIndex's in-memory store also lets them test a
# substring of a string field, which is text matching: refused, as TEXT_MATCH is.)
LLAMAINDEX_OPERATORS = {"==": "eq", "!=": "ne", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte", "in": "in",
                        "nin": "nin", "contains": "eq", "any": "in"}
LLAMAINDEX_ALL = "all"
_FIXES = {
    "$between": 'write {"$gte": low, "$lte": high} (both ends included)',
    "$like": "the service matches exact values, not text patterns",
    "$ilike": "the service matches exact values, not text patterns",
    "$contain": "the service matches exact values, not text patterns (on a list field eq matches any element)",
}


def from_langchain(filter: dict[str, Any]) -> dict[str, Any]:
    """The API filter for a LangChain vector store filter (Chroma's and PGVector's ``where`` syntax)::

        {"topic": "music"}                                 equality
        {"year": {"$gte": 2005, "$lt": 2010}}             $eq $ne $gt $gte $lt $lte $in $nin $exists
        {"$and": [...]}, {"$or": [...]}                    arrays of filters
        {"$not": {...}}, {"$not": [{...}, ...]}            PGVector's: not the filter; not any of the list

    A filter already in the API's syntax passes unchanged (its bare operators ``gte``, ``in``, ... and its bare
    list for membership; its ``$and``, ``$or`` and ``$not`` are spelled as LangChain's). Where stores differ:
    ``$ne``, ``$nin`` and ``$not`` match a document without the field, as in Chroma, where SQL stores such as
    PGVector leave it out; several operators on one field are ANDed (Chroma and PGVector take one). Anything
    else (``$like``, ``$ilike``, ``$between``, ``$contain``, a callable) raises ValueError. ``$exists`` takes true
    or false (PGVector's); a null value is no value.
    """
    if callable(filter):
        raise ValueError("a callable filter runs in this process (InMemoryVectorStore's); the service filters on "
                         'metadata with a dict, e.g. {"topic": {"$eq": "music"}}')
    if not isinstance(filter, dict):
        raise ValueError(f"a LangChain filter is a dict, got {type(filter).__name__}: {filter!r}; write e.g. "
                         '{"topic": {"$eq": "music"}}')
    out: dict[str, Any] = {}
    for key, value in filter.items():
        if key in ("$and", "$or"):
            out[key] = [_langchain_sub(key, sub) for sub in _filter_list(key, value)]
        elif key == "$not":
            subs = [_langchain_sub(key, sub) for sub in (_filter_list(key, value) if isinstance(value, list) else [value])]
            out[key] = subs[0] if len(subs) == 1 else {"$or": subs}  # a list: none of them
        elif isinstance(key, str) and key.startswith("$"):
            raise ValueError(f"unsupported LangChain logical operator {key!r}; supported: $and, $or, $not")
        else:
            out[key] = _langchain_condition(key, value)
    return out


def _langchain_sub(key: str, sub: Any) -> dict[str, Any]:
    if not isinstance(sub, dict) or not sub:
        raise ValueError(f"each filter inside {key!r} is a non-empty dict, got {sub!r}")
    return from_langchain(sub)


def _langchain_condition(field: str, value: Any) -> Any:
    if not isinstance(value, dict):
        return _value(value)  # a scalar: equality; a list: membership, the API's meaning (Chroma refuses one)
    if not value:
        raise ValueError(f"field {field!r} has an empty condition; give an operator, e.g. {{\"$eq\": ...}}")
    condition: dict[str, Any] = {}
    for op, operand in value.items():
        api = LANGCHAIN_OPERATORS.get(op, op if op in API_OPERATORS else None)
        if api is None:
            fix = _FIXES.get(op, "")
            raise ValueError(f"unsupported filter operator {op!r} on field {field!r}; supported: "
                             f"{', '.join(LANGCHAIN_OPERATORS)} (or the API's {', '.join(API_OPERATORS)})"
                             + (f"; {fix}" if fix else ""))
        if api in condition:
            raise ValueError(f"field {field!r} gives {api!r} twice ({', '.join(map(repr, value))}); give it once")
        condition[api] = _value(operand)
    return condition


def from_haystack(filters: dict[str, Any]) -> dict[str, Any]:
    """The API filter for a Haystack 2 filter (https://docs.haystack.deepset.ai/docs/metadata-filtering)::

        {"field": "meta.year", "operator": ">=", "value": 2005}      == != > >= < <= in, not in
        {"operator": "AND" | "OR" | "NOT", "conditions": [...]}        NOT is not all of the conditions

    ``meta.year`` is the metadata field ``year``; a bare name that is not a Document attribute is read as
    metadata too, as Haystack reads it. A filter on a Document attribute (``content``, ``id``, ...) or on a nested
    value (``meta.a.b``) raises ValueError, as do other operators, ``in`` or ``not in`` with anything but a list
    (Haystack refuses a tuple too), and ``in`` or ``not in`` with None among the values. Rules that match
    Haystack's ``document_matches_filter``: ``!=``, ``not in`` and NOT match a document without the field, ranges
    never do, a range compared with None matches nothing, ``== None`` matches a document without the field (or
    with None: the API's ``exists: false``) and ``!= None`` one with it. Where they differ:
    on a list field ``==`` and ``in`` match when any element matches (Haystack compares the whole list), values
    compare by kind (Haystack's ``True == 1``), and a datetime without an offset is UTC (Haystack gives it the
    other side's offset).

    A filter that matches nothing as a whole (``> None``, an OR of no conditions) raises ValueError: a search's
    filter cannot say "nothing". A caller that can answer "nothing" itself takes ``haystack_selection``.
    """
    return _something(haystack_selection(filters), "Haystack filter")


def haystack_selection(filters: Any) -> dict[str, Any] | None:
    """``from_haystack``'s translation, with None for a filter that matches no document (a range compared with None,
    an OR of no conditions, a NOT of one that matches everything): for a document store, which answers such a
    filter with no documents, as Haystack's own stores do, instead of refusing it."""
    if not isinstance(filters, dict):
        raise ValueError(f"a Haystack filter is a dict, got {type(filters).__name__}: {filters!r}")
    if "field" in filters:
        return _haystack_comparison(filters)
    operator, conditions = filters.get("operator"), filters.get("conditions")
    if operator is None or conditions is None:
        raise ValueError(f"a Haystack filter is a comparison (field, operator, value) or a logical filter "
                         f"(operator, conditions); got the keys {sorted(filters)} (a filter in the service's own "
                         "syntax goes in search_kwargs={'filters': ...})")
    if operator not in HAYSTACK_LOGICAL:
        raise ValueError(f"unsupported Haystack logical operator {operator!r}; supported: AND, OR, NOT")
    if not isinstance(conditions, list):
        raise ValueError(f"a Haystack {operator}'s conditions are a list, got {conditions!r}")
    subs = [haystack_selection(c) for c in conditions]
    if operator == "AND":
        return _all_of(subs)
    if operator == "OR":
        return _any_of(subs)
    return _negated(_all_of(subs))  # Haystack's NOT: not all of the conditions


def _haystack_comparison(condition: dict[str, Any]) -> dict[str, Any] | None:
    missing = [k for k in ("field", "operator", "value") if k not in condition]
    if missing:
        raise ValueError(f"a Haystack comparison needs field, operator and value; {condition!r} lacks {missing}")
    field, operator, value = condition["field"], condition["operator"], condition["value"]
    if operator not in HAYSTACK_COMPARISONS:
        raise ValueError(f"unsupported Haystack comparison operator {operator!r} on {field!r}; supported: "
                         f"{', '.join(HAYSTACK_COMPARISONS)}")
    what = f"Haystack's {operator!r} on {field!r}"
    if operator in ("in", "not in") and not isinstance(value, list):
        raise ValueError(f"{what} takes a list of values (Haystack refuses any other iterable), got {value!r}")
    _check_list(what, value, operator in ("in", "not in"))
    name = _haystack_field(field)
    if value is None and HAYSTACK_COMPARISONS[operator] in _RANGES:
        return None  # Haystack's rule: a range compared with None is false for every document
    if value is None and operator in ("==", "!="):
        return {name: {"exists": operator == "!="}}  # Haystack's: == None holds for a missing field, or a None
    if value is None or (isinstance(value, list) and any(v is None for v in value)):
        raise ValueError(f"{field!r} {operator} with None among the values: the service's filters compare values; "
                         f"write {{'field': {field!r}, 'operator': '==', 'value': None}} for a missing value")
    return {name: {HAYSTACK_COMPARISONS[operator]: _value(value)}}


def _haystack_field(field: Any) -> str:
    if not isinstance(field, str):
        raise ValueError(f"a Haystack field is a string such as 'meta.year', got {field!r}")
    if field.startswith("meta."):
        name = field.removeprefix("meta.")
        if name and "." not in name:
            return _metadata_field(name)
        raise ValueError(f"Haystack field {field!r} names no top-level metadata field (the service does not filter "
                         "on nested values); write 'meta.<name>'")
    if "." in field or field in HAYSTACK_DOCUMENT_FIELDS:
        raise ValueError(f"Haystack field {field!r} is not metadata, and the service filters on metadata only; "
                         "write 'meta.<name>'")
    return _metadata_field(field)  # Haystack reads a bare name that is no Document attribute as metadata


def from_llamaindex(filters: Any) -> dict[str, Any]:
    """The API filter for LlamaIndex's ``MetadataFilters`` (``llama_index.core.vector_stores.types``), read by its
    attributes (``.filters``, ``.condition``; each ``MetadataFilter``'s ``.key``, ``.value``, ``.operator``)::

        MetadataFilters(filters=[MetadataFilter(key="year", value=2005, operator=FilterOperator.GTE), ...],
                        condition=FilterCondition.AND)          AND, OR, NOT (none of them); nesting allowed

    EQ NE GT GTE LT LTE IN NIN map to the API's operators, and the array operators CONTAINS (eq), ANY (in) and
    ALL (one eq per value) to their exact equivalents on a list field. NOT matches when none of the filters match,
    the rule of LlamaIndex's in-memory store (and Qdrant's must_not). TEXT_MATCH, TEXT_MATCH_INSENSITIVE and
    IS_EMPTY raise ValueError (IS_EMPTY also holds for "" and [], which the API's ``exists: false`` does not: give
    that in ``search_kwargs={"filters": ...}``). Rules that match the in-memory store's: a missing field matches only NE and NIN
    (and NOT); no filters match everything. Where they differ: on a list field EQ and IN match when any element
    matches (the store compares the whole list), and GT/GTE/LT/LTE take numbers and ISO dates, not other strings.
    """
    return _something(_llamaindex(filters), "LlamaIndex filter")


def _llamaindex(filters: Any) -> dict[str, Any] | None:
    """``from_llamaindex``'s work; None: the filters match no node."""
    items = getattr(filters, "filters", None)
    if items is None:
        raise ValueError(f"expected LlamaIndex MetadataFilters (with .filters and .condition), got "
                         f"{type(filters).__name__}: {filters!r}")
    if not items:
        return {}  # no filters: every node matches (the in-memory store's rule)
    subs = [_llamaindex(f) if hasattr(f, "filters") else _llamaindex_filter(f) for f in items]
    condition = _enum_value(getattr(filters, "condition", None) or "and")
    if condition == "and":
        return _all_of(subs)
    if condition == "or":
        return _any_of(subs)
    if condition == "not":
        return _negated(_any_of(subs))  # none of them
    raise ValueError(f"unsupported LlamaIndex filter condition {condition!r}; supported: and, or, not")


def _llamaindex_filter(item: Any) -> dict[str, Any]:
    key, value, operator = getattr(item, "key", None), getattr(item, "value", None), getattr(item, "operator", "==")
    op = _enum_value(operator)
    if not isinstance(key, str):
        raise ValueError(f"expected a LlamaIndex MetadataFilter (key, value, operator), got {item!r}")
    if op != LLAMAINDEX_ALL and op not in LLAMAINDEX_OPERATORS:
        name = getattr(operator, "name", op)
        raise ValueError(f"unsupported LlamaIndex filter operator {name} ({op!r}) on key {key!r}; supported: EQ, NE, "
                         "GT, GTE, LT, LTE, IN, NIN, CONTAINS, ANY, ALL")
    if value is None:
        raise ValueError(f"key {key!r} is compared with None: the service's filters cannot test for a missing "
                         "value; compare with a value")
    _check_list(f"{getattr(operator, 'name', op)} on key {key!r}", value, op in ("in", "nin", "any", "all"))
    if op == LLAMAINDEX_ALL:
        if not value:
            raise ValueError(f"ALL on key {key!r} takes a non-empty list of values")
        return _all_of([{_metadata_field(key): {"eq": _value(v)}} for v in value])
    return {_metadata_field(key): {LLAMAINDEX_OPERATORS[op]: _value(value)}}


# --- building API filters ---------------------------------------------------------------------------------------


# A filter being built is a dict, ``{}`` matching everything, or None matching nothing (Haystack's OR of no
# conditions, or its range compared with None; a NOT around a filter that matches everything), which the API cannot
# say: an OR drops it, an AND of it is nothing too, and only a filter that is nothing as a whole is refused
# (``_something``), or answered by the caller (``haystack_selection``).


def _all_of(filters: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """What every filter matches, kept shallow (the API refuses a body nested more than 16 levels): one object's keys
    where no two filters share a field or a logical key (the API ANDs one object's keys), one field's operators in
    one condition, the rest under ``$and``."""
    if any(f is None for f in filters):
        return None
    parts = [g for f in filters for g in (f["$and"] if set(f) == {"$and"} else [f]) if g]
    merged: dict[str, Any] = {}
    rest: list[dict[str, Any]] = []
    for f in parts:
        if all(key not in merged or _operators_apart(key, merged[key], f[key]) for key in f):
            for key, condition in f.items():
                merged[key] = {**merged[key], **condition} if key in merged else condition
        else:
            rest.append(f)
    if rest:
        merged["$and"] = merged.get("$and", []) + rest
    return merged


def _operators_apart(key: str, a: Any, b: Any) -> bool:
    """Whether two conditions on one field are operator objects with no operator in common, so that one object
    holds both (never two ``$not``s: not a and not b is not "not (a and b)")."""
    return (not key.startswith("$") and isinstance(a, dict) and isinstance(b, dict) and not a.keys() & b.keys()
            and not any(k.startswith("$") for k in (*a, *b)))


def _any_of(filters: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """What at least one filter matches (an ``$or`` inside an ``$or`` lifted into it)."""
    filters = [f for f in filters if f is not None]
    if not filters:
        return None
    if any(not f for f in filters):
        return {}  # one of them matches everything
    parts = [g for f in filters for g in (f["$or"] if set(f) == {"$or"} else [f])]
    return parts[0] if len(parts) == 1 else {"$or": parts}


_FLIPPED = {"eq": "ne", "ne": "eq", "in": "nin", "nin": "in"}


def _negated(filter: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the filter does not match. ``$not`` of one eq, ne, in or nin is its opposite operator (the API's rule:
    ne and nin are the complements of eq and in, a missing field included), and ``$not`` of a ``$not`` its filter."""
    if filter is None:
        return {}
    if not filter:
        return None
    if len(filter) == 1:
        (key, condition), = filter.items()
        if key == "$not":
            return condition
        if isinstance(condition, dict) and len(condition) == 1 and next(iter(condition)) in _FLIPPED:
            (op, value), = condition.items()
            return {key: {_FLIPPED[op]: value}}
    return {"$not": filter}


def _something(filter: dict[str, Any] | None, what: str) -> dict[str, Any]:
    if filter is None:
        raise ValueError(f"this {what} matches nothing (an OR of no conditions, a NOT of one that matches "
                         "everything, or a range compared with None), which the service's filters do not say; search "
                         "without it, or fix the filter")
    return filter


def _metadata_field(name: str) -> str:
    if name.startswith("$"):
        raise ValueError(f"metadata field {name!r}: the API reads a key beginning with '$' as a logical operator "
                         "($and, $or, $not), so such a field cannot be filtered on; rename the field")
    return name


def _check_list(what: str, value: Any, many: bool) -> None:
    """Membership operators take a list, the others one value (a framework comparing a whole list with one is not
    the API's rule, where eq on a list field matches any element)."""
    if many and not isinstance(value, list | tuple):
        raise ValueError(f"{what} takes a list of values, got {value!r}")
    if not many and isinstance(value, list | tuple):
        raise ValueError(f"{what} takes one value, got the list {list(value)!r}; for any of several values use "
                         "the membership operator")


def _filter_list(key: str, value: Any) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{key!r} takes a non-empty list of filters, got {value!r}")
    return value


def _enum_value(value: Any) -> Any:
    """An enum member's value (LlamaIndex's operators and conditions are str enums), or the value itself."""
    return getattr(value, "value", value)


def _value(value: Any) -> Any:
    """A filter value as JSON: dates and datetimes as ISO-8601 strings (the API's dates), lists element by element."""
    if isinstance(value, list | tuple):
        return [_value(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value
