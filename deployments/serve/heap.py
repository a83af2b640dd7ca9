"""Python's cyclic garbage collector, set for a long-lived search replica.

A replica holds a large heap that lives as long as it does (an index version's rows, Ray, Serve, FastAPI and
pydantic's schemas) and makes thousands of short-lived containers per request (hits, fused runs, results), nearly
all freed by reference counting when the request ends. Python's default young threshold (a collection every 700
net container allocations) is crossed about twice by one request of ``limit: 100``, and every few hundred requests
a full collection walks the whole long-lived heap. Measured in-process over SciFact (`scifact-3`, 600 hybrid
queries at ``limit: 100``): 0.6 ms of collector time a query with the defaults, under 0.01 ms after
``settle_heap``. bench/README.md ("Serving cost") has the figures over HTTP.

What is given up: garbage in reference cycles waits for a larger young generation before it is found (a few
thousand small objects), and frozen objects are not collected until the next ``settle_heap`` (the next version
opened) unfreezes them: an evicted version's cyclic garbage waits at most that long.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # net new containers before a young collection; Python's default is 700


def settle_heap() -> None:
    """Collect once, freeze what survives (the collector does not walk it again) and raise the young threshold.

    Called when a replica starts and each time it opens an index version: what is loaded then lives until the
    version is evicted. What an earlier call froze is unfrozen and collected first."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
