"""A streamed answer's events on the wire: NDJSON lines by default, Server-Sent Events when the caller asks for them.

The events (``results``, ``token``..., then ``answer`` or ``error``: ``Responder.stream_answer``) are the same either
way. NDJSON (``application/x-ndjson``, one JSON object a line) is the default, what scripts and the client read;
an ``Accept`` naming ``text/event-stream`` gets them as SSE (the WHATWG HTML standard's ``text/event-stream``),
which a browser's ``EventSource`` reads: each event's ``event:`` is its ``type``, its ``data:`` the same JSON as
the NDJSON line. Written by ``sse-starlette``, which also sends a comment every 15 s so a proxy does not close a
stream waiting on a slow first token. Ray-free.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import StreamingResponse

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"


def wants_sse(accept: str | None) -> bool:
    """Whether the ``Accept`` header names ``text/event-stream`` (with any parameters); anything else is NDJSON."""
    return any(part.split(";")[0].strip().lower() == SSE for part in (accept or "").split(","))


def streamed(events: AsyncIterator[dict], accept: str | None) -> StreamingResponse:
    """The response that sends ``events`` as the caller's ``Accept`` asks: SSE or NDJSON."""
    if wants_sse(accept):
        return EventSourceResponse(ServerSentEvent(json.dumps(e), event=e["type"]) async for e in events)
    return StreamingResponse((json.dumps(e) + "\n" async for e in events), media_type=NDJSON)
