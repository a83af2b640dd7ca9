"""Per-key limits and Server-Sent Events through a real Ray Serve application (proxy, router, front door), with two
API keys, ``security.key_limit`` and the extractive answer writer (``synthesis.enabled``, no model)."""

from __future__ import annotations

import json

import httpx
import pytest

from deployments.edge.guard import new_key
from tests.serving import SERVE_PORT, start_serve, stop_serving
from tests.sse import parse_sse

PORT = SERVE_PORT
NOISY, NOISY_DIGEST = new_key()
CALM, CALM_DIGEST = new_key()
READER, READER_DIGEST = new_key()  # the streams' own key: each test's budget its own, in any order


@pytest.fixture(scope="module")
def base(built, ray_local):

    from deployments.settings import deploy_app

    _, summary = built[3]
    start_serve()
    deploy_app({"index": str(summary.version_dir), "router": {"shard_timeout_s": 10, "cache_size": 0},
                "synthesis": {"enabled": True, "num_cpus": 0.1},
                "security": {"api_key_digests": [NOISY_DIGEST, CALM_DIGEST, READER_DIGEST],
                             "key_limit": {"requests_per_s": 0.5, "burst": 3, "max_inflight": 4}}}, "limits")
    yield f"http://127.0.0.1:{PORT}"
    stop_serving()


def search(base: str, key: str, **headers) -> httpx.Response:
    return httpx.post(f"{base}/search", json={"query": "telescope galaxy", "limit": 2, "synthesize": True,
                                              "stream": True}, headers={"x-api-key": key} | headers, timeout=60)


def test_a_key_over_its_rate_gets_429_and_another_key_is_served(base):
    # 3 in a 6 s window: the next of the same key is refused, whatever the machine's speed.
    answers = [search(base, NOISY) for _ in range(4)]
    assert [r.status_code for r in answers] == [200, 200, 200, 429]
    over = answers[-1]
    assert over.headers["ratelimit-limit"] == "3" and over.headers["ratelimit-remaining"] == "0"
    assert 1 <= int(over.headers["retry-after"]) <= 6 and over.json()["request_id"]
    calm = search(base, CALM)
    assert calm.status_code == 200 and calm.headers["ratelimit-remaining"] == "2"


def test_a_streamed_answer_as_server_sent_events_carries_the_ndjson_events(base):
    ndjson = search(base, READER)
    sse = search(base, READER, accept="text/event-stream")
    assert sse.status_code == 200 and sse.headers["content-type"].startswith("text/event-stream")
    lines = [json.loads(line) for line in ndjson.text.splitlines()]
    events = parse_sse(sse.text)
    assert [name for name, _ in events] == [e["type"] for e in lines]
    assert events[0][0] == "results" and events[-1][0] == "answer"
    assert json.loads(events[-1][1])["text"] == lines[-1]["text"]  # the same extractive answer
