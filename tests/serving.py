"""Serve in the test process: started once for the run, its applications deleted by each module that deploys.

Serve's controller and proxy took about 5 s to start and as long to stop (on the 2-core machine), which every module
that served paid; one proxy on one port for the whole run pays it once. A module deploys its application(s) after
``start_serve()`` and leaves none behind (``stop_serving()``), so the next module starts from an empty Serve.
"""

from __future__ import annotations

SERVE_PORT = 18231  # the proxy's port on loopback, for every module that serves in this process
BASE = f"http://127.0.0.1:{SERVE_PORT}"


def start_serve() -> str:
    """Serve running, with its proxy on ``SERVE_PORT`` (the one a module before started, when there is one);
    returns the proxy's address."""
    from ray import serve

    serve.start(http_options={"host": "127.0.0.1", "port": SERVE_PORT})
    return BASE


def stop_serving() -> None:
    """Every application deleted (each replica drained and stopped), Serve itself left running for the next module."""
    from ray import serve

    for name in list(serve.status().applications):
        serve.delete(name)
