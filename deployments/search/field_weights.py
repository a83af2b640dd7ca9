"""Which Lucene fields a keyword search scores, and with what weights: the request's, else the collection's.

The keyword leg's score is the weighted sum of the fields' corpus-exact BM25 (``deployments.shard.lucene``;
Elasticsearch's ``multi_match`` of type ``most_fields``). A version lists its fields in its manifest
(``bm25.fields``, beside ``contents``); one built before fields has ``contents`` alone.

- A request naming a field the version does not index is refused (400, naming the fields it has): its caller
  asked for a ranking this version cannot give, and silently dropping the field would answer another one.
- A collection's configured weights naming such a field (a version built before fields, or with fewer) serve
  with the fields the version has: a deployment must not stop answering when an older version is activated;
  ``Collection.at_version`` logs what it leaves out.
- No weights anywhere: ``contents`` alone, as before fields (None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from deployments.errors import InvalidRequest

CONTENTS = "contents"


def version_fields(bm25: Mapping) -> tuple[str, ...]:
    """The Lucene fields a version's BM25 can score, from its manifest's ``bm25`` block."""
    return (CONTENTS, *sorted(bm25.get("fields") or {}))


def held_weights(configured: Mapping[str, float] | None, fields: Sequence[str]) -> tuple[dict[str, float] | None,
                                                                                         list[str]]:
    """A collection's configured weights restricted to the fields its version holds, and the names left out
    (None: no weights configured, or none left)."""
    if configured is None:
        return None, []
    kept = {f: float(w) for f, w in configured.items() if f in fields}
    return (kept if any(kept.values()) else None), sorted(set(configured) - set(fields))


def request_weights(asked: Mapping[str, float] | None, default: Mapping[str, float] | None, fields: Sequence[str],
                    collection: str, version: str) -> dict[str, float] | None:
    """The weights a search of ``collection`` scores with: the request's (``asked``), checked against the version's
    ``fields``, else the collection's ``default`` (already held, ``held_weights``). Raises ``InvalidRequest``
    (400) for a field the version lacks or weights that are all 0."""
    if asked is None:
        return dict(default) if default else None
    unknown = sorted(set(asked) - set(fields))
    if unknown:
        raise InvalidRequest(
            f"field_weights names {unknown}, which collection {collection!r} (index version {version!r}) does not "
            f"index; its BM25 fields: {list(fields)} (a version built with --bm25-fields has more)")
    if not any(asked.values()):
        raise InvalidRequest(f"field_weights {dict(asked)} weighs every field 0: the keyword leg would find nothing; "
                             "give one field a weight above 0, or search with method=vector")
    return {f: float(w) for f, w in asked.items()}
