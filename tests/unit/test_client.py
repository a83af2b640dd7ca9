"""The client over a scripted transport: its retry rule (a 503 or a 429 with Retry-After is sent again; a call that
never reached the service, or an idempotent one whose connection closed mid-call, too; nothing else is), and
each method's route, HTTP method and body as the server declares them (deployments/serve/router.py), and how its
answer is read. (The client against the real served app: tests/integration/test_http.py.)"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from raysearch_client import (
    AnswerEvent,
    AsyncSearchClient,
    ResultsEvent,
    SearchClient,
    SearchServiceError,
    TokenEvent,
)

OK = {"query": "q", "method": "hybrid", "method_used": "hybrid", "results": [], "total": 0, "total_results": 0,
      "index_version": {"default": "v1"}, "timings_ms": {}, "coverage": {"shards_asked": 1, "shards_answered": 1,
                                                                          "ratio": 1.0, "degraded": False}}


def scripted(answers: list[httpx.Response]):
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return answers[min(len(sent), len(answers)) - 1]

    return sent, handler


@pytest.mark.parametrize("status", [503, 429])
def test_a_503_or_429_with_retry_after_is_sent_again_then_answered(status):
    sent, handler = scripted([httpx.Response(status, headers={"Retry-After": "0"}, json={"error": "not now"}),
                              httpx.Response(200, json=OK)])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
        assert client.search("q").index_version == {"default": "v1"}
    assert len(sent) == 2


def test_the_wait_is_what_retry_after_says_capped():
    from raysearch_client.calls import retry_after

    assert retry_after(httpx.Response(429, headers={"Retry-After": "2"}), 10) == 2
    assert retry_after(httpx.Response(429, headers={"Retry-After": "100"}), 2.5) == 2.5
    assert retry_after(httpx.Response(503, headers={"Retry-After": "soon"}), 10) is None


@pytest.mark.parametrize("status,headers", [(503, {}), (500, {"Retry-After": "0"}), (504, {}), (429, {})])
def test_nothing_else_is_retried_and_the_error_says_what_and_which_request(status, headers):
    sent, handler = scripted([httpx.Response(status, headers=headers | {"x-request-id": "r-1"},
                                             json={"error": "no", "request_id": "r-1"})])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client, \
            pytest.raises(SearchServiceError) as e:
        client.search("q")
    assert len(sent) == 1 and e.value.status == status and e.value.request_id == "r-1" and e.value.message == "no"


@pytest.mark.parametrize("status", [503, 429])
def test_retries_stop_at_max_retries_and_the_async_client_does_the_same(status):
    sent, handler = scripted([httpx.Response(status, headers={"Retry-After": "0"}, json={"error": "not now"})])
    with SearchClient("http://x", max_retries=2, transport=httpx.MockTransport(handler)) as client, \
            pytest.raises(SearchServiceError) as e:
        client.search("q")
    assert len(sent) == 3 and e.value.status == status

    sent, handler = scripted([httpx.Response(status, headers={"Retry-After": "0"}, json={"error": "not now"}),
                              httpx.Response(200, json=OK)])

    async def go():
        async with AsyncSearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
            return await client.search("q", limit=3)

    assert asyncio.run(go()).total == 0 and len(sent) == 2
    assert sent[0].read() == b'{"query":"q","limit":3}'  # only the fields given are sent


def failing(failures: list[Exception | httpx.Response]):
    """A transport that fails the first calls as given (an exception raised, or a response), then answers OK."""
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if len(sent) <= len(failures):
            failure = failures[len(sent) - 1]
            if isinstance(failure, Exception):
                raise failure
            return httpx.Response(failure.status_code, content=failure.content, headers=failure.headers)
        if request.url.path.startswith("/collections"):
            return httpx.Response(200, json={"collection": "c", "upserted": 1, "deleted": 0, "seq": 1,
                                                      "searchable": True})
        return httpx.Response(200, json=OK)

    return sent, handler


PROXY_404 = httpx.Response(404, text="Path '/search' not found. Ping http://.../-/routes for available routes.")


@pytest.mark.parametrize("failure", [httpx.ConnectError("refused"), httpx.RemoteProtocolError("closed"),
                                     httpx.ReadError("reset"), PROXY_404], ids=["connect", "closed", "reset", "proxy404"])
def test_a_search_whose_connection_went_away_or_that_a_proxy_did_not_route_is_sent_again(failure):
    sent, handler = failing([failure, failure])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
        assert client.search("q").total == 0
    assert len(sent) == 3
    assert sent[0].headers["connection"] == "keep-alive" and sent[1].headers["connection"] == "close"  # a new one after

    async def go():
        async with AsyncSearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
            return await client.search("q")

    sent.clear()
    assert asyncio.run(go()).total == 0 and len(sent) == 3


def test_a_write_that_lost_its_connection_mid_call_is_not_sent_again_unless_idempotent():
    docs = [{"id": "d1", "text": "t"}]
    sent, handler = failing([httpx.RemoteProtocolError("closed")])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client, \
            pytest.raises(httpx.RemoteProtocolError):
        client.delete_documents("c", ["d1"])  # may have been applied: the caller decides
    assert len(sent) == 1
    sent, handler = failing([httpx.ConnectError("refused"), httpx.RemoteProtocolError("closed")])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
        assert client.upsert_documents("c", docs).upserted == 1  # a PUT of the same documents is the same twice
    assert len(sent) == 3


def test_the_service_s_own_404_is_the_caller_s_and_retries_stop_at_max_retries():
    sent, handler = failing([httpx.Response(404, json={"error": "unknown collection 'x'"})])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client, \
            pytest.raises(SearchServiceError) as e:
        client.search("q")
    assert len(sent) == 1 and e.value.status == 404
    sent, handler = failing([httpx.ReadError("reset")] * 5)
    with SearchClient("http://x", max_retries=2, transport=httpx.MockTransport(handler)) as client, \
            pytest.raises(httpx.ReadError):
        client.search("q")
    assert len(sent) == 3


def test_a_request_that_breaks_a_rule_is_refused_before_it_is_sent():
    sent, handler = scripted([httpx.Response(200, json=OK)])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client, pytest.raises(ValueError):
        client.search("q", limit=1000)
    assert sent == []


WRITE = {"collection": "notes", "seq": 7, "upserted": 1, "searchable": True}
DOC = {"collection": "notes", "id": "a/b", "title": "T", "text": "x", "metadata": {}, "chunk_ids": ["a/b#0"],
       "source": "api", "seq": 7}
JOB = {"id": "b-1", "kind": "build", "root": "/idx", "state": "running", "started": "2026-01-01T00:00:00Z"}


def sent_as(request: httpx.Request) -> tuple[str, str, object]:
    body = request.read()
    return request.method, request.url.raw_path.decode(), json.loads(body) if body else None


@pytest.mark.parametrize("call,route,status,answer,check", [
    (lambda c: c.upsert_documents("notes", [{"id": "a/b", "text": "x"}]),
     ("PUT", "/collections/notes/documents", {"documents": [{"id": "a/b", "text": "x"}]}), 200, WRITE,
     lambda a: a.seq == 7 and a.upserted == 1 and a.searchable),
    (lambda c: c.get_document("notes", "a/b"),  # an id is one path segment, "/" and all
     ("GET", "/collections/notes/documents/a%2Fb", None), 200, DOC, lambda a: a.chunk_ids == ["a/b#0"]),
    (lambda c: c.delete_documents("notes", ["a/b", "c"]),
     ("POST", "/collections/notes/documents/delete", {"ids": ["a/b", "c"]}), 200, WRITE | {"deleted": 2},
     lambda a: a.deleted == 2),
    (lambda c: c.start_build(corpus="/data/c.jsonl", shards=2),
     ("POST", "/admin/builds", {"corpus": "/data/c.jsonl", "shards": 2}), 202, JOB, lambda a: a.state == "running"),
    (lambda c: c.start_build(kind="fold", collection="notes"),
     ("POST", "/admin/builds", {"kind": "fold", "collection": "notes"}), 202, JOB, lambda a: a.id == "b-1"),
    (lambda c: c.build("b-1"), ("GET", "/admin/builds/b-1", None), 200, JOB | {"state": "succeeded"},
     lambda a: a.state == "succeeded"),
    (lambda c: c.builds(), ("GET", "/admin/builds", None), 200, {"builds": [JOB, JOB | {"id": "b-0"}]},
     lambda a: [j.id for j in a] == ["b-1", "b-0"]),
    (lambda c: c.feedback("q", 1, chunk_id="c#0"), ("POST", "/feedback", {"query": "q", "chunk_id": "c#0", "label": 1}),
     201, {"collection": "d", "query_id": "x", "doc_id": "c", "label": 1}, lambda a: a.doc_id == "c"),
])
def test_each_method_sends_the_server_s_route_and_body_and_reads_its_answer(call, route, status, answer, check):
    sent, handler = scripted([httpx.Response(status, json=answer)])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
        assert check(call(client))
    assert [sent_as(r) for r in sent] == [route]


def test_a_write_out_of_its_limits_is_refused_before_it_is_sent():
    sent, handler = scripted([httpx.Response(200, json=WRITE)])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ValueError):
            client.delete_documents("notes", [])
        with pytest.raises(ValueError):
            client.upsert_documents("notes", [{"id": str(i)} for i in range(1001)])
        with pytest.raises(ValueError):
            client.start_build(shards=0)
    assert sent == []


def test_a_status_the_route_never_answers_with_is_an_error_not_a_misread_answer():
    sent, handler = scripted([httpx.Response(200, json=JOB)])  # POST /admin/builds answers 202
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client, \
            pytest.raises(SearchServiceError) as e:
        client.start_build(kind="fold")
    assert len(sent) == 1 and e.value.status == 200


STREAM = [{"type": "results", **OK}, {"type": "token", "text": "Gzip "}, {"type": "token", "text": "compresses [1]."},
          {"type": "answer", "text": "Gzip compresses [1].", "citations": [{"n": 1, "chunk_id": "c#0", "doc_id": "c",
                                                                             "title": "gzip"}],
           "removed_citations": [], "model": "extractive", "prompt_tokens": 0, "completion_tokens": 0, "ms": 1.5,
           "sentences": [], "added_citations": []}]


def test_stream_answer_asks_for_a_streamed_synthesis_and_yields_each_ndjson_event():
    lines = "".join(json.dumps(e) + "\n" for e in STREAM).encode()
    sent, handler = scripted([httpx.Response(200, content=lines, headers={"content-type": "application/x-ndjson"})])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
        events = list(client.stream_answer("gzip", limit=3))
    assert sent_as(sent[0]) == ("POST", "/search", {"query": "gzip", "limit": 3, "synthesize": True, "stream": True})
    assert [type(e) for e in events] == [ResultsEvent, TokenEvent, TokenEvent, AnswerEvent]
    assert "".join(e.text for e in events[1:3]) == events[3].text and events[3].citations[0].chunk_id == "c#0"

    failed = [STREAM[0], {"type": "error", "error": "synthesis timed out: no answer, results only"}]
    sent, handler = scripted([httpx.Response(200, content="".join(json.dumps(e) + "\n" for e in failed).encode())])

    async def go():
        async with AsyncSearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
            return [e async for e in client.stream_answer({"query": "gzip"})]

    results, error = asyncio.run(go())
    assert results.index_version == {"default": "v1"} and error.type == "error" and "no answer" in error.error


def test_a_stream_refused_before_it_starts_is_retried_or_raised_as_any_call():
    sent, handler = scripted([httpx.Response(503, headers={"Retry-After": "0"}, json={"error": "overloaded"}),
                              httpx.Response(400, json={"error": "synthesis is not enabled", "request_id": "r-2"})])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client, \
            pytest.raises(SearchServiceError) as e:
        list(client.stream_answer("gzip"))
    assert len(sent) == 2 and e.value.status == 400 and e.value.request_id == "r-2"


def test_the_async_client_sends_the_same_calls():
    sent, handler = scripted([httpx.Response(200, json=WRITE), httpx.Response(200, json=DOC),
                              httpx.Response(202, json=JOB), httpx.Response(200, json={"builds": [JOB]})])

    async def go():
        async with AsyncSearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
            return (await client.upsert_documents("notes", [{"id": "a"}]), await client.get_document("notes", "a"),
                    await client.start_build(kind="fold"), await client.builds())

    write, doc, job, jobs = asyncio.run(go())
    assert write.seq == 7 and doc.id == "a/b" and job.id == "b-1" and [j.id for j in jobs] == ["b-1"]
    assert [sent_as(r)[:2] for r in sent] == [("PUT", "/collections/notes/documents"),
                                              ("GET", "/collections/notes/documents/a"), ("POST", "/admin/builds"),
                                              ("GET", "/admin/builds")]


@pytest.mark.parametrize("given, env, sent", [(None, "from-env", "Bearer from-env"), ("given", "from-env", "Bearer given"),
                                             (None, None, None), ("", "from-env", None)])
def test_a_client_given_no_key_sends_raysearch_api_key(monkeypatch, given, env, sent):
    if env is None:
        monkeypatch.delenv("RAYSEARCH_API_KEY", raising=False)
    else:
        monkeypatch.setenv("RAYSEARCH_API_KEY", env)
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=OK)

    with SearchClient("http://x", api_key=given, transport=httpx.MockTransport(handler)) as client:
        client.search("q")
    assert seen[0].headers.get("authorization") == sent

    async def once():
        seen.clear()
        async with AsyncSearchClient("http://x", api_key=given, transport=httpx.MockTransport(handler)) as aio:
            await aio.search("q")

    asyncio.run(once())
    assert seen[0].headers.get("authorization") == sent
