"""Serve in the test process: started once for the run, its applications deleted by each module that deploys.

Serve's controller and proxy took about 5 s to start and as long to stop (on the 2-core machine), which every module
that served paid; one proxy on one port for the whole run pays it once. A module deploys its application(s) after
``start_serve()`` and leaves none behind (``stop_serving()``), so the next module starts from an empty Serve.

Deleting an application takes about 3 s however idle it is (each replica waits Serve's graceful-shutdown loop, 2 s,
before it checks for requests in flight). ``stop_serving`` does not wait for it: the next module's ``start_serve``
does, after that module has built its index, so the two overlap.
"""

from __future__ import annotations

SERVE_PORT = 18231  # the proxy's port on loopback, for every module that serves in this process
BASE = f"http://127.0.0.1:{SERVE_PORT}"


def start_serve() -> str:
    """Serve running, with its proxy on ``SERVE_PORT`` (the one a module before started, when there is one), and
    no application left of a module before (waited for here); returns the proxy's address."""
    from ray import serve

    from tests.waiting import wait_until

    serve.start(http_options={"host": "127.0.0.1", "port": SERVE_PORT})
    wait_until(lambda: not serve.status().applications, timeout_s=120, every_s=0.2,
               what="the applications a module before deleted to be gone")
    return BASE


def stop_serving() -> None:
    """Every application deleted (each replica drains and stops), without waiting for it: Serve itself is left
    running for the next module, whose ``start_serve`` waits."""
    from ray import serve

    for name in list(serve.status().applications):
        serve.delete(name, _blocking=False)  # Serve's own flag: the deletion goes on in its controller
