"""The one table from the service's error kinds to HTTP, and the one error body every refusal is answered with.

The cores raise kinds (``deployments.errors``); nothing below the edge names a status code. The change log lives in
the index format (``index_format.change_log``, read and written by the job too), which never imports the service: it
raises kinds of its own, answered by this table beside the service's (``ERROR_ROOTS``). A kind missing here is
answered as its nearest listed base class (``status_of`` walks the class's MRO), so a new kind never becomes a 500
by accident.
"""

from __future__ import annotations

from typing import Any

from deployments.errors import (
    Conflict,
    DeadlineExceeded,
    Forbidden,
    InvalidField,
    InvalidRequest,
    NotFound,
    RateLimited,
    ServiceError,
    StorageFull,
    Unavailable,
    UnknownCollection,
)
from index_format.change_log import ChangeLogError, LogCorrupt, LogFull, WriteNotStored
from index_format.store import Conflict as StoreConflict
from index_format.store import StoreError

ERROR_ROOTS = (ServiceError, ChangeLogError, StoreError)  # every kind the table answers derives from one of these

HTTP_STATUS: dict[type[Exception], int] = {
    ServiceError: 400,
    InvalidRequest: 400,
    InvalidField: 422,
    Forbidden: 403,
    NotFound: 404,
    UnknownCollection: 404,
    Conflict: 409,
    RateLimited: 429,
    Unavailable: 503,
    StorageFull: 507,
    DeadlineExceeded: 504,
    # The change log's, answered as the service's own for the same cases (Unavailable, StorageFull); a damaged
    # log is the server's fault.
    ChangeLogError: 500,
    WriteNotStored: 503,
    LogFull: 507,
    LogCorrupt: 500,
    # The index store's (object storage): away is the service's Unavailable; a lost compare-and-swap, a Conflict.
    StoreError: 503,
    StoreConflict: 409,
}

RETRY_AFTER_S = 2  # what a 503 of a stage that is away asks the client to wait


def status_of(error: Exception) -> int:
    """The HTTP status an error kind is answered with."""
    return next(HTTP_STATUS[k] for k in type(error).__mro__ if k in HTTP_STATUS)


def retry_headers(status: int) -> dict[str, str] | None:
    return {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None


def error_headers(error: Exception) -> dict[str, str] | None:
    """The headers an error kind is answered with: when to retry, and for a caller over its limit, where it
    stands (``RateLimit-*``)."""
    if isinstance(error, RateLimited):
        return {"Retry-After": str(error.retry_after_s)} | error.headers
    return retry_headers(status_of(error))


def error_body(message: str, request_id: str | None, detail: Any = None) -> dict[str, Any]:
    """``ErrorResponse``: every error the app answers, with the id to find the request in the logs."""
    return {"error": message, "detail": detail, "request_id": request_id}
