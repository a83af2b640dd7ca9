"""A streamed answer as NDJSON (the default) and as Server-Sent Events (``Accept: text/event-stream``): the same
events, the answer last, and a synthesis that fails mid-stream an ``error`` event.

The events come from the real ``Responder.stream_answer`` over a scripted synthesizer (the ``SynthesizerClient``
protocol: a few tokens, then an answer or a failure), sent by the edge's ``streamed`` from a FastAPI route served
in-process; the SSE side is read by the SSE format's rules (``tests.sse.parse_sse``)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi import FastAPI, Request

from deployments.config import RouterSettings
from deployments.edge.schemas import SearchRequest, SearchResponse
from deployments.edge.streams import streamed, wants_sse
from deployments.search.response import Responder
from tests.sse import parse_sse

RESPONSE = SearchResponse.model_validate({
    "query": "gzip", "method": "hybrid", "method_used": "hybrid", "results": [], "total": 0, "total_results": 0,
    "index_version": {"default": "v1"}, "timings_ms": {},
    "coverage": {"shards_asked": 1, "shards_answered": 1, "ratio": 1.0, "degraded": False}})


class Scripted:
    """Two tokens, then the answer, or a failure where the answer would be."""

    llm_rerank = False

    def __init__(self, fail: bool):
        self.fail = fail

    async def stream(self, query, results, max_new_tokens):
        yield {"type": "token", "text": "Use "}
        yield {"type": "token", "text": "gzip."}
        if self.fail:
            raise RuntimeError("the model went away")
        yield {"type": "answer", "text": "Use gzip.", "citations": []}


def app_of(fail: bool) -> FastAPI:
    app = FastAPI()
    req = SearchRequest(query="gzip", synthesize=True, stream=True)

    @app.post("/search")
    async def search(request: Request):
        events = Responder(None, Scripted(fail)).stream_answer(req, RESPONSE, RouterSettings())
        return streamed(events, request.headers.get("accept"))

    return app


def fetch(fail: bool, accept: str | None) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=app_of(fail))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/search", json={}, headers={"accept": accept} if accept else {})

    return asyncio.run(go())


@pytest.mark.parametrize("fail,last", [(False, "answer"), (True, "error")])
def test_sse_carries_the_same_events_as_ndjson_ending_with_the_answer_or_an_error(fail, last):
    ndjson = fetch(fail, None)
    assert ndjson.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in ndjson.text.splitlines()]
    sse = fetch(fail, "text/event-stream")
    assert sse.status_code == 200 and sse.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(sse.text)
    assert [json.loads(data) for _, data in events] == lines  # the same events, in the same order
    assert [name for name, _ in events] == [e["type"] for e in lines] == ["results", "token", "token", last]
    if fail:
        assert "synthesis" in lines[-1]["error"] and "results only" in lines[-1]["error"]
    else:
        assert lines[-1]["text"] == "Use gzip."


def test_only_an_accept_naming_event_stream_gets_sse():
    assert wants_sse("text/event-stream") and wants_sse("application/json, Text/Event-Stream;q=0.9")
    assert not wants_sse(None) and not wants_sse("*/*") and not wants_sse("application/x-ndjson")
    assert fetch(False, "*/*").headers["content-type"].startswith("application/x-ndjson")
