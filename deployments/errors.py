"""The service's one error type: what cannot be served as asked, and the HTTP status it is answered with.

Cores raise a ``ServiceError`` (or one of its named kinds); the router maps every one of them to HTTP in
one handler, as ``{"error": message}`` with the error's status (and ``Retry-After`` on a 503). A message
states the value, the rule and the fix.
"""

from __future__ import annotations


class ServiceError(Exception):
    status = 400

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status


class RequestError(ServiceError):
    """A request that is well-formed JSON but cannot be served as asked (a 4xx, or 503 when a stage it
    needs is away)."""


class ActivationError(ServiceError):
    """An index version this app cannot switch to (404 unknown, 409 needs a redeploy, 503 shards failed)."""

    status = 409
