"""Every HTTP request a router replica answers, counted once: by route, HTTP method and outcome.

Counted where the answer's status is known: the app's front door (``deployments.edge.front_door``) for every request
that reaches the app, and the shedding layer ahead of Serve (``shedding.ShedFirst``) for the requests it
refuses there, which the app never sees. The outcome is what an operator alerts on: ``ok`` (2xx, 3xx),
the status of a client error (``400``, ``401``, ``404``, ``413``, ``422``, ``429`` over a key's own limit, ...), ``shed`` (503 refused for load),
``504`` (past the request deadline) and ``5xx`` (every other server error, a crash included). Routes are the
app's route templates (``/admin/collections/{collection}/activate``), and any other path is ``other``: a
scanner probing paths cannot make a label per path.

Exported through Ray's metrics agent, as Prometheus sees it: ``ray_search_http_requests_total{route, method,
outcome}`` (README, "Metrics", lists every name). Kept free of the router's imports: the shedding layer loads
it in the router's process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

log = logging.getLogger(__name__)

HOLD_S = 0.5  # how long a request's metric records wait to be made with the others of that moment


class Held:
    """Metric records made together a moment later, not one by one inside each request.

    A Ray metric record is a call into Ray's metrics library with its tags; a search makes about nine (its
    stages' latencies, its size, its outcome, its HTTP status). Made inside a loaded request each cost about 35 us of CPU,
    where made in a run they cost about 6 to 10: about 0.29 ms of a search's CPU in a loaded replica went to them
    (bench/README.md, "A page's scores, the log line and the metrics"). Held here, they are made ``HOLD_S`` after the first of
    them on the event loop that asked, each histogram observation as it was and each counter's increments summed
    (a counter's total is what Prometheus reads): a scrape sees them at most that much later, beside Ray's own export
    of a process's metrics every few seconds. Called outside an event loop (a test calling the app directly), records
    are made at once. Records held when a replica stops (half a second's) are not made."""

    def __init__(self):
        self._lock = threading.Lock()  # the shedding layer and the app may count from two threads
        self._counts: dict[tuple, float] = {}
        self._observed: list[tuple] = []
        self._due, self._due_at = False, 0.0

    def record(self, observed: list[tuple] = (), counted: list[tuple] = ()) -> None:
        """``observed``: (histogram, value, tags dict) each; ``counted``: (counter, tags as pairs) each, one more."""
        with self._lock:
            self._observed += observed
            counts = self._counts
            for key in counted:
                counts[key] = counts.get(key, 0.0) + 1.0
        self._soon()

    def _soon(self) -> None:
        now = time.monotonic()
        if self._due and now - self._due_at < 4 * HOLD_S:
            return
        try:  # (a flush due long ago: the loop that was to run it stopped first, so it is made here)
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        if self._due:
            self.flush()
            return
        self._due, self._due_at = True, now
        loop.call_later(HOLD_S, self.flush)

    def flush(self) -> None:
        """Every record held, made now."""
        with self._lock:
            counts, observed = self._counts, self._observed
            self._counts, self._observed, self._due = {}, [], False
        try:
            for (counter, tags), value in counts.items():
                counter.inc(value, tags=dict(tags))
            for histogram, value, tags in observed:
                histogram.observe(value, tags=tags)
        except Exception:  # noqa: BLE001 - metrics must never fail the loop that makes them
            log.exception("metric records could not be made; these are lost")

ROUTES = frozenset({
    "/search", "/search/batch", "/feedback", "/feedback/qrels", "/health", "/admin/versions",
    "/admin/collections/{collection}/activate", "/admin/collections/{collection}/rollback",
    "/", "/console", "/console/{asset}", "/docs", "/openapi.json", "/redoc", "/docs/oauth2-redirect",
    "/collections", "/collections/{collection}/documents", "/collections/{collection}/documents/{doc_id}",
    "/collections/{collection}/documents/delete", "/mcp",
})
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"})


def route_label(scope, path: str) -> str:
    """The route template the app matched (Starlette leaves it in the scope), else the path if it is one."""
    route = scope.get("route")
    template = getattr(route, "path", None)
    if template in ROUTES:
        return template
    if path in ROUTES:
        return path
    if path.startswith("/console/"):
        return "/console/{asset}"
    if path.startswith("/admin/collections/") and path.endswith(("/activate", "/rollback")):
        return "/admin/collections/{collection}/" + path.rsplit("/", 1)[1]
    return "other"


def outcome(status: int, shed: bool = False) -> str:
    if status < 400:
        return "ok"
    if status < 500:
        return str(status)
    if status == 503 and shed:
        return "shed"
    if status == 504:
        return "504"
    return "5xx"


class HttpRequests:
    """The counter, made on first use in the process that counts (Ray's metrics need a Ray worker; outside
    one, as in a test calling the app directly, nothing is counted)."""

    def __init__(self):
        self._counter = None
        self._ready = False
        self.held = Held()

    def _get(self):
        if not self._ready:
            self._ready = True
            try:
                import ray
                from ray.util import metrics

                if ray.is_initialized():
                    self._counter = metrics.Counter(
                        "search_http_requests", description="HTTP requests answered, by route, method and outcome.",
                        tag_keys=("route", "method", "outcome"))
            except Exception:  # noqa: BLE001 - metrics must never fail a request
                log.exception("the HTTP request counter could not be made; requests are not counted")
        return self._counter

    def count(self, route: str, method: str, status: int, shed: bool = False) -> None:
        counter = self._get()
        if counter is not None:
            self.held.record(counted=[(counter, (("route", route), ("method", method if method in METHODS else "other"),
                                                 ("outcome", outcome(status, shed))))])


HTTP_REQUESTS = HttpRequests()


# A response's warnings that say an optional stage was skipped (the pipeline writes them), and the stage each names.
_SKIPPED_STAGES = (("spell correction stopped", None), ("spell correction", "spelling"), ("query encoder", "embed"),
                   ("reranking", "rerank"), ("MMR skipped", "mmr"), ("synthesis", "synthesis"))


def skipped_stage(warning: str) -> str | None:
    return next((stage for start, stage in _SKIPPED_STAGES if warning.startswith(start)), None)


class SearchMetrics:
    """The router's search metrics (README, "Metrics", lists them as Prometheus sees them); HTTP requests are
    counted apart, every one (``HTTP_REQUESTS`` above)."""

    def __init__(self):
        from ray.util import metrics  # here: Ray's metrics exist only in a Ray worker

        self.stage_ms = metrics.Histogram(
            "search_stage_latency_ms", description="Latency of each search stage (ms).",
            boundaries=[0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000], tag_keys=("stage", "method"))
        self.retrieved = metrics.Histogram(
            "search_retrieved_documents", description="Results returned per request.",
            boundaries=[0.5, 1, 5, 10, 20, 50, 100], tag_keys=("method",))
        self.requests = metrics.Counter(
            "search_requests", description="Searches answered, by search method and outcome (ok, degraded, cached).",
            tag_keys=("method", "outcome"))
        self.skipped = metrics.Counter(
            "search_stages_skipped", description="Optional stages that failed or timed out and were skipped.",
            tag_keys=("stage", "method"))
        self.documents = metrics.Gauge(
            "search_index_documents", description="Documents of the index version a collection serves (0: no longer "
            "served).", tag_keys=("collection", "version"))
        self.chunks = metrics.Gauge(
            "search_index_chunks", description="Chunks of the index version a collection serves (0: no longer served).",
            tag_keys=("collection", "version"))
        self._served: dict[str, str] = {}
        self.held = Held()

    def record(self, response) -> None:
        method, stage_ms = response.method.value, self.stage_ms
        observed = [(stage_ms, ms, {"stage": stage, "method": method}) for stage, ms in response.timings_ms.items()]
        observed.append((self.retrieved, response.total_results, {"method": method}))
        outcome = "cached" if response.cached else ("degraded" if response.coverage.degraded else "ok")
        counted = [(self.requests, (("method", method), ("outcome", outcome)))]
        for warning in response.warnings:
            stage = skipped_stage(warning)
            if stage is not None:
                counted.append((self.skipped, (("stage", stage), ("method", method))))
        self.held.record(observed, counted)

    def index(self, collections) -> None:
        """The version each collection serves and its size; a version no longer served drops to 0. Set again on every
        call (the router's follower makes one a second): Ray's metrics agent stops exporting a gauge that has not been
        set for a while, and a version served for hours must stay in the scrape."""
        for c in collections:
            before = self._served.get(c.name)
            if before is not None and before != c.version:
                for gauge in (self.documents, self.chunks):
                    gauge.set(0, tags={"collection": c.name, "version": before})
            self.documents.set(c.documents, tags={"collection": c.name, "version": c.version})
            self.chunks.set(c.chunks, tags={"collection": c.name, "version": c.version})
            self._served[c.name] = c.version
