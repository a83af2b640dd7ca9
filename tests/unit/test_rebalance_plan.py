"""The layout's next move, hand-computed: a node that joins takes replicas until no move would even the spread; a
move never puts a second replica of a group on a node bound to one; nodes weighted by CPUs take shares to match."""

from __future__ import annotations

from deployments.rebalance.mover import Group, held
from deployments.rebalance.plan import Layout, Move

ONE = {"g0": 1, "g1": 1}


def test_a_node_that_joins_takes_a_replica_from_the_first_of_the_fullest_nodes():
    layout = Layout({"a": 1, "b": 1, "n": 1}, {"g0": ["a", "b"], "g1": ["a", "b"]}, ONE)
    assert layout.counts() == {"a": 2, "b": 2, "n": 0}
    assert layout.next_move() == Move("g0", "a", "n")  # excess a = b = 2 - 4/3; ties by name


def test_once_no_move_lowers_the_spread_there_is_none():
    # 2, 1, 1 over three nodes: moving one from a to n would give 1, 1, 2 (the same spread, only swapped)
    assert Layout({"a": 1, "b": 1, "n": 1}, {"g0": ["b", "n"], "g1": ["a", "b"]}, ONE).next_move() is None
    assert Layout({"a": 1, "b": 1}, {"g0": ["a", "b"], "g1": ["a"]}, ONE).next_move() is None


def test_a_group_already_on_the_target_node_is_not_moved_there_again():
    # a holds g0 and g1, n holds g0: only g1 may go to n (b is at its share)
    layout = Layout({"a": 1, "b": 1, "n": 1},
                    {"g0": ["a", "n"], "g1": ["a", "b"], "g2": ["a", "b"], "g3": ["a", "b"]}, ONE | {"g2": 1, "g3": 1})
    assert layout.counts() == {"a": 4, "b": 3, "n": 1}
    assert layout.next_move() == Move("g1", "a", "n")
    unbounded = Layout(layout.weights, layout.replicas, {})
    assert unbounded.next_move() == Move("g0", "a", "n")  # no bound: the first group by name


def test_nodes_weighted_by_cpus_hold_replicas_in_proportion():
    # 8 replicas over 4 + 2 + 2 CPUs: shares 4, 2, 2; a holds 2, b and c 3 each
    replicas = {"g0": ["a", "b"], "g1": ["a", "c"], "g2": ["b", "c"], "g3": ["b", "c"]}
    bounds = {g: 1 for g in replicas}
    layout = Layout({"a": 4, "b": 2, "c": 2}, replicas, bounds)
    assert layout.excess() == {"a": -2.0, "b": 1.0, "c": 1.0}
    assert layout.next_move() == Move("g2", "b", "a")  # g0 is on a already
    assert Layout({"a": 1, "b": 1, "c": 1}, replicas, bounds).next_move() is None  # equal weights: 2, 3, 3 is even enough


def test_replicas_on_nodes_outside_the_layout_are_not_counted():
    layout = Layout({"a": 1, "n": 1}, {"g0": ["a", "gone"], "g1": ["a", "gone"]}, ONE)
    assert layout.counts() == {"a": 2, "n": 0} and layout.next_move() == Move("g0", "a", "n")


def test_held_sets_a_fixed_count_or_closes_the_autoscaling_bounds_and_keeps_other_overrides():
    config = {"name": "raysearch", "deployments": [{"name": "router", "user_config": {"rrf_k": 60}},
                                                   {"name": "g0", "max_ongoing_requests": 16}]}
    fixed = Group("g0", "HEALTHY", 2, (), {"num_replicas": 2})
    out = held(config, fixed, 3)
    assert out["deployments"] == [{"name": "router", "user_config": {"rrf_k": 60}},
                                  {"name": "g0", "max_ongoing_requests": 16, "num_replicas": 3}]
    assert config["deployments"][1] == {"name": "g0", "max_ongoing_requests": 16}  # the config given is untouched
    scaled = Group("g1", "HEALTHY", 2, (), {"autoscaling_config": {"min_replicas": 2, "max_replicas": 4,
                                                                   "upscale_delay_s": 5}})
    out = held(config, scaled, 3)
    assert out["deployments"][-1] == {"name": "g1", "autoscaling_config": {
        "min_replicas": 3, "max_replicas": 3, "initial_replicas": 3, "upscale_delay_s": 5}}
