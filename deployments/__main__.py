"""``python -m deployments --index DIR --port PORT``: serve an index in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

from index_format.process import configure_process

DRAIN_BOUND_S = 45  # a stop waits this long at most for replicas to finish (Serve gives each 20 s)
APP = "raysearch"  # the Serve application's name, as deployments.settings and relevance.tune --apply name it


def show_example(base: str, query: str, synthesize: bool = False) -> None:
    import json

    import httpx

    body = {"query": query, "limit": 3} | ({"synthesize": True} if synthesize else {})
    r = httpx.post(f"{base}/search", json=body, timeout=300)
    print(f"\nPOST /search {json.dumps(body)} -> {r.status_code}")
    data = r.json()
    for hit in data.get("results", []):
        snippet = " ".join(hit["content"].split())[:80]
        print(f"  {hit['rank']}. {hit['score']:.4f}  {hit['doc_id']}  {snippet}")
    if data.get("answer"):
        a = data["answer"]
        print(f"  answer ({a['model']}, {a['completion_tokens']} tokens in {a['ms'] / 1000:.1f} s): {a['text']}")
        print(f"  citations {[(c['n'], c['doc_id']) for c in a['citations']]}")
    for warning in data.get("warnings", []):
        print(f"  warning: {warning}")
    print(f"  timings_ms {data.get('timings_ms')}  coverage {data.get('coverage')}\n", flush=True)


def answers(url: str, wait_s: float = 30) -> bool:
    import httpx

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=5).status_code < 500:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        # As a server binds: connections of a stopped run in TIME-WAIT do not make the port taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def parser() -> tuple[argparse.ArgumentParser, list[str]]:
    """The command's flags: one per field of ``AppConfig`` (its paths returned), and the few that only run the
    process."""
    from deployments.cli import add_model_arguments
    from deployments.config import AppConfig

    ap = argparse.ArgumentParser(
        prog="python -m deployments",
        usage="%(prog)s [--config FILE.yaml] [--index ROOT] [--port PORT] [--SECTION.OPTION VALUE ...]",
        description="Serve an index built by index_build over HTTP (POST /search, GET /health, /docs) as one Ray\n"
                    "Serve application, in the foreground until interrupted. Every option of the app's config\n"
                    "(deployments/config.py; serve_config.yaml's args) is a flag named by its place in the config:\n"
                    "shards: {num_replicas: 2} is --shards.num-replicas 2. Flags override --config's file.",
        epilog="examples:\n"
               "  python -m deployments --index indexes/demo --port 8000 --synthesis.enabled\n"
               "  python -m deployments --config serve_config.yaml --router.cache-size 0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run = ap.add_argument_group("running the process (not part of the app's config)")
    run.add_argument("--config", type=Path, metavar="FILE.yaml",
                     help="the app's config: a YAML mapping of its options, or a Serve config file whose one "
                          "application of this app gives its args (serve_config.yaml)")
    run.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    run.add_argument("--port", type=int, default=8000, help="HTTP port (default: %(default)s)")
    run.add_argument("--via-proxy", action="store_true",
                     help="answer --port through Serve's HTTP proxy (one more hop per request) instead of the "
                          "router replica's own HTTP server")
    run.add_argument("--metrics-port", type=int, default=8080, metavar="PORT",
                     help="where Ray's metrics agent serves Prometheus metrics, /metrics; 0: a free port (default: "
                          "%(default)s; names in README, 'Metrics')")
    run.add_argument("--example", metavar="QUERY", help="once serving, send this query and print the answer")
    return ap, add_model_arguments(ap, AppConfig, metavars={"index": "ROOT"})


def parse_args(argv: list[str] | None = None):
    """The app's config (``--config``'s file, then the flags given over it) and the process's flags; exits with
    2 on a bad flag, file or value."""
    import yaml

    from deployments.cli import USAGE_ERROR, model_from_args
    from deployments.config import AppConfig, app_args_from_yaml

    ap, paths = parser()
    args = ap.parse_args(argv)
    try:
        values = app_args_from_yaml(args.config) if args.config else {}
    except (OSError, ValueError, yaml.YAMLError) as e:
        ap.exit(USAGE_ERROR, f"{ap.prog}: error: --config: {e}\n")
    return model_from_args(ap, AppConfig, paths, args, values), args


def absolute_indexes(cfg):
    """The config with its index paths absolute, resolved against this process's directory, where they were
    given: the app is built and served by other processes."""
    from index_format.versions import absolute_root

    if cfg.index is not None:
        return cfg.model_copy(update={"index": absolute_root(cfg.index)})
    return cfg.model_copy(update={"collections": {name: c.model_copy(update={"index": absolute_root(c.index)})
                                                  for name, c in cfg.collections.items()}})


def main(argv: list[str] | None = None) -> int:
    from deployments.cli import FAILURE, USAGE_ERROR

    cfg, args = parse_args(argv)
    cfg = absolute_indexes(cfg)

    configure_process()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    # Serve's throughput mode (user code on the replica's own loop, buffered request logs, handle calls over
    # gRPC): read by every Ray process at start, so it is set before Ray starts (export 0 to turn it off).
    os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
    # ... which also holds a replica's log lines until 1,000 are waiting: a search's line reaches the log at once
    # here (one write a search, a few microseconds against milliseconds of work); export a larger size to batch.
    os.environ.setdefault("RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE", "1")
    # Serve's controller runs its loop every 0.5 s instead of 0.1: it and the GCS it asks cost the node half as much
    # CPU every second, at rest or not (bench/README.md, "What a node spends at rest"); a replica started, lost or
    # scaled is acted on up to 0.4 s later, where health checks and autoscaling decide over seconds. Read by the
    # controller when it starts, from the Ray node's environment (a cluster started elsewhere: export it there).
    os.environ.setdefault("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.5")
    # Load shedding as the outermost layer of every HTTP server of the app (the router's own among them), so a
    # refused request costs no Serve request handling: Serve asks this function for its HTTP middlewares.
    os.environ.setdefault("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", "deployments.edge.shedding.middlewares")
    proxy_port = args.port
    if not args.via_proxy:
        # The router replica answers HTTP on --port itself (Serve's "direct ingress"): the proxy's hop cost
        # about a third of a query's CPU (bench/README.md, "Serving cost"). Serve's proxy still runs, on a free port.
        os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"
        os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] = str(args.port)
        os.environ["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] = str(args.port + 1)  # exclusive: one port
        os.environ.setdefault("RAY_SERVE_PORT_QUARANTINE_S", "0")  # a restarted router takes --port back at once
        os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "1")  # Ctrl-C stops promptly
        proxy_port = free_port(args.host)
    import ray
    from ray import serve

    from deployments.serve.app import build_app, logical_cpus_needed, placement_warnings
    from index_format.manifest import IndexMismatch

    try:
        build_app(cfg)  # every check that can fail, before Ray starts
    except (IndexMismatch, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return FAILURE
    if os.environ.get("RAY_ADDRESS"):
        if not args.via_proxy:
            print("error: joining a running Ray cluster (RAY_ADDRESS), serve through its proxy: add --via-proxy",
                  file=sys.stderr)
            return USAGE_ERROR
        ray.init(address=os.environ["RAY_ADDRESS"])
    else:
        need = logical_cpus_needed(cfg)
        if need > (os.cpu_count() or 1) + 1e-9:
            print(f"error: these settings reserve {need:g} Ray CPUs to start, and this machine has {os.cpu_count()}: "
                  "lower what a component reserves (--shards.num-cpus, --shards.num-replicas, --reranker.num-cpus, "
                  "--reranker.autoscaling.min-replicas, --synthesis.num-cpus)",
                  file=sys.stderr)
            return USAGE_ERROR
        if args.metrics_port == 0:
            args.metrics_port = free_port(args.host)
        elif not port_is_free(args.metrics_port):
            # Ray would fail to start its node after a long timeout, saying nothing of the port.
            print(f"error: --metrics-port {args.metrics_port} is taken: pick another, or 0 for a free one",
                  file=sys.stderr)
            return USAGE_ERROR
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, object_store_memory=512 * 2**20,
                 log_to_driver=False, _metrics_export_port=args.metrics_port)
    # Shard groups no node can hold stay pending (never packed onto too small a node); said here, where it is seen.
    for warning in placement_warnings(cfg):
        print(f"warning: {warning}", file=sys.stderr)
    # SIGTERM (a supervisor, `kill`) stops it like Ctrl-C, also while it is still starting.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        return _serve(args, cfg, proxy_port, ray, serve)
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(serve, ray)


# Set by the first Ctrl-C or SIGTERM. The KeyboardInterrupt raised with it can be swallowed by a library call it
# lands in (Serve's deploy, still waiting for the app when a client already got answers): the main loop checks the
# flag too, so a stop is never lost.
STOPPING = threading.Event()
# Set by any later one: the drain is cut short, and the processes are stopped at once.
HURRY = threading.Event()


def _interrupt(*_):
    """Only the first signal raises: one raised while the stop drains would escape it, and the command would die
    by SIGINT with Ray's processes left running (a CI run saw a restarted service exit so, -2, within the drain)."""
    if STOPPING.is_set():
        HURRY.set()
        return
    STOPPING.set()
    raise KeyboardInterrupt


def _stop(serve, ray) -> None:
    """Drain, then stop. Deleting the app has each replica finish the requests it holds (up to Serve's
    ``graceful_shutdown_timeout_s``, 20 s; the whole drain up to ``DRAIN_BOUND_S``) while it takes no new ones;
    then Ray stops every process it started.
    ``serve.shutdown()`` is not called: it ends with Serve's controller killing itself while the caller waits on
    it, which Ray printed as a failed task ("ServeController.graceful_shutdown failed") on every clean stop."""
    def drain():
        with contextlib.suppress(Exception):  # Serve never started, or the app never deployed: nothing to drain
            serve.delete(APP)

    # Ours again, whatever a library left in their place: a signal during the stop must not kill the command.
    STOPPING.set()
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    print("stopping: the replicas finish the requests they hold (Ctrl-C to stop at once)", file=sys.stderr, flush=True)
    draining = threading.Thread(target=drain, daemon=True)
    draining.start()
    deadline = time.monotonic() + DRAIN_BOUND_S  # past the bound the processes are stopped anyway
    while draining.is_alive() and not HURRY.is_set() and time.monotonic() < deadline:
        draining.join(0.2)
    ray.shutdown()


def _serve(args, cfg, proxy_port: int, ray, serve) -> int:
    from deployments.config import app_policy_from_yaml
    from deployments.settings import deploy_app

    serve.start(http_options={"host": args.host, "port": proxy_port})
    # Deployed from a config, as `serve run serve_config.yaml` is, so that python -m deployments.settings
    # (and relevance.tune --apply) can change the router's settings in place.
    offline = {k: os.environ[k] for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OPENAI_API_KEY",
                                          "TOKENIZERS_PARALLELISM", "RAY_SERVE_THROUGHPUT_OPTIMIZED",
                                          "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE")
               if k in os.environ}
    try:
        deploy_app(cfg.model_dump(mode="json", exclude_defaults=True), APP, env_vars=offline,
                   autoscaling_policy=app_policy_from_yaml(args.config) if args.config else None)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    base = f"http://{args.host}:{args.port}"
    if not args.via_proxy and not answers(f"{base}/health"):
        print(f"error: nothing answers on {base} (is port {args.port} taken?); or use --via-proxy", file=sys.stderr)
        return 1
    indexes = ", ".join(str(c.index) for c in cfg.resolved_collections().values())
    print(f"serving {indexes} at {base}  (docs: {base}/docs, console: {base}/console, health: {base}/health); "
          "Ctrl-C to stop")
    if os.environ.get("RAY_ADDRESS"):
        print("  metrics (Prometheus): /metrics on each node's Ray metrics agent (ray start --metrics-export-port)")
    else:
        print(f"  metrics (Prometheus): http://{args.host}:{args.metrics_port}/metrics")
    print(f"  Ray cluster {ray.get_runtime_context().gcs_address}: pass it as --address to python -m "
          "deployments.settings (settings changed in place)")
    print(f"  curl -s {base}/search -H 'content-type: application/json' -d '{{\"query\": \"how to parse arguments\", \"limit\": 3}}'",
          flush=True)
    if args.example:
        show_example(base, args.example, synthesize=cfg.synthesis.enabled)
    while not STOPPING.wait(0.5):
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
