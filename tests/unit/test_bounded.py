"""The service's one bounded cache: least recently used dropped first, the hook told of each entry dropped."""

from __future__ import annotations

import threading

import pytest

from deployments.bounded import BoundedCache


def test_the_least_recently_used_is_dropped_and_the_hook_told():
    dropped = []
    cache = BoundedCache(2, on_evict=lambda k, v: dropped.append((k, v)))
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" used now: "b" is the least recently used
    cache.put("c", 3)
    assert dropped == [("b", 2)] and list(cache) == ["a", "c"] and "b" not in cache
    cache.put("a", 10)  # replaced, not dropped
    assert dropped == [("b", 2)] and cache.get("a") == 10 and len(cache) == 2
    assert cache.pop("c") == 3 and dropped == [("b", 2)]  # removed by the caller: not the hook's business
    assert cache.get("missing", "default") == "default"


def test_a_cache_of_size_zero_keeps_nothing_and_releases_what_it_is_given():
    dropped = []
    cache = BoundedCache(0, on_evict=lambda k, v: dropped.append(k))
    cache.put("a", 1)
    assert len(cache) == 0 and cache.get("a") is None and dropped == ["a"]
    with pytest.raises(ValueError, match=">= 0"):
        BoundedCache(-1)


def test_threads_at_once_never_hold_more_than_the_bound():
    dropped = []
    cache = BoundedCache(50, on_evict=lambda k, v: dropped.append(k))

    def writer(base: int):
        for i in range(2000):
            cache.put(base + i, i)
            cache.get(base + i // 2)

    threads = [threading.Thread(target=writer, args=(n * 10_000,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 50 and len(dropped) == 4 * 2000 - 50 and len(set(dropped)) == len(dropped)
