"""OpenTelemetry traces of searches: one trace a request, a span per stage, exported by OTLP when configured.

Off unless ``tracing.otlp_endpoint`` is set (``--otlp-endpoint``): then nothing is imported and each request
pays one attribute check. On, a search's spans are written when it ends, from the stage times the pipeline
measures anyway (``timings_ms``): a root span ``search`` (the request's id, method, collections, versions,
results and coverage as attributes) and, as its children, ``spell``, ``embed``, ``retrieve`` (with a child per
shard group called: ``shards COLLECTION/GROUP``, as long as the group took), ``fuse``, ``rerank``, ``mmr``,
``fetch``, ``assemble`` and ``synthesize``, each where it ran. A caller's ``traceparent`` header (W3C) makes the
search a child of the caller's trace. Writing spans after the fact costs nothing while the request runs, and
one code path measures the stages for both the response and the trace.

The spans are the router's view: a shard group in its own replica appears as the time its call took from the
router (the group reports how long it searched), not as spans of its own process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


class SearchTracer:
    def __init__(self, otlp_endpoint: str | None = None, service_name: str = "raysearch", exporter=None):
        """``exporter``: any OpenTelemetry span exporter (tests pass the SDK's in-memory one); else OTLP over
        HTTP to ``otlp_endpoint`` (e.g. ``http://collector:4318/v1/traces``), batched off the request path."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        if exporter is not None:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
        self.tracer = self.provider.get_tracer("raysearch")
        # perf_counter seconds -> epoch nanoseconds, for spans written after the fact.
        self._offset_ns = time.time_ns() - int(time.perf_counter() * 1e9)

    def _ns(self, perf_s: float) -> int:
        return self._offset_ns + int(perf_s * 1e9)

    def record(self, response, headers: Mapping[str, str], request_id: str | None = None) -> None:
        """The spans of one answered search (a cached answer is its root span alone)."""
        from opentelemetry import propagate, trace

        start, end, stages = response._stages or (time.perf_counter(), time.perf_counter(), [])
        parent = propagate.extract(dict(headers))
        root = self.tracer.start_span("search", context=parent, start_time=self._ns(start), attributes=_attributes(
            response, request_id))
        context = trace.set_span_in_context(root)
        spans: dict[str, Any] = {}
        if not response.cached:
            for stage in stages:
                under = trace.set_span_in_context(spans[stage.parent]) if stage.parent in spans else context
                span = self.tracer.start_span(stage.name, context=under, start_time=self._ns(stage.start))
                span.end(end_time=self._ns(stage.end))
                spans.setdefault(stage.name, span)
        root.end(end_time=self._ns(end))

    def record_failure(self, headers: Mapping[str, str], started: float, status: int, request_id: str | None) -> None:
        from opentelemetry import propagate
        from opentelemetry.trace import Status, StatusCode

        root = self.tracer.start_span("search", context=propagate.extract(dict(headers)), start_time=self._ns(started),
                                      attributes={"http.response.status_code": status,
                                                  **({"request.id": request_id} if request_id else {})})
        root.set_status(Status(StatusCode.ERROR))
        root.end()

    def shutdown(self) -> None:
        self.provider.shutdown()


def _attributes(response, request_id: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "search.method": response.method.value, "search.results": response.total_results,
        "search.cached": response.cached, "search.reranked": response.reranked,
        "search.shards_asked": response.coverage.shards_asked,
        "search.shards_answered": response.coverage.shards_answered,
        "search.collections": sorted(response.index_version),
        "search.index_versions": [f"{c}={v}" for c, v in sorted(response.index_version.items())],
        "http.response.status_code": 200,
    }
    if request_id:
        out["request.id"] = request_id
    if response.warnings:
        out["search.warnings"] = list(response.warnings)
    return out
