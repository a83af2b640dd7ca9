"""What a router replica records of each search: its metrics (``SearchMetrics``), its trace when OTLP is configured
(``SearchTracer``), and one log line, in Serve's log format (JSON by default: these fields beside Serve's
request_id, route, application, deployment and replica), the query redacted unless ``router.redact_queries`` is
off. A search that fails is logged and traced too, with the status it is answered with."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from deployments.edge.errors import status_of
from deployments.edge.schemas import SearchRequest, SearchResponse
from deployments.errors import ServiceError
from deployments.search.stages import redact

logger = logging.getLogger("ray.serve")


class SearchRecorder:
    def __init__(self, metrics, otlp_endpoint: str | None = None):
        self.metrics, self.tracer = metrics, None
        if otlp_endpoint:  # imported only then (see deployments.search.tracing)
            from deployments.search.tracing import SearchTracer

            self.tracer = SearchTracer(otlp_endpoint)

    @contextmanager
    def search(self, body: SearchRequest, headers: Mapping[str, str], request_id: str | None,
               redact_queries: bool) -> Iterator[Callable[[SearchResponse], None]]:
        """Around one search: hands over the function to call with its response once it is answered."""
        t0, outcome = time.perf_counter(), "error"

        def answered(response: SearchResponse) -> None:
            nonlocal outcome
            outcome = "degraded" if response.coverage.degraded else "ok"
            self.metrics.record(response)
            if self.tracer is not None:
                self.tracer.record(response, headers, request_id)

        try:
            yield answered
        except Exception as exc:
            if self.tracer is not None:
                self.tracer.record_failure(headers, t0, status_of(exc) if isinstance(exc, ServiceError) else 500,
                                           request_id)
            raise
        finally:
            logger.info("search", extra={
                "event": "search", "query": redact(body.query) if redact_queries else body.query,
                "method": body.method.value, "limit": body.limit, "outcome": outcome,
                "ms": round((time.perf_counter() - t0) * 1000, 2),
            })
