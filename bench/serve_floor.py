"""What one HTTP request costs before any search: the floor under a query's CPU.

The same FastAPI app, whose ``POST /search`` validates a body like this project's and answers a fixed page of
ten results, served three ways, one after another, and loaded alike (``bench.serving.level``: closed-loop
clients, server CPU a request = the machine's busy CPU minus this process's):
- ``uvicorn``: the app under uvicorn alone, one process;
- ``serve``: the app as a Ray Serve ingress deployment answering HTTP itself (direct ingress, Serve's throughput
  mode), as ``python -m deployments`` deploys the router: Ray's own processes (GCS, raylet, controller, proxy,
  dashboard agent) count, as they do for the service;
- ``serve-proxy``: the same deployment behind Serve's HTTP proxy (``--via-proxy``).

    python -m bench.serve_floor --out bench/results/serve_floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from pydantic import BaseModel, Field

from bench.common import machine, service_process, write_record

PAGE = {"results": [{"chunk_id": f"doc{i}#0", "doc_id": f"doc{i}", "score": 1.0 / (i + 1), "rank": i + 1,
                     "text": "x" * 600} for i in range(10)], "total_results": 10}


def make_app():
    from fastapi import FastAPI
    from fastapi.responses import Response

    app = FastAPI(title="floor")
    body = json.dumps(PAGE).encode()

    @app.post("/search")
    async def search(q: FloorQuery) -> Response:
        return Response(body, media_type="application/json")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    return app


class FloorQuery(BaseModel):  # at module level: FastAPI resolves the route's (string) annotation here
    query: str = Field(min_length=1, max_length=2000)
    limit: int = Field(10, ge=1, le=100)
    method: str = "hybrid"
    include_citations: bool = True


def serve_uvicorn(port: int) -> None:
    import uvicorn

    uvicorn.run(make_app(), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def serve_ray(port: int, via_proxy: bool) -> None:
    """The app as one Serve ingress deployment, with the environment ``python -m deployments`` sets."""
    os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
    os.environ.setdefault("RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE", "1")
    http_port = port
    if not via_proxy:
        os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"
        os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] = str(port)
        os.environ["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] = str(port + 1)
        http_port = port + 7
    import ray
    from ray import serve

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    app = make_app()

    @serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=256)
    @serve.ingress(app)
    class Floor:
        pass

    serve.start(http_options={"host": "127.0.0.1", "port": http_port})
    serve.run(Floor.bind(), name="floor", route_prefix="/")
    while True:
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.serve_floor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--port", type=int, default=8750)
    ap.add_argument("--only", nargs="+", choices=["uvicorn", "serve", "serve-proxy"],
                    default=["uvicorn", "serve", "serve-proxy"])
    ap.add_argument("--out", type=Path, default=Path("bench/out/serve_floor.json"))
    ap.add_argument("--run", choices=["uvicorn", "serve", "serve-proxy"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run == "uvicorn":
        serve_uvicorn(args.port)
        return 0
    if args.run is not None:
        serve_ray(args.port, args.run == "serve-proxy")
        return 0

    from bench.serving import level

    texts = [f"query number {i} about cells and proteins" for i in range(300)]
    record = {"machine": machine(), "clients": args.clients, "seconds": args.seconds, "ways": {}}
    for way in args.only:
        cmd = [sys.executable, "-m", "bench.serve_floor", "--run", way, "--port", str(args.port)]
        with service_process(cmd, args.port, startup_s=300) as base:
            level(base, texts, {"limit": 10}, 2, 10)  # warm
            record["ways"][way] = level(base, texts, {"limit": 10}, args.clients, args.seconds)
        lv = record["ways"][way]
        print(f"{way}: {lv['qps']:.1f} requests/s, {lv['server_cpu_ms_per_query']:.2f} ms of server CPU a request, "
              f"p50 {lv['p50_ms']:.1f} ms", flush=True)
        args.port += 10
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
