"""A replica's collector settings (``deployments.serve.heap``): garbage is collected before the heap is
frozen, what survives is frozen, and the young threshold is raised."""

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
    kept = Node()
    settle_heap()
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD > 700
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())  # frozen: out of the lists the collector walks


def test_garbage_is_collected_before_the_heap_is_frozen(restored_collector):
    node = Node()
    gone = weakref.ref(node)
    del node  # garbage now, but only a collection finds it
    settle_heap()
    assert gone() is None  # frozen with the rest, it would never have been freed
