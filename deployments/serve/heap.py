"""Python's cyclic garbage collector, set for a long-lived search replica.

A replica holds a large heap that lives as long as it does (Ray, Serve, FastAPI, pydantic's schemas, then an index
version's rows) and makes thousands of short-lived containers per request (hits, fused runs, results), nearly all
freed by reference counting when the request ends. With Python's default young threshold (a collection every 700
net new containers) one request of ``limit: 100`` set off about two young collections, and every few hundred
requests a full one walked the whole long-lived heap. Measured in-process over SciFact (`scifact-3`, 600 hybrid
queries at ``limit: 100``): 0.6 ms of collector time a query with the defaults; with the young threshold raised,
no collection at all ran in 600 queries. bench/README.md ("Serving cost") has the figures.

Settled once, when the replica starts, and not when it opens an index version: a full collection then would stall
the event loop that is serving the version before it. What is given up: garbage in reference cycles waits for a
larger young generation before it is found (a few thousand small objects).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # net new containers before a young collection; Python's default is 700


def settle_heap() -> None:
    """Collect once, freeze what survives (the collector does not walk it again) and raise the young threshold.

    Called at the end of a replica's ``__init__``: what it loaded to start lives as long as it does."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
