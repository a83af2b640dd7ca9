"""Pages of one search, Ray-free: an offset inside the candidate window, and cursors that hold a point in time.

A search ranks a window of candidates (each leg's top ``candidates`` of every shard, fused, maybe reranked);
a page is a slice of that ranking. ``offset`` asks for one directly; ``next_cursor`` in a response names the
next page of the same search. The cursor carries the index version of every collection searched, a digest
of the request, one of the router settings that rank, each collection's last applied write (its fresh
segment's sequence number) and when the first page was ranked. The next page is ranked again at that point in
time: the same versions, and each fresh segment as it was just after that write (``FreshSegment.at``: documents
written since left out, those deleted or replaced since still there, as they were), so pages read while writes go
on neither repeat nor skip a result, on any router replica. That holds for ``router.cursor_keep_alive_s`` from the
first page; past it, after a version switch, or after an operator's change of the fusion, the next page is a 409
(search again), never a page ranked otherwise; for another request, a 400. ``offset`` pins nothing: it pages
over the ranking as it is now.
Pages stop at the window: a hybrid search's fused scores depend on its candidates (min-max over each leg's
list), so its pages stay inside the candidates that ``limit`` asks for (200 by default) and every page ranks
the same ones; a one-leg search's exact top-k goes to ``router.candidate_cap``. A reranked search ranks its
rerank depth (40 by default). Deep paging of a million results is not what a relevance-ranked search answers.
A grouped search (``group_by``) pages over its groups: offsets and cursors count groups, not chunks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

from deployments.config import RouterSettings
from deployments.edge.schemas import SearchRequest
from deployments.errors import Conflict, InvalidRequest

# What may change from one page to the next without making it another search.
# ``limit`` stays: it sets how deep the legs search, so another limit would rank other candidates.
_PAGE_FIELDS = {"offset", "cursor", "debug"}


# Router settings that cannot change a ranking: every other one (fusion, weights, depths, rerank depth,
# synonyms, ...) is part of a cursor, so an operator's change between two pages is a 409, not a mixed list.
_NOT_RANKING = {"rows_with_answers", "shard_timeout_s", "encoder_timeout_s", "request_timeout_s", "spell_timeout_s",
                "cache_size", "redact_queries", "rerank_timeout_s", "synthesis_timeout_s", "version_poll_s",
                "activation_timeout_s", "cursor_keep_alive_s"}


def _digest(body) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def request_digest(req: SearchRequest) -> str:
    return _digest(req.model_dump(mode="json", exclude=_PAGE_FIELDS))


# The settings last digested, and their digest: a router serves one settings object until it is reconfigured, and
# every response with a next page digests them (frozen: the same object, the same digest).
_last_settings: tuple[RouterSettings | None, str] | None = None


def settings_digest(settings: RouterSettings | None) -> str:
    global _last_settings
    last = _last_settings
    if last is not None and last[0] is settings:
        return last[1]
    digest = _digest(settings.model_dump(mode="json", exclude=_NOT_RANKING) if settings is not None else None)
    _last_settings = (settings, digest)
    return digest


@dataclass(frozen=True)
class Cursor:
    """What a cursor holds: where the next page starts, and the point in time its pages are ranked at."""

    offset: int
    versions: dict[str, str]  # collection -> the version (and ranking model) ranked (``stages.ranked_by``)
    request: str  # ``request_digest``
    settings: str  # ``settings_digest``
    writes: dict[str, int]  # collection -> its last write applied when the first page was ranked
    made_at: float  # when the first page was ranked (Unix time)


def make_cursor(req: SearchRequest, versions: Mapping[str, str], offset: int,
                settings: RouterSettings | None = None, writes: Mapping[str, int] | None = None,
                made_at: float | None = None) -> str:
    """``writes``: each collection's last write applied when the page was ranked (``stages.write_seqs``);
    ``made_at``: when the first page of the search was (None: now, this is the first)."""
    body = {"o": offset, "v": dict(versions), "r": request_digest(req), "s": settings_digest(settings),
            "w": dict(writes or {}), "t": round(time.time() if made_at is None else made_at, 3)}
    return base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode().rstrip("=")


def read_cursor(req: SearchRequest) -> Cursor | None:
    """The request's cursor, decoded and checked as this search's (a 400 otherwise); None without one."""
    if req.cursor is None:
        return None
    try:
        padded = req.cursor + "=" * (-len(req.cursor) % 4)
        body = json.loads(base64.urlsafe_b64decode(padded.encode()))
        cursor = Cursor(int(body["o"]), {str(k): str(v) for k, v in dict(body["v"]).items()}, str(body["r"]),
                        str(body["s"]), {str(name): int(seq) for name, seq in dict(body.get("w", {})).items()},
                        float(body.get("t", 0)))
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise InvalidRequest("cursor is not one this service made: pass next_cursor from a response as it came") from None
    if cursor.request != request_digest(req):
        raise InvalidRequest("cursor belongs to another search: send the same query and options (limit included) "
                           "with it")
    return cursor


def check_alive(cursor: Cursor, keep_alive_s: float, now: float | None = None) -> None:
    """A 409 once ``keep_alive_s`` has passed since the cursor's first page: its point in time is let go."""
    age = (time.time() if now is None else now) - cursor.made_at
    if age > keep_alive_s:
        raise Conflict(f"this cursor's first page was ranked {age:.0f} s ago, past router.cursor_keep_alive_s "
                       f"({keep_alive_s:g} s), and its point in time is let go: search again from the first page")


def page_offset(req: SearchRequest, cursor: Cursor | None, versions: Mapping[str, str],
                settings: RouterSettings | None = None, writes: Mapping[str, int] | None = None) -> int:
    """Where this request's page starts: its cursor's offset (checked against the ranking settings, the versions
    served now and the point in time searched, ``writes``), else ``offset``."""
    if cursor is None:
        return req.offset
    offset, made_on, ranking, written = cursor.offset, cursor.versions, cursor.settings, cursor.writes
    if made_on != dict(versions):
        changed = ", ".join(f"{name}: {made_on.get(name)} -> {v}" for name, v in sorted(versions.items())
                            if made_on.get(name) != v)
        raise Conflict(f"the index changed since the first page ({changed}); its pages would mix versions: "
                           "search again from the first page")
    now = {name: seq for name, seq in (writes or {}).items() if seq}
    if {name: seq for name, seq in written.items() if seq} != now:  # a point in time the searched segment lacks
        changed = ", ".join(f"{name}: write {written.get(name, 0)} -> {seq}" for name, seq in sorted(now.items())
                            if written.get(name, 0) != seq)
        raise Conflict(f"the documents as they were at the first page are no longer held ({changed}); its pages "
                       "would mix rankings: search again from the first page")
    if ranking != settings_digest(settings):
        raise Conflict("the service's ranking settings (router: fusion, weights, depths) changed since the "
                           "first page; its pages would mix rankings: search again from the first page")
    return offset


def check_window(offset: int, limit: int, end: int) -> None:
    """``end``: the candidates the search ranks (a hybrid search's candidate depth, 200 by default; one leg's
    router.candidate_cap)."""
    if offset + limit > end:
        raise InvalidRequest(f"offset {offset} + limit {limit} is past the {end} results this search ranks: page "
                           "within them, or narrow the query with filters")
