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


class LineContext:
    """The fields Serve's log filters add to a line, for the search line: the Ray worker's (job, worker, node and
    actor ids, the actor's name) and the replica's (application, deployment, replica) worked out once, the request's
    (route, request id) per line, and the line marked to skip those filters. Serve does the same for its own access
    log: the filters ask Ray's runtime context for every field on every line, about 0.2 ms of a search's CPU in a
    loaded replica (bench/README.md, "A page's scores, the log line and the metrics"). The task fields the filters
    would add are left out: in a replica answering HTTP itself they name its initialization, not the search.
    Outside a Serve replica (an app called directly, as tests do) nothing is worked out and lines go through the
    filters as before."""

    def __init__(self):
        self._fixed: dict[str, str] | None = None
        self._tried = False

    def fields(self, route: str, request_id: str | None) -> dict[str, str]:
        if not self._tried:
            self._tried = True
            self._fixed = _replica_fields()
        if self._fixed is None:
            return {}
        return self._fixed | {"route": route} | ({"request_id": request_id} if request_id else {})


def _replica_fields() -> dict[str, str] | None:
    try:
        import ray
        from ray import serve

        if not ray.is_initialized():
            return None
        runtime, replica = ray.get_runtime_context(), serve.get_replica_context()
    except Exception:  # noqa: BLE001 - not in a replica: the filters add what they can
        return None
    deployment = replica.replica_id.deployment_id
    fields = {"job_id": runtime.get_job_id(), "worker_id": runtime.get_worker_id(), "node_id": runtime.get_node_id(),
              "actor_id": runtime.get_actor_id(), "actor_name": runtime.get_actor_name(),
              "application": deployment.app_name,
              "deployment": f"{deployment.app_name}_{deployment.name}" if deployment.app_name else deployment.name,
              "replica": replica.replica_id.unique_id, "component_name": "replica"}
    return {k: v for k, v in fields.items() if v} | {"skip_context_filter": True}


class SearchRecorder:
    def __init__(self, metrics, otlp_endpoint: str | None = None):
        self.metrics, self.tracer = metrics, None
        self.context = LineContext()
        if otlp_endpoint:  # imported only then (see deployments.search.tracing)
            from deployments.search.tracing import SearchTracer

            self.tracer = SearchTracer(otlp_endpoint)

    @contextmanager
    def search(self, body: SearchRequest, headers: Mapping[str, str], request_id: str | None,
               redact_queries: bool, route: str = "/search") -> Iterator[Callable[[SearchResponse], None]]:
        """Around one search (asked on ``route``): hands over the function to call with its response once it is
        answered."""
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
            logger.info("search", extra=self.context.fields(route, request_id) | {
                "event": "search", "query": redact(body.query) if redact_queries else body.query,
                "method": body.method.value, "limit": body.limit, "outcome": outcome,
                "ms": round((time.perf_counter() - t0) * 1000, 2),
            })
