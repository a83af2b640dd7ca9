"""Metadata filters: a small JSON condition language evaluated column-wise over one shard's chunk rows.

A filter maps a metadata field to a condition; fields are ANDed::

    {"topic": "music"}                         equality
    {"topic": ["music", "sailing"]}            membership (same as {"in": [...]})
    {"year": {"gte": 2005, "lt": 2010}}        operators, ANDed: eq ne in nin gt gte lt lte
    {"published": {"gte": "2020-01-31"}}       dates as ISO-8601 strings
    {"year": {"exists": false}}                rows without the field (or with null); true: rows with it

Keys beginning with ``$`` are logical, never fields (so a field named ``$x`` cannot be filtered on)::

    {"$or": [{"year": {"lt": 2000}}, {"topic": "music"}]}     at least one of the filters
    {"$and": [{"tags": "a"}, {"tags": "b"}]}                  every one (here: two conditions on one field)
    {"$not": {"topic": "music", "year": 2005}}                 every row the filter does not match
    {"lang": "en", "$or": [...]}                              the keys of one object still AND together

Each sub-filter is a whole filter (nesting is allowed) and may not be empty; ``$and`` and ``$or`` take a non-empty
array. They are spelled as in the filters LangChain's vector stores take (Chroma's, PGVector's).

Each field has one kind, decided from its non-null values when the table is built:

    number  ints and floats (not bools)       all operators
    date    ISO-8601 date/datetime strings    all operators, compared as instants
    string  other strings                     eq ne in nin
    bool    true / false                      eq ne in nin
    list    lists of scalars (tags)           eq ne in nin; eq/in match when any element matches
    mixed   anything else                     eq ne in nin, by value (scalars as one-element lists)

Dates: "2020-01-31" means midnight UTC that day and a datetime without an offset is taken as UTC, so
``{"lte": "2020-01-31"}`` excludes "2020-01-31T10:00:00Z" (write ``{"lt": "2020-02-01"}`` for the whole
day). Numbers are compared as float64. Values that are equal in Python but of another kind do not
match (``true`` is not ``1``), but ``1`` equals ``1.0``.

A row whose field is missing or null never matches, except under ``ne`` and ``nin``, which match it
(they are the negations of ``eq`` and ``in``), and ``{"exists": false}``, which matches those rows alone (an empty
list is a value: its row has the field). ``$not`` follows the same rule, as the complement of its filter
over all rows: ``{"$not": {"topic": "music"}}`` is ``{"topic": {"ne": "music"}}``, and
``{"$not": {"year": {"gt": 2005}}}`` keeps the rows without a year, which ``{"year": {"lte": 2005}}`` leaves out.
(Chroma's ``$ne`` and ``$nin`` match a missing key too; SQL stores such as PGVector do not.)

Errors are ``FilterError``s whose message names the field or logical key, the value, the rule and the fix, so
the API can return them as they are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

OPERATORS = ("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "exists")
LOGICAL = ("$and", "$or", "$not")
_RANGE = {"gt": np.greater, "gte": np.greater_equal, "lt": np.less, "lte": np.less_equal}
# The forms accepted as dates; stricter than datetime.fromisoformat so ids like "20200131" stay strings.
_ISO_DATE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)?"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class FilterError(ValueError):
    """A filter that cannot be evaluated; the message says which field, what value, the rule and the fix."""


def parse_date(value: Any) -> int | None:
    """Microseconds since the Unix epoch for an ISO-8601 date or datetime string, else None.

    A date is midnight UTC; a datetime without an offset is UTC.
    """
    if not isinstance(value, str) or not _ISO_DATE.fullmatch(value):
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // timedelta(microseconds=1)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, str | int | float | bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _value_key(value: Any) -> tuple[str, Any]:
    """Equality key: kind tag plus value, so true != 1 while 1 == 1.0."""
    if isinstance(value, bool):
        return ("b", value)
    if _is_number(value):
        return ("n", float(value))
    if isinstance(value, str):
        return ("s", value)
    return ("s", json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))


def _field_kind(values: list[Any]) -> str:
    """The kind of a field from its non-null values (see the module docstring)."""
    types = {type(v) for v in values}  # checked per type, not per value: this runs over every row
    if not types:
        return "mixed"
    if all(issubclass(t, bool) for t in types):
        return "bool"
    if all(issubclass(t, int | float) and not issubclass(t, bool) for t in types):
        return "number"
    if all(issubclass(t, str) for t in types):
        return "date" if all(parse_date(v) is not None for v in set(values)) else "string"
    if all(issubclass(t, list) for t in types) and all(_is_scalar(e) for v in values for e in v):
        return "list"
    return "mixed"


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


class _Column:
    """One field stored for vectorized evaluation. ``match(op, value)`` is a boolean mask over the rows."""

    def __init__(self, name: str, kind: str, n: int):
        self.name, self.kind, self.n = name, kind, n

    def fail(self, value: Any, rule: str, fix: str) -> FilterError:
        return FilterError(f"filter field '{self.name}' ({self.kind}): value {_show(value)} {rule}; {fix}")

    def match(self, op: str, value: Any) -> np.ndarray:
        if op == "exists":
            if not isinstance(value, bool):
                raise self.fail(value, "is not true or false; 'exists' says whether a row holds the field",
                                'write {"exists": true} (rows with a value) or {"exists": false} (rows without)')
            return self.present_rows() if value else ~self.present_rows()
        if op in ("ne", "nin"):
            return ~self.match("eq" if op == "ne" else "in", value)
        if op == "eq":
            if not _is_scalar(value):
                fix = "use 'in' for a list of values" if isinstance(value, list) else "give a single scalar value"
                raise self.fail(value, "is not a scalar; 'eq' compares with one value", fix)
            return self.equal([value])
        if op == "in":
            if not isinstance(value, list) or not all(_is_scalar(v) for v in value):
                raise self.fail(value, "is not a list of scalars; 'in' and 'nin' take a JSON array",
                                'write e.g. {"in": ["a", "b"]}')
            return self.equal(value)
        return self.compare(op, value)

    def equal(self, values: list[Any]) -> np.ndarray:
        raise NotImplementedError

    def present_rows(self) -> np.ndarray:
        """The rows that hold a value of the field (not missing, not null)."""
        raise NotImplementedError

    def compare(self, op: str, value: Any) -> np.ndarray:
        raise self.fail(value, f"cannot be used with '{op}': range operators need a number or date field",
                        "use eq, ne, in or nin on this field")


class _NumberColumn(_Column):
    def __init__(self, name: str, kind: str, values: np.ndarray, present: np.ndarray,
                 convert: Callable[[Any], Any], expects: str, fix: str):
        super().__init__(name, kind, len(values))
        self.values, self.present = values, present
        self.convert, self.expects, self.fix = convert, expects, fix

    def _scalar(self, value: Any) -> Any:
        converted = self.convert(value)
        if converted is None:
            raise self.fail(value, f"is not {self.expects}", self.fix)
        return converted

    def equal(self, values: list[Any]) -> np.ndarray:
        wanted = np.array([self._scalar(v) for v in values], dtype=self.values.dtype)
        return self.present & np.isin(self.values, wanted)

    def present_rows(self) -> np.ndarray:
        return self.present

    def compare(self, op: str, value: Any) -> np.ndarray:
        return self.present & _RANGE[op](self.values, self._scalar(value))


class _CodeColumn(_Column):
    """Strings and bools: each row's value as an integer code (-1 when missing)."""

    def __init__(self, name: str, kind: str, codes: np.ndarray, code_of: dict[Any, int],
                 accepts: Callable[[Any], bool], expects: str, fix: str):
        super().__init__(name, kind, len(codes))
        self.codes, self.code_of = codes, code_of
        self.accepts, self.expects, self.fix = accepts, expects, fix

    def equal(self, values: list[Any]) -> np.ndarray:
        for v in values:
            if not self.accepts(v):
                raise self.fail(v, f"is not {self.expects}", self.fix)
        wanted = [self.code_of[v] for v in values if v in self.code_of]
        return np.isin(self.codes, np.array(wanted, dtype=np.int64))

    def present_rows(self) -> np.ndarray:
        return self.codes >= 0


class _ElementColumn(_Column):
    """Lists and mixed fields: one (row, element code) pair per element; a scalar is a one-element list."""

    def __init__(self, name: str, kind: str, n: int, rows: np.ndarray, codes: np.ndarray,
                 code_of: dict[tuple[str, Any], int], present: np.ndarray):
        super().__init__(name, kind, n)
        self.rows, self.codes, self.code_of, self.present = rows, codes, code_of, present

    def equal(self, values: list[Any]) -> np.ndarray:
        wanted = [self.code_of[k] for k in map(_value_key, values) if k in self.code_of]
        mask = np.zeros(self.n, dtype=bool)
        mask[self.rows[np.isin(self.codes, np.array(wanted, dtype=np.int64))]] = True
        return mask

    def present_rows(self) -> np.ndarray:
        return self.present


class _AbsentColumn(_Column):
    """A field no row of this table holds (a shard that never saw a field its collection knows): every row misses
    it, so eq, in and the range operators match nothing and ne, nin every row, as for any missing value."""

    def __init__(self, name: str, n: int):
        super().__init__(name, "absent here", n)

    def equal(self, values: list[Any]) -> np.ndarray:
        return np.zeros(self.n, dtype=bool)

    def compare(self, op: str, value: Any) -> np.ndarray:
        return np.zeros(self.n, dtype=bool)

    def present_rows(self) -> np.ndarray:
        return np.zeros(self.n, dtype=bool)


def _number(value: Any) -> float | None:
    try:
        return float(value) if _is_number(value) else None
    except OverflowError:  # an integer beyond float64's range
        return None


def _build_column(name: str, raw: list[Any]) -> _Column:
    n = len(raw)
    kind = _field_kind([v for v in raw if v is not None])
    present = np.array([v is not None for v in raw], dtype=bool)
    if kind == "number":
        values = np.array([np.nan if v is None else v for v in raw], dtype=np.float64)
        return _NumberColumn(name, kind, values, present, _number, "a number",
                             "compare this number field with a JSON number (unquoted), e.g. 2005")
    if kind == "date":
        cache = {v: parse_date(v) for v in set(raw) if v is not None}
        values = np.array([0 if v is None else cache[v] for v in raw], dtype=np.int64)
        return _NumberColumn(name, kind, values, present, parse_date, "an ISO-8601 date string",
                             'write a date as "2020-01-31" or a datetime as "2020-01-31T10:00:00Z"')
    if kind in ("string", "bool"):
        code_of: dict[Any, int] = {}
        codes = np.array([-1 if v is None else code_of.setdefault(v, len(code_of)) for v in raw], dtype=np.int64)
        if kind == "string":
            return _CodeColumn(name, kind, codes, code_of, lambda v: isinstance(v, str), "a string",
                               "compare this string field with a JSON string (quoted)")
        return _CodeColumn(name, kind, codes, code_of, lambda v: isinstance(v, bool), "true or false",
                           "compare this bool field with true or false")
    rows, codes_list, key_code = [], [], {}
    for i, v in enumerate(raw):
        if v is None:
            continue
        for element in v if isinstance(v, list) else [v]:
            if element is None:
                continue
            rows.append(i)
            key = ("s", element) if type(element) is str else _value_key(element)  # the common case, inline
            codes_list.append(key_code.setdefault(key, len(key_code)))
    return _ElementColumn(name, kind, n, np.array(rows, dtype=np.int64), np.array(codes_list, dtype=np.int64),
                          key_code, present)


def _split(filter: Any, inside: str | None) -> tuple[list[tuple[str, Any]], list[tuple[str, list[Any]]]]:
    """One filter object's field conditions and its logical keys with their sub-filters, its shape checked
    (``inside``: the logical key it sits in, None at the top, for the messages)."""
    if not isinstance(filter, dict) or (inside is not None and not filter):
        if inside is None:
            raise FilterError(f"a filter must be a JSON object mapping field names to conditions, got "
                              f"{_show(filter)}; write e.g. {{\"topic\": \"music\"}}")
        raise FilterError(f"each filter inside '{inside}' must be a non-empty JSON object, got {_show(filter)}; "
                          f"write e.g. {{\"topic\": \"music\"}}")
    fields, logical = [], []
    for key, value in filter.items():
        if not (isinstance(key, str) and key.startswith("$")):
            fields.append((key, value))
        elif key not in LOGICAL:
            raise FilterError(f"unknown logical operator '{key}'; use $and, $or or $not")
        elif key == "$not":
            if isinstance(value, list):
                raise FilterError(f"'$not' takes one filter (a JSON object), got {_show(value)}; to negate several "
                                  'write {"$not": {"$or": [...]}} (none of them) or {"$not": {"$and": [...]}} '
                                  "(not all of them)")
            logical.append((key, [value]))
        elif not isinstance(value, list) or not value:
            raise FilterError(f"'{key}' takes a non-empty JSON array of filters, got {_show(value)}; write e.g. "
                              f'{{"{key}": [{{"topic": "music"}}, {{"year": {{"gte": 2005}}}}]}}')
        else:
            logical.append((key, value))
    return fields, logical


def filter_conditions(filter: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every (field, condition) pair of a filter, those under its logical keys too, in order: the fields a filter
    names, for a caller that checks them before any shard sees the filter. Raises FilterError on a malformed
    logical key, as ``allowed_rows`` would."""
    return _conditions(filter, None)


def _conditions(filter: Any, inside: str | None) -> list[tuple[str, Any]]:
    fields, logical = _split(filter, inside)
    for key, subs in logical:
        for sub in subs:
            fields += _conditions(sub, key)
    return fields


class MetadataTable:
    """The metadata of one shard's chunk rows (row ``i`` is chunk row ``i``), stored column by column.

    Built once when a shard opens; ``allowed_rows`` then costs a few numpy passes per filtered field.
    """

    def __init__(self, rows: Sequence[dict[str, Any]]):
        self.num_rows = len(rows)
        names = sorted({name for row in rows for name in row})
        self._columns = {name: _build_column(name, [row.get(name) for row in rows]) for name in names}

    @classmethod
    def from_json_column(cls, json_strings: Sequence[str | None]) -> MetadataTable:
        """From the chunk table's ``metadata_json`` column; an empty or null entry is ``{}``."""
        texts = [text or "{}" for text in json_strings]
        # One decoder call for the whole column is several times faster than one per row. The column is
        # written by json.dumps (one object per row); a bad row breaks the array or its length.
        try:
            rows = json.loads("[" + ",".join(texts) + "]")
        except json.JSONDecodeError:
            rows = None
        if rows is None or len(rows) != len(texts):  # find the bad row (or a row holding "1, 2")
            rows = []
            for i, text in enumerate(texts):
                try:
                    rows.append(json.loads(text))
                except json.JSONDecodeError as err:
                    raise ValueError(f"metadata of row {i} is not valid JSON ({err}): {text[:80]!r}") from err
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ValueError(f"metadata of row {i} is {type(row).__name__}, not a JSON object: {texts[i][:80]!r}")
        return cls(rows)

    def fields(self) -> dict[str, str]:
        """Field name -> kind ("number", "string", "bool", "date", "list" or "mixed"), sorted by name."""
        return {name: col.kind for name, col in self._columns.items()}

    def allowed_rows(self, filter: dict[str, Any] | None, *, unknown_as_missing: bool = False) -> np.ndarray | None:
        """Ascending int64 row numbers the filter matches; None when there is no filter.

        ``None`` and ``{}`` both mean "no restriction" and give None. A field with no column here is a FilterError
        naming the known fields, unless ``unknown_as_missing``: then every row misses it (a shard that never saw a
        field its collection knows; the router refuses the fields no shard knows). Also raises FilterError on an
        unknown operator, a malformed logical key, or a value of the wrong type for the field's kind.
        """
        if filter is None or (isinstance(filter, dict) and not filter):
            return None
        return np.flatnonzero(self._mask(filter, None, unknown_as_missing)).astype(np.int64)

    def visible_rows(self, field: str, principals: Sequence[str]) -> np.ndarray:
        """The rows an ACL lets these principals see: those whose ``field`` holds one of them. A row without the
        field is seen by nobody, and no principals see nothing."""
        if field not in self._columns or not principals:
            return np.zeros(0, dtype=np.int64)
        return self.allowed_rows({field: list(principals)})

    def searchable_rows(self, filter: dict[str, Any] | None,
                        acl: tuple[str, Sequence[str]] | None = None) -> np.ndarray | None:
        """The rows a search may return (None: all), for a shard or the fresh segment: the filter's rows, a field
        absent here being missing from every row, within ``acl`` = (field, principals)'s ``visible_rows``. The ACL
        is intersected with the filter's rows, never merged into the filter, so no ``$or`` or ``$not`` of the
        caller's reaches past it."""
        allowed = self.allowed_rows(filter, unknown_as_missing=True)
        if acl is not None:
            visible = self.visible_rows(*acl)
            allowed = visible if allowed is None else np.intersect1d(allowed, visible, assume_unique=True)
        return allowed

    def _mask(self, filter: Any, inside: str | None, unknown_as_missing: bool) -> np.ndarray:
        """The rows one filter object matches, as a boolean mask: its fields and logical keys ANDed."""
        fields, logical = _split(filter, inside)
        mask = np.ones(self.num_rows, dtype=bool)
        for name, condition in fields:
            column = self._column(name, unknown_as_missing)
            for op, value in self._operations(column, condition):
                mask &= column.match(op, value)
        for key, subs in logical:
            masks = [self._mask(sub, key, unknown_as_missing) for sub in subs]
            if key == "$and":
                mask &= np.logical_and.reduce(masks)
            elif key == "$or":
                mask &= np.logical_or.reduce(masks)
            else:  # $not: the complement over all rows, so rows missing a field are kept (see the module docstring)
                mask &= ~masks[0]
        return mask

    def _column(self, name: str, unknown_as_missing: bool) -> _Column:
        column = self._columns.get(name)
        if column is not None:
            return column
        if unknown_as_missing:
            return _AbsentColumn(name, self.num_rows)
        known = ", ".join(self._columns) or "(none)"
        raise FilterError(f"unknown filter field '{name}'; known fields: {known}")

    @staticmethod
    def _operations(column: _Column, condition: Any) -> list[tuple[str, Any]]:
        if isinstance(condition, list):
            return [("in", condition)]
        if isinstance(condition, dict):
            if not condition:
                raise column.fail(condition, "is an empty condition", f"give one of {', '.join(OPERATORS)}")
            unknown = [op for op in condition if op not in OPERATORS]
            if unknown:
                raise column.fail(condition, f"uses unknown operator '{unknown[0]}'",
                                  f"use one of {', '.join(OPERATORS)}")
            return list(condition.items())
        if condition is None:
            raise column.fail(condition, "cannot be matched: missing values never equal anything",
                              'to keep rows without the field use {"ne": <value>} or leave the field out')
        return [("eq", condition)]


def operators_for(kind: str) -> list[str]:
    """The operators a filter may use on a field of ``kind`` (the module's table): range operators on numbers and
    dates only; ``exists`` on every kind."""
    return list(OPERATORS) if kind in ("number", "date") else [op for op in OPERATORS if op not in _RANGE]
