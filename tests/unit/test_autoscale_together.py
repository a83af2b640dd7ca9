"""The policy that scales a collection's shard groups together, on Serve's own contexts: each group's own decision
is Serve's default one (requests at it over its target), and every group of a collection gets the most of theirs;
the router and another collection's groups keep their own."""

from __future__ import annotations

from ray.serve._private.common import DeploymentID
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from deployments.serve.autoscale import groups_together
from deployments.serve.specs import slot_collection, slot_name


def context(name: str, replicas: int, requests: float) -> tuple[DeploymentID, AutoscalingContext]:
    deployment = DeploymentID(name=name, app_name="raysearch")
    return deployment, AutoscalingContext(
        deployment_id=deployment, deployment_name=name, app_name="raysearch", current_num_replicas=replicas,
        target_num_replicas=replicas, running_replicas=[], total_num_requests=requests, total_queued_requests=0,
        aggregated_metrics={}, raw_metrics={}, capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=8,
        policy_state={}, last_scale_up_time=None, last_scale_down_time=None, current_time=None,
        config=AutoscalingConfig(min_replicas=1, max_replicas=8, target_ongoing_requests=2))


def test_every_group_of_a_collection_gets_the_most_any_asks_for_and_others_their_own():
    contexts = dict([context("docs-group-000", 2, 12.0),   # 12 / 2 a replica = 6 replicas' worth
                     context("docs-group-001", 2, 2.0),    # 1
                     context("docs-shard-002", 2, 4.0),    # 2
                     context("faq-shard-000", 1, 1.0),     # 0.5
                     context("router", 2, 16.0)])          # 8
    decisions, _ = groups_together(contexts)
    by_name = {d.name: n for d, n in decisions.items()}
    assert by_name == {"docs-group-000": 6.0, "docs-group-001": 6.0, "docs-shard-002": 6.0,
                       "faq-shard-000": 0.5, "router": 8.0}


def test_a_shard_deployment_s_collection_is_read_back_from_its_name():
    assert slot_collection(slot_name("my-docs", ["shard-000", "shard-001"], 3)) == "my-docs"
    assert slot_collection(slot_name("docs", ["shard-012"], 12)) == "docs"
    assert slot_collection("router") is None and slot_collection("encoder-0") is None
    assert slot_collection("rebalancer") is None and slot_collection("docs-group-x") is None
