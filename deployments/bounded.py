"""The one bounded cache of the service: least recently used entries dropped first, with a hook on each one dropped.

Responses, spelling vocabularies, chunk rows, rendered result fragments, tokenized passages and opened index
versions are all kept this way; an entry that holds a resource (an opened version) is released by ``on_evict``.
Safe to call from several threads (a shard's rows are read on its search and its dense threads): each call holds a
lock for a few dictionary operations, and the hook runs outside it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """At most ``size`` entries (0: keeps nothing); ``on_evict(key, value)`` is called for each entry dropped to
    make room, never for one replaced by ``put`` or removed by ``pop``."""

    def __init__(self, size: int, on_evict: Callable[[K, V], None] | None = None):
        if size < 0:
            raise ValueError(f"a cache's size must be >= 0, got {size}")
        self.size, self.on_evict = size, on_evict
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K, default: V | None = None) -> V | None:
        """The entry, marked as used now; ``default`` when absent."""
        with self._lock:
            value = self._items.get(key, _MISSING)
            if value is _MISSING:
                return default
            self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` as the most recently used entry, dropping the least recently used beyond ``size``."""
        if self.size == 0:
            if self.on_evict is not None:
                self.on_evict(key, value)
            return
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            evicted = [self._items.popitem(last=False) for _ in range(len(self._items) - self.size)]
        if self.on_evict is not None:
            for k, v in evicted:
                self.on_evict(k, v)

    def pop(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            return self._items.pop(key, default)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[K]:
        with self._lock:
            return iter(list(self._items))

    def items(self) -> list[tuple[K, V]]:
        with self._lock:
            return list(self._items.items())


_MISSING = object()
