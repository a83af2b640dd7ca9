"""Reading a Server-Sent Events stream in tests, by the format's rules (the WHATWG HTML standard, "Server-sent
events", interpreting an event stream): what a browser's ``EventSource`` would dispatch."""

from __future__ import annotations


def parse_sse(text: str) -> list[tuple[str, str]]:
    """(event, data) of each event of an SSE stream: events end at a blank line; ``event:`` names one (default
    ``message``), ``data:`` lines are joined with newlines, lines starting with ``:`` are comments."""
    events, name, data = [], "message", []
    for line in text.replace("\r\n", "\n").split("\n"):
        if not line:
            if data:
                events.append((name, "\n".join(data)))
            name, data = "message", []
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
    return events
