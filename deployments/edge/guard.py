"""The front door, Ray-free: API keys, request size, and how many requests a router replica takes on.

Checked before a request body is read or parsed, so a caller without a key, with an oversized body,
over its own limits (``deployments.edge.key_limits``) or arriving when the replica is full costs almost nothing
and gets a clear 401, 411, 413, 429 or 503 (with ``Retry-After``) instead of queuing until everything is slow. Keys are stored as SHA-256 digests: a
configuration file never holds a usable key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deployments.edge.key_limits import KeyLimiter

if TYPE_CHECKING:
    from deployments.config import SecurityConfig

# The search console's page and assets (deployments.edge.console serves them): a browser must load them before it can
# know a key. The page asks for one when the API answers 401, and every API call it makes carries it.
CONSOLE_ASSETS = frozenset({"console.css", "console.js"})
CONSOLE_PATHS = frozenset({"/", "/console", "/console/"} | {f"/console/{name}" for name in CONSOLE_ASSETS})
OPEN_PATHS = frozenset({"/health", "/docs", "/openapi.json", "/redoc", "/docs/oauth2-redirect"}) | CONSOLE_PATHS
ADMIN_PREFIX = "/admin/"


def is_document_write(path: str) -> bool:
    """``PUT /collections/{c}/documents`` and ``POST /collections/{c}/documents/delete``: bodies of up to 1,000
    records, allowed ``security.max_write_bytes``."""
    parts = path.strip("/").split("/")
    return len(parts) in (3, 4) and parts[0] == "collections" and parts[2] == "documents" and parts[3:] in ([], ["delete"])


def route_path(path: str, root_path: str = "") -> str:
    """The path as the app's routes see it: under a route prefix (``root_path``, e.g. ``/api``) the request's
    path still starts with the prefix, and every rule of the front door is about the part after it."""
    if root_path and root_path != "/" and (path == root_path or path.startswith(root_path.rstrip("/") + "/")):
        return path[len(root_path.rstrip("/")):] or "/"
    return path


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> tuple[str, str]:
    """(key to hand to a caller, digest to put in the configuration)."""
    key = "rsk_" + secrets.token_urlsafe(24)
    return key, key_digest(key)


@dataclass(frozen=True)
class Caller:
    """Who sent a request, as the front door knows it from the key: ``key_id`` (the first 16 hex digits of
    the key's digest; None without keys), the key's ``principals`` (for document ACLs, and the tenant its
    judgments belong to), and ``admin`` (an admin key, or keys off: nothing to tell callers apart)."""

    key_id: str | None = None
    principals: tuple[str, ...] = ()
    admin: bool = True
    writer: bool = True  # may write documents (a write key or an admin key; keys off: everyone)


@dataclass
class Refusal:
    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Guard:
    key_digests: frozenset[str] = frozenset()
    max_body_bytes: int = 65_536
    max_inflight: int = 64
    retry_after_s: int = 1
    inflight: int = 0
    key_principals: dict[str, tuple[str, ...]] = field(default_factory=dict)  # digest -> who its holder is
    admin_digests: frozenset[str] = frozenset()  # keys allowed on /admin/ (also in key_digests)
    write_digests: frozenset[str] = frozenset()  # keys allowed to write documents (also in key_digests)
    max_write_bytes: int = 16 * 2**20  # bodies of document writes (a batch of up to 1,000 records)
    key_limits: KeyLimiter = field(default_factory=KeyLimiter)  # each caller's share (none: not limited apart)

    @classmethod
    def from_config(cls, security: SecurityConfig, environ: Mapping[str, str] | None = None) -> Guard:
        """The guard a router replica owns, from its ``security`` config (keys named by ``api_keys_env`` are read
        from ``environ``, the process's environment by default)."""
        environ = os.environ if environ is None else environ
        digests = set(security.api_key_digests)
        if security.api_keys_env:
            keys = [k.strip() for k in environ.get(security.api_keys_env, "").split(",") if k.strip()]
            if not keys and not digests:
                raise ValueError(f"security.api_keys_env names {security.api_keys_env!r}, which holds no keys here")
            digests |= {key_digest(k) for k in keys}
        admin, write = frozenset(security.admin_key_digests), frozenset(security.write_key_digests)
        return cls(key_digests=frozenset(digests | set(security.key_principals) | admin | write),
                   write_digests=write, max_write_bytes=security.max_write_bytes,
                   max_body_bytes=security.max_body_bytes, max_inflight=security.max_inflight,
                   retry_after_s=security.retry_after_s,
                   key_principals={d: tuple(p) for d, p in security.key_principals.items()}, admin_digests=admin,
                   key_limits=KeyLimiter.from_config(security))

    @property
    def keys_on(self) -> bool:
        return bool(self.key_digests)

    def presented_key(self, headers) -> str | None:
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return headers.get("x-api-key")

    def principals(self, headers) -> list[str]:
        """Who the caller is, for document ACLs: the principals of its key (none without one)."""
        return list(self.caller(headers).principals)

    def caller(self, headers) -> Caller:
        """The caller of a request the front door let in (with keys on, its key was checked)."""
        key = self.presented_key(headers)
        if not self.keys_on:
            return Caller(None, tuple(self.key_principals.get(key_digest(key), ())) if key else (), admin=True)
        if not key:
            return Caller(None, (), admin=False)
        digest = key_digest(key)
        admin = any(hmac.compare_digest(digest, d) for d in self.admin_digests)
        return Caller(digest[:16], tuple(self.key_principals.get(digest, ())), admin=admin,
                      writer=admin or any(hmac.compare_digest(digest, d) for d in self.write_digests))

    def check(self, method: str, path: str, headers) -> Refusal | None:
        """Why this request is refused before its body is read, or None."""
        if self.keys_on and path not in OPEN_PATHS:
            key = self.presented_key(headers)
            if not key:
                return Refusal(401, "an API key is required: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
                               {"WWW-Authenticate": "Bearer"})
            digest = key_digest(key)
            if not any(hmac.compare_digest(digest, d) for d in self.key_digests):
                return Refusal(401, "this API key is not valid", {"WWW-Authenticate": "Bearer"})
            if path.startswith(ADMIN_PREFIX) and not any(hmac.compare_digest(digest, d) for d in self.admin_digests):
                return Refusal(403, "this API key may not use /admin/: add its digest to security.admin_key_digests")
        if method in ("POST", "PUT", "PATCH"):
            length = headers.get("content-length")
            if length is None:
                return Refusal(411, "send the body with a Content-Length header (chunked bodies are not accepted)")
            if not length.isdigit():
                return Refusal(400, "Content-Length is not a number")
            limit = self.max_write_bytes if is_document_write(path) else self.max_body_bytes
            if int(length) > limit:
                return Refusal(413, f"the body is {int(length)} bytes; the limit is {limit}")
        return None

    def admit(self) -> Refusal | None:
        """Take one request on, or refuse it (503) when ``max_inflight`` are already in progress."""
        if self.inflight >= self.max_inflight:
            return Refusal(503, f"overloaded: {self.inflight} requests in progress on this replica; retry shortly",
                           {"Retry-After": str(self.retry_after_s)})
        self.inflight += 1
        return None

    def release(self) -> None:
        self.inflight = max(0, self.inflight - 1)


# The guard of this process's router replica, handed over whole by the router (``install``) when it starts, and read
# by the app's front door and by the shedding layer ahead of Serve. A handover, not state on the app object: Serve
# serves a frozen copy of the FastAPI app (``serve.ingress`` pickles it), which the router never sees.
_installed: Guard | None = None


def install(guard: Guard) -> None:
    global _installed
    _installed = guard


def installed() -> Guard | None:
    """The guard a router of this process handed over, or None (Serve's proxy; an app no router started)."""
    return _installed
