"""What cannot be served as asked, by kind: the cores raise these, and only the edge knows HTTP.

Each kind names what went wrong, not a status code; ``deployments.edge.errors.HTTP_STATUS`` is the one table
that answers each kind with a status (``{"error": message}``, ``Retry-After`` on ``Unavailable``). A message
states the value, the rule and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable


class ServiceError(Exception):
    """Anything the service refuses or cannot do for a request (the base of every kind below)."""


class InvalidRequest(ServiceError):
    """Well-formed, but not servable as asked: a stage it names is not deployed, a cursor from elsewhere, a page
    past the ranked window."""


class InvalidField(InvalidRequest):
    """A field's value breaks a rule the schema cannot state: an unknown filter field, a control character in an id."""


class Forbidden(ServiceError):
    """The caller's key may not do this (another tenant's judgment)."""


class NotFound(ServiceError):
    """A collection, version or document that does not exist (or that the caller may not see)."""


class UnknownCollection(NotFound):
    """A collection name this app does not serve; the message lists the ones it does."""

    def __init__(self, name: str, known: Iterable[str]):
        self.name, self.known = name, sorted(known)
        super().__init__(f"unknown collection {name!r}; known collections: {', '.join(self.known)}")

    def __reduce__(self):  # pickled (across processes) from what it was made with, not from its message
        return UnknownCollection, (self.name, self.known)


class Conflict(ServiceError):
    """Valid once, not any more: a cursor after the index or the ranking changed, a version that needs a redeploy."""


class Unavailable(ServiceError):
    """A stage or shard the request needs is away; the same request can succeed shortly."""


class RateLimited(ServiceError):
    """One caller asked for more than its share (``security.key_limit``); the same request can succeed after
    ``retry_after_s``. ``headers``: where the caller stands (``RateLimit-*``), sent with the refusal."""

    def __init__(self, message: str, retry_after_s: int, headers: dict[str, str]):
        super().__init__(message)
        self.retry_after_s, self.headers = retry_after_s, headers

    def __reduce__(self):
        return RateLimited, (str(self), self.retry_after_s, self.headers)


class DeadlineExceeded(ServiceError):
    """The request took longer than its deadline and its work was stopped."""


class StorageFull(Unavailable):
    """A write found no room on disk: retrying will not help until an operator frees space."""


class ActivationError(Conflict):
    """An index version this app cannot switch to as deployed (a redeploy is needed)."""
