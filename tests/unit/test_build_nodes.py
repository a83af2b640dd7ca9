"""Where a build places its shards on a cluster: dealt over the nodes in proportion to their CPUs."""

from index_build.build import _deal


def test_shards_are_dealt_over_the_nodes_by_their_cpus():
    assert _deal(3, {"a": 1, "b": 1, "c": 1}) == ["a", "b", "c"]
    dealt = _deal(10, {"big": 4, "small": 1, "head": 0})  # a head with no CPUs builds nothing
    assert dealt.count("big") == 8 and dealt.count("small") == 2 and "head" not in dealt
    assert _deal(2, {"head": 0}) == [None, None]  # no node with a CPU: Ray spreads them as it can
