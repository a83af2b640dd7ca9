"""Per-caller limits at the front door: requests per second, burst and requests in flight, per API key or tenant.

``security.max_inflight`` protects a router replica from everyone together; a caller that sends ten times its share
would still take all of it, and the well-behaved callers beside it would meet 503s. Each caller gets a budget
(``security.key_limit``, or one of ``security.key_limits`` by key digest or by principal), counted with the
``limits`` library's moving window of ``burst`` requests per ``burst / requests_per_s`` seconds: an idle caller
may send ``burst`` at once, then one more as each earlier one leaves the window. The moving window, not a fixed
one: a fixed window lets twice the burst through across a window's edge. Over its budget a caller gets a 429 with
``Retry-After`` and the ``RateLimit-*`` headers of the IETF draft (draft-ietf-httpapi-ratelimit-headers):
``RateLimit-Limit`` (requests a window allows), ``RateLimit-Remaining`` and ``RateLimit-Reset`` (seconds until
one more is allowed), with ``RateLimit-Policy`` (``<burst>;w=<window_s>``).

Counted per router replica, like ``max_inflight``, in the replica's memory: with N replicas behind Serve's
proxy a caller gets up to N times its budget. With keys off nothing tells callers apart (a client address behind
a proxy or NAT is many callers), so nobody is limited apart. Ray-free.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from limits import RateLimitItemPerSecond
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from deployments.config import is_key_digest
from deployments.errors import RateLimited

if TYPE_CHECKING:
    from deployments.config import KeyLimit, SecurityConfig


@dataclass(frozen=True)
class Budget:
    """What a request was counted against: a name (``key:<key id>`` or ``principal:<name>``) and its limit."""

    name: str
    limit: KeyLimit

    @property
    def window(self) -> RateLimitItemPerSecond:
        return RateLimitItemPerSecond(self.limit.burst, self.limit.window_s)


@dataclass
class KeyLimiter:
    """The budgets of one router replica. ``default``: every key's own (None: keys not limited apart);
    ``by_key_id``: a key's own instead (by key id, the first 16 hex digits of its digest, as ``Caller`` knows it);
    ``by_principal``: one shared by every key holding the principal."""

    default: KeyLimit | None = None
    by_key_id: dict[str, KeyLimit] = field(default_factory=dict)
    by_principal: dict[str, KeyLimit] = field(default_factory=dict)
    retry_after_s: int = 1  # Retry-After of a caller at its in-flight limit: a request ends soon, no window says when
    inflight: dict[str, int] = field(default_factory=dict)
    rate: MovingWindowRateLimiter = field(default_factory=lambda: MovingWindowRateLimiter(MemoryStorage()))

    @classmethod
    def from_config(cls, security: SecurityConfig) -> KeyLimiter:
        digests = {name: limit for name, limit in security.key_limits.items() if is_key_digest(name)}
        return cls(default=security.key_limit, by_key_id={d[:16]: limit for d, limit in digests.items()},
                   by_principal={p: limit for p, limit in security.key_limits.items() if p not in digests},
                   retry_after_s=security.retry_after_s)

    def budget(self, key_id: str | None, principals: Sequence[str]) -> Budget | None:
        """The budget a caller's request counts against: its key's own, else its first principal's that has one,
        else the default; None without a key (keys off) or with no limits configured."""
        if key_id is None:
            return None
        if key_id in self.by_key_id:
            return Budget(f"key:{key_id}", self.by_key_id[key_id])
        shared = next((p for p in principals if p in self.by_principal), None)
        if shared is not None:
            return Budget(f"principal:{shared}", self.by_principal[shared])
        return Budget(f"key:{key_id}", self.default) if self.default is not None else None

    def admit(self, key_id: str | None, principals: Sequence[str]) -> tuple[Budget | None, dict[str, str]]:
        """Count one request against its caller's budget: (the budget, to ``release`` when answered; the
        ``RateLimit-*`` headers of the answer). Raises ``RateLimited`` over the budget, counting nothing."""
        budget = self.budget(key_id, principals)
        if budget is None:
            return None, {}
        limit = budget.limit
        if self.inflight.get(budget.name, 0) >= limit.max_inflight:
            raise RateLimited(f"{limit.max_inflight} requests of this caller ({budget.name}) are in progress on this "
                              f"replica, its max_inflight; retry after {self.retry_after_s} s, once one has ended",
                              self.retry_after_s,
                              self.headers(budget))
        if not self.rate.hit(budget.window, budget.name):
            headers = self.headers(budget)
            raise RateLimited(f"this caller ({budget.name}) sent more than {limit.burst} requests in "
                              f"{limit.window_s} s ({limit.requests_per_s:g} per second, burst {limit.burst}); "
                              f"retry after {headers['RateLimit-Reset']} s",
                              max(1, int(headers["RateLimit-Reset"])), headers)
        self.inflight[budget.name] = self.inflight.get(budget.name, 0) + 1
        return budget, self.headers(budget)

    def release(self, budget: Budget | None) -> None:
        if budget is not None:
            left = self.inflight.get(budget.name, 0) - 1
            if left > 0:
                self.inflight[budget.name] = left
            else:
                self.inflight.pop(budget.name, None)

    def headers(self, budget: Budget) -> dict[str, str]:
        """Where the caller stands, as the IETF draft's ``RateLimit-*`` headers."""
        stats = self.rate.get_window_stats(budget.window, budget.name)
        reset_s = max(0, math.ceil(stats.reset_time - time.time()))
        return {"RateLimit-Limit": str(budget.limit.burst), "RateLimit-Remaining": str(max(0, stats.remaining)),
                "RateLimit-Reset": str(reset_s), "RateLimit-Policy": f"{budget.limit.burst};w={budget.limit.window_s}"}
