"""``python -m deployments`` as a user runs it: its own Ray, the router answering on --port itself."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.waiting import wait_until

PORT = 8791
METRICS_PORT = 8792
COLLECTOR_PORT = 8793


class Running:
    """``python -m deployments`` started as a user starts it, its output read as it comes (a full pipe would
    stall it), and every process it started remembered (to show that a stop leaves none behind)."""

    def __init__(self, version_dir: Path):
        root = Path(__file__).parents[2]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deployments", "--index", str(version_dir), "--port", str(PORT), "--router.cache-size", "0",
             "--security.max-inflight", "2", "--metrics-port", str(METRICS_PORT),
             "--otlp-endpoint", f"http://127.0.0.1:{COLLECTOR_PORT}/v1/traces"], cwd=root, env=os.environ | {"PYTHONPATH": str(root)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()
        self.base = f"http://127.0.0.1:{PORT}"
        self.started_in = self._wait_for_health(240)
        self.processes = psutil.Process(self.proc.pid).children(recursive=True)

    def _wait_for_health(self, seconds: float) -> float:
        def healthy() -> bool:
            try:
                return httpx.get(f"{self.base}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        t0 = time.monotonic()
        try:
            self.wait_while_running(healthy, seconds, "python -m deployments answering /health", every_s=0.3)
        except AssertionError as e:
            self.kill()
            pytest.fail(str(e))
        return time.monotonic() - t0

    def wait_while_running(self, predicate, seconds: float, what: str, every_s: float = 0.05) -> None:
        """``tests.waiting.wait_until``, given up at once if the command exits; a failure shows what it printed."""
        def done() -> bool:
            return predicate() or self.proc.poll() is not None

        wait_until(done, seconds, lambda: f"{what}: {self.output[-3000:]}", every_s)
        assert predicate(), f"python -m deployments exited ({self.proc.poll()}) before {what}: {self.output[-3000:]}"

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_printed(self, text: str, seconds: float = 30) -> None:
        """Until ``text`` shows in the output: the service prints its banner after its own health check, which may
        come after ours."""
        self.wait_while_running(lambda: text in self.output, seconds, f"{text!r} printed")

    def stop(self, sig: int, again_after_s: float | None = None) -> int:
        """Exit status after ``sig``; sent a second time after ``again_after_s`` (a user's second Ctrl-C)."""
        self.proc.send_signal(sig)
        if again_after_s is not None:
            time.sleep(again_after_s)
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 90 s after signal {sig}: {self.output[-3000:]}")

    def left_behind(self) -> list[str]:
        alive = [p for p in self.processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        return [" ".join(p.cmdline())[:80] for p in alive]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)


class Collector:
    """An OTLP/HTTP trace collector: what the app exports, decoded with OpenTelemetry's own protobufs."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.spans: list = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

                body = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
                for resource in body.resource_spans:
                    for scope in resource.scope_spans:
                        collector.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", COLLECTOR_PORT), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def collector():
    c = Collector()
    yield c
    c.server.shutdown()


@pytest.fixture(scope="module")
def service(built, collector):
    _, summary = built[3]
    running = Running(summary.version_dir)
    yield running.base, running
    running.kill()


def test_the_router_answers_on_the_port_itself(service):
    base, _ = service
    health = httpx.get(f"{base}/health").json()
    assert [s["shard"] for s in health["shards"]] == ["shard-000", "shard-001", "shard-002"]
    assert all(s["ok"] for s in health["shards"])
    r = httpx.post(f"{base}/search", json={"query": "telescope galaxy", "limit": 5})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert len(body["results"]) == 5 and body["coverage"]["shards_asked"] == 3 and not body["coverage"]["degraded"]
    # One process serves the request: the router replica embeds the query and searches the 3 shards itself
    # (shards.placement auto with one shard replica), and Serve's proxy is not on the request path.
    import psutil

    names = {" ".join(p.info["cmdline"] or [])[:80] for p in psutil.process_iter(["cmdline"])}
    replicas = {n for n in names if "ServeReplica:raysearch:" in n}
    assert replicas and all("ServeReplica:raysearch:router" in n for n in replicas), replicas


def test_the_excess_is_refused_before_serve_handles_it(service):
    """Past --security.max-inflight a search is refused (503 + Retry-After) by the layer ahead of Serve's request
    handling (deployments.edge.shedding): Serve's own layer, which tags every response it handles with an
    x-request-id, never saw the refused requests."""
    import asyncio

    base, _ = service

    async def burst():
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            return await asyncio.gather(*(client.post("/search", json={"query": f"telescope galaxy {i}", "limit": 100})
                                          for i in range(24)))

    answers = asyncio.run(burst())
    shed = [r for r in answers if r.status_code == 503]
    assert shed and {r.status_code for r in answers} == {200, 503}
    assert all(r.headers["Retry-After"] == "1" and "overloaded" in r.json()["error"] for r in shed)
    assert all("x-request-id" not in r.headers for r in shed)
    assert all("x-request-id" in r.headers for r in answers if r.status_code == 200)
    assert httpx.get(f"{base}/health").status_code == 200


def scrape() -> dict:
    """(metric name, frozenset of our labels) -> value, from the app's Prometheus endpoint; Ray's own labels
    dropped, and with them the worker: one router replica reports these."""
    from prometheus_client.parser import text_string_to_metric_families

    ray_labels = {"Component", "NodeAddress", "SessionName", "Version", "WorkerId"}
    out: dict = {}
    text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = frozenset((k, v) for k, v in sample.labels.items()
                               if k not in ray_labels and not k.startswith("otel_scope"))
            out[(sample.name, labels)] = out.get((sample.name, labels), 0) + sample.value
    return out


def wait_for(done, what, seconds: float = 60) -> dict:
    """Scrape until ``done(scrape)`` and return that scrape; ``what(last scrape)`` says what never showed."""
    scrapes = [{}]

    def scraped() -> bool:
        scrapes[-1] = scrape()
        return done(scrapes[-1])

    wait_until(scraped, seconds, lambda: what(scrapes[-1]), every_s=1)
    return scrapes[-1]


def readme_metric_names() -> set[str]:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("### Metrics"):readme.index("### One vocabulary")]
    return set(re.findall(r"^\| `(ray_[a-z_]+)` \|", section, re.M))


def http_count(metrics: dict, route: str, method: str, outcome: str) -> float:
    return metrics.get(("ray_search_http_requests_total",
                        frozenset({("route", route), ("method", method), ("outcome", outcome)})), 0)


def test_every_request_is_counted_once_by_route_method_and_outcome(service, built):
    """An answered search, a 422, a 404 for an unknown collection, a path the app has not, a health check and
    requests shed for load each move their own series by exactly what was sent; the index gauges hold the
    served version's size; every name README lists is in the scrape."""
    import asyncio

    base, running = service
    running.wait_printed(f"metrics (Prometheus): http://127.0.0.1:{METRICS_PORT}/metrics")
    # Ray reports a process's counters every few seconds, all of them at once: once a marker request shows, the
    # scrape holds every request answered before it (the earlier tests' too).
    marker = ("/openapi.json", "GET", "ok")
    seen = http_count(scrape(), *marker)
    assert httpx.get(f"{base}/openapi.json").status_code == 200
    before = wait_for(lambda m: http_count(m, *marker) == seen + 1,
                      lambda m: f"the marker request counted (the count is {http_count(m, *marker)}, was {seen})")
    sent = {("/search", "POST", "ok"): 3, ("/search", "POST", "422"): 2, ("/search", "POST", "404"): 1,
            ("other", "GET", "404"): 1, ("/health", "GET", "ok"): 1}
    for _ in range(3):
        assert httpx.post(f"{base}/search", json={"query": "telescope galaxy", "limit": 2}).status_code == 200
    assert httpx.post(f"{base}/search", json={"query": "", "limit": 2}).status_code == 422
    assert httpx.post(f"{base}/search", json={"query": "x", "limit": 1000}).status_code == 422
    assert httpx.post(f"{base}/search", json={"query": "x", "collections": ["nope"]}).status_code == 404
    assert httpx.get(f"{base}/no/such/path").status_code == 404
    assert httpx.get(f"{base}/health").status_code == 200
    # MCP (stateless: each JSON-RPC message its own POST) is counted as its own route, its refusals too.
    mcp = {"Accept": "application/json, text/event-stream"}
    tool_call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                 "params": {"name": "search", "arguments": {"query": "telescope galaxy", "limit": 2}}}
    answer = httpx.post(f"{base}/mcp", json=tool_call, headers=mcp, timeout=60)
    assert answer.status_code == 200 and answer.json()["result"]["structuredContent"]["results"], answer.text
    too_big = tool_call | {"params": {"name": "search", "arguments": {"query": "x" * 70_000}}}
    assert httpx.post(f"{base}/mcp", json=too_big, headers=mcp).status_code == 413
    sent |= {("/mcp", "POST", "ok"): 1, ("/mcp", "POST", "413"): 1}

    async def burst():
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            return await asyncio.gather(*(client.post("/search", json={"query": f"sail {i}", "limit": 100})
                                          for i in range(24)))

    statuses = [r.status_code for r in asyncio.run(burst())]
    sent[("/search", "POST", "ok")] += statuses.count(200)
    sent[("/search", "POST", "shed")] = statuses.count(503)
    assert sent[("/search", "POST", "shed")] > 0 and set(statuses) == {200, 503}

    expected = {k: float(v) for k, v in sent.items()}
    moved = lambda m: {key: http_count(m, *key) - http_count(before, *key) for key in sent}  # noqa: E731
    after = wait_for(lambda m: moved(m) == expected,
                     lambda m: f"every request counted once: {moved(m)} counted, {expected} sent")
    _, summary = built[3]
    version = summary.version_dir.name
    index = {name: v for (name, labels), v in after.items() if name.startswith("ray_search_index_")
             and labels == frozenset({("collection", "default"), ("version", version)})}
    assert index == {"ray_search_index_documents": float(summary.docs),
                     "ray_search_index_chunks": float(summary.chunks)}
    scraped = {name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for name, _ in after}
    listed = readme_metric_names()
    assert "ray_search_http_requests_total" in listed and len(listed) == 7
    # A skipped stage needs a stage that fails; this app has none to fail, so that counter is not exported yet.
    assert listed - scraped == {"ray_search_stages_skipped_total"}


def serve_logs(running: Running) -> list[dict]:
    """Every JSON line of the app's Serve logs (the Ray session's logs/serve/), found through its GCS process."""
    log_dir = next(arg.split("=", 1)[1] for p in running.processes for arg in p.cmdline() if arg.startswith("--log_dir="))
    lines = []
    for path in sorted(Path(log_dir, "serve").glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
    return lines


def test_the_request_id_is_in_every_log_line_and_error_body_and_queries_are_redacted(service):
    base, running = service
    secret = "telescope galaxy confidential-words"
    ok = httpx.post(f"{base}/search", json={"query": secret, "limit": 2}, headers={"X-Request-Id": "rid-ok-1"})
    assert ok.status_code == 200 and ok.headers["x-request-id"] == "rid-ok-1"
    missing = httpx.post(f"{base}/search", json={"query": "x", "collections": ["nope"]},
                         headers={"X-Request-Id": "rid-404-1"})
    assert missing.status_code == 404 and missing.json()["request_id"] == "rid-404-1"
    invalid = httpx.post(f"{base}/search", json={"query": ""})  # no id sent: Serve makes one and says it
    assert invalid.status_code == 422 and invalid.json()["request_id"] == invalid.headers["x-request-id"]
    nowhere = httpx.get(f"{base}/nowhere")  # Starlette's own 404, in the app's error body
    assert nowhere.status_code == 404 and nowhere.json() == {"error": "Not Found", "detail": None,
                                                             "request_id": nowhere.headers["x-request-id"]}

    def logged() -> list[dict] | None:
        lines = serve_logs(running)
        searches = {r.get("request_id") for r in lines if r.get("event") == "search"}
        return lines if {"rid-ok-1", "rid-404-1"} <= searches else None

    lines = wait_until(logged, 30, "the 'search' log lines of requests rid-ok-1 and rid-404-1", every_s=0.2)
    (search,) = [r for r in lines if r.get("request_id") == "rid-ok-1" and r.get("event") == "search"]
    assert search["route"] == "/search" and search["deployment"] == "raysearch_router" and search["outcome"] == "ok"
    assert search["query"].startswith("<redacted sha256:") and search["method"] == "hybrid"
    assert not [r for r in lines if "confidential-words" in json.dumps(r)]
    failed = [r for r in lines if r.get("request_id") == "rid-404-1" and r.get("event") == "search"]
    assert [r["outcome"] for r in failed] == ["error"]
    # README's example line names only fields a real line has.
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("### Logs and request ids"):readme.index("### Traces")]
    example = re.search(r"```json\n(.*?)```", section, re.S).group(1)
    assert set(re.findall(r'"([a-z_]+)":', example)) <= set(search)


def test_a_served_search_is_one_trace_exported_by_otlp_with_its_stages(service, collector):
    base, _ = service
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    r = httpx.post(f"{base}/search", json={"query": "telescope galaxy", "limit": 3},
                   headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01", "X-Request-Id": "rid-otlp-1"})
    assert r.status_code == 200
    stages = {"embed", "retrieve", "fuse", "fetch"}

    def exported() -> list | None:
        """The trace's spans once the root, its stages and a shard span are all in (sent in batches, every few
        seconds: the stages may come in an earlier batch than the root)."""
        mine = [s for s in collector.spans if s.trace_id.hex() == trace_id]
        roots = {s.span_id for s in mine if s.name == "search"}
        children = {s.name for s in mine if s.parent_span_id in roots}
        return mine if roots and stages <= children and any(s.name.startswith("shards default/") for s in mine) else None

    mine = wait_until(exported, 30, lambda: f"the search's spans, its stages {sorted(stages)} and a shard's: got "
                      f"{sorted(s.name for s in collector.spans if s.trace_id.hex() == trace_id)}", every_s=0.2)
    (root,) = [s for s in mine if s.name == "search"]
    assert root.parent_span_id.hex() == "b7ad6b7169203331"
    attributes = {a.key: a.value for a in root.attributes}
    assert attributes["request.id"].string_value == "rid-otlp-1"
    assert stages <= {s.name for s in mine if s.parent_span_id == root.span_id}


def time_wait_sockets(port: int) -> int:
    """TCP connections on this local port in TIME-WAIT (state 06 of /proc/net/tcp)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                count += state == "06" and int(local.rsplit(":", 1)[1], 16) == port
    return count


CLEAN_STOP_MISSES = ("Traceback", "rror", "failed")  # none of these in what a clean stop prints


def test_a_stop_drains_leaves_nothing_and_a_restart_gets_the_port_at_once(service, built):
    """After a few hundred requests from clients that keep their connections, the server's side of those
    connections sits in TIME-WAIT once it stops. A restart on the same port within a second must still bind it
    (it failed 4 times of 4 before the router bound with SO_REUSEADDR). Each stop (SIGTERM, then Ctrl-C)
    exits 0, prints no error, and leaves none of the processes it started; so does a second Ctrl-C during the drain."""
    base, running = service
    clients = [httpx.Client(base_url=base, timeout=30) for _ in range(16)]

    def load(client):
        for i in range(20):
            r = client.post("/search", json={"query": f"telescope galaxy {i}", "limit": 5})
            assert r.status_code in (200, 503), r.text

    threads = [threading.Thread(target=load, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert running.stop(signal.SIGTERM) == 0, running.output[-3000:]
    for c in clients:
        c.close()
    assert time_wait_sockets(PORT) > 0  # the case a plain bind refuses
    assert not [line for line in running.lines if any(m in line for m in CLEAN_STOP_MISSES)], running.output[-3000:]
    assert running.left_behind() == []

    _, summary = built[3]
    again = Running(summary.version_dir)  # within a second of the stop
    try:
        r = httpx.post(f"{again.base}/search", json={"query": "telescope galaxy", "limit": 3})
        assert r.status_code == 200 and len(r.json()["results"]) == 3
        # Ctrl-C twice: the second lands in the drain, which it cuts short (it used to escape it: exit -2).
        assert again.stop(signal.SIGINT, again_after_s=1.0) == 0, again.output[-3000:]
        assert not [line for line in again.lines if any(m in line for m in CLEAN_STOP_MISSES)], again.output[-3000:]
        assert again.left_behind() == []
    finally:
        again.kill()


def test_a_taken_metrics_port_is_said_at_once(built):
    """Ray fails to start its node, after a long timeout and without naming the port, when its metrics port is
    taken: the command checks first."""
    import socket

    _, summary = built[3]
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "deployments", "--index", str(summary.version_dir), "--port",
                               str(PORT), "--metrics-port", str(port)], cwd=Path(__file__).parents[2],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"--metrics-port {port} is taken" in proc.stderr
    assert time.monotonic() - t0 < 60
