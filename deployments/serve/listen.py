"""The router replica's own HTTP socket binds with ``SO_REUSEADDR``, as every server people run does.

``python -m deployments`` has the router replica answer ``--port`` itself (Serve's direct ingress), and Serve
binds that socket with no option at all. After a run that served clients, the connections the old server
closed sit in TIME-WAIT for a minute, and Linux refuses a plain bind while they do (EADDRINUSE): Serve then
blocks the port, reports ``NoAvailablePortError`` and the app fails to deploy. A supervisor restarting the
service, or a developer changing a flag, hit that every time (4 restarts of 4 after a few hundred requests).

``SO_REUSEADDR`` (what uvicorn, nginx and Elasticsearch set) lets the bind through past TIME-WAIT connections
while a port another socket listens on is still refused. ``SO_REUSEPORT``, which Serve sets for its proxies,
is not wanted here: it would let a second service on the same port silently take half the traffic.

Serve offers no option for this socket, so the replica's server start is wrapped in the router's process before
the server starts (the router's constructor runs first). Where a Ray version changes what is wrapped, nothing
is changed and the router logs why.
"""

from __future__ import annotations

import inspect
import logging
import socket

log = logging.getLogger(__name__)

_MARK = "raysearch_reuses_address"


def _reuse_address(sock: socket.socket) -> bool:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return True


def reuse_address_on_bind() -> bool:
    """Make this process's direct-ingress HTTP server bind with ``SO_REUSEADDR`` only (idempotent). True when
    in place."""
    try:
        from ray.serve._private import http_util, replica
    except ImportError:  # pragma: no cover - Serve without direct ingress
        return False
    original = getattr(replica, "start_asgi_http_server", None)
    if original is None or getattr(original, _MARK, False):
        return original is not None
    if "enable_so_reuseport" not in inspect.signature(original).parameters or not hasattr(
            http_util, "set_socket_reuse_port"):
        log.warning("this Ray version starts its HTTP servers differently: the router's port is bound as Serve "
                    "binds it (a restart within a minute of a loaded run may not get the port)")
        return False

    async def start_asgi_http_server(app, http_options, *, event_loop, enable_so_reuseport: bool = False):
        # Serve's "reuse" sets SO_REUSEADDR and SO_REUSEPORT; in this process it sets the first only.
        return await original(app, http_options, event_loop=event_loop, enable_so_reuseport=True)

    setattr(start_asgi_http_server, _MARK, True)
    http_util.set_socket_reuse_port = _reuse_address
    replica.start_asgi_http_server = start_asgi_http_server
    return True
