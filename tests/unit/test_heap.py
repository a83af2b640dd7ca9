"""A replica's collector settings (``deployments.serve.heap``): what is loaded is frozen, the young
threshold raised, and what an earlier settle froze is collected by the next once it became garbage."""

from __future__ import annotations

import gc
import weakref

import pytest

from deployments.serve.heap import YOUNG_THRESHOLD, settle_heap


@pytest.fixture
def restored_collector():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_settling_freezes_the_heap_and_raises_the_young_threshold(restored_collector):
    settle_heap()
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD > 700
    assert gc.get_freeze_count() > 0


def test_cyclic_garbage_frozen_by_one_settle_is_collected_by_the_next(restored_collector):
    node = Node()
    alive = weakref.ref(node)
    settle_heap()  # `node` is live here: frozen with the rest
    del node
    gc.collect()
    assert alive() is not None  # frozen: a collection does not see it
    settle_heap()  # as when the next version is opened
    assert alive() is None
