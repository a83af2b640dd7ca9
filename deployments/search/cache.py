"""Identical requests answered from memory: a small LRU of responses, keyed by the request, the versions it
searched and the caller's ACL (``SearchPipeline.cache_key``), so a version switch or another caller never hits."""

from __future__ import annotations

from collections import OrderedDict

from deployments.edge.schemas import SearchResponse


class LRUCache:
    def __init__(self, size: int):
        self.size = size
        self.items: OrderedDict[str, SearchResponse] = OrderedDict()

    def get(self, key: str) -> SearchResponse | None:
        value = self.items.get(key)
        if value is not None:
            self.items.move_to_end(key)
        return value

    def put(self, key: str, value: SearchResponse) -> None:
        if self.size <= 0:
            return
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)
