"""The client's retry rule over a scripted transport: a 503 with Retry-After is sent again, nothing else is.
(The client against the real served app: tests/integration/test_http.py.)"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from deployments.edge.client import AsyncSearchClient, SearchClient, SearchServiceError

OK = {"query": "q", "method": "hybrid", "method_used": "hybrid", "results": [], "total": 0, "total_results": 0,
      "index_version": {"default": "v1"}, "timings_ms": {}, "coverage": {"shards_asked": 1, "shards_answered": 1,
                                                                          "ratio": 1.0, "degraded": False}}


def scripted(answers: list[httpx.Response]):
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return answers[min(len(sent), len(answers)) - 1]

    return sent, handler


def test_a_503_with_retry_after_is_sent_again_then_answered():
    sent, handler = scripted([httpx.Response(503, headers={"Retry-After": "0"}, json={"error": "overloaded"}),
                              httpx.Response(200, json=OK)])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
        assert client.search("q").index_version == {"default": "v1"}
    assert len(sent) == 2


@pytest.mark.parametrize("status,headers", [(503, {}), (500, {"Retry-After": "0"}), (504, {}), (429, {})])
def test_nothing_else_is_retried_and_the_error_says_what_and_which_request(status, headers):
    sent, handler = scripted([httpx.Response(status, headers=headers | {"x-request-id": "r-1"},
                                             json={"error": "no", "request_id": "r-1"})])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client, \
            pytest.raises(SearchServiceError) as e:
        client.search("q")
    assert len(sent) == 1 and e.value.status == status and e.value.request_id == "r-1" and e.value.message == "no"


def test_retries_stop_at_max_retries_and_the_async_client_does_the_same():
    sent, handler = scripted([httpx.Response(503, headers={"Retry-After": "0"}, json={"error": "overloaded"})])
    with SearchClient("http://x", max_retries=2, transport=httpx.MockTransport(handler)) as client, \
            pytest.raises(SearchServiceError) as e:
        client.search("q")
    assert len(sent) == 3 and e.value.status == 503

    sent, handler = scripted([httpx.Response(503, headers={"Retry-After": "0"}, json={"error": "overloaded"}),
                              httpx.Response(200, json=OK)])

    async def go():
        async with AsyncSearchClient("http://x", transport=httpx.MockTransport(handler)) as client:
            return await client.search("q", limit=3)

    assert asyncio.run(go()).total == 0 and len(sent) == 2
    assert sent[0].read() == b'{"query":"q","limit":3}'  # only the fields given are sent


def test_a_request_that_breaks_a_rule_is_refused_before_it_is_sent():
    sent, handler = scripted([httpx.Response(200, json=OK)])
    with SearchClient("http://x", transport=httpx.MockTransport(handler)) as client, pytest.raises(ValueError):
        client.search("q", limit=1000)
    assert sent == []
