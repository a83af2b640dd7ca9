"""Serve's application-level autoscaling policy that scales a collection's shard groups together: each group asks
for replicas on its own load as Serve's default policy does, and every group of a collection is given the most any of
them asks for, so the index grows and shrinks a whole copy at a time (every search fans out to every group, so a copy
short of one group serves no more searches). Every other deployment keeps its own decision. Serve applies each
deployment's bounds and delays to what this returns.

Named in the application's Serve config, beside ``args``:

    autoscaling_policy: {policy_function: deployments.serve.autoscale:groups_together}

Without it each group follows its own load alone (a hot group, a promoted tenant's, grows alone).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ray.serve.autoscaling_policy import replica_queue_length_autoscaling_policy

from deployments.serve.specs import slot_collection

POLICY = "deployments.serve.autoscale:groups_together"  # as the Serve config names it


def groups_together(contexts: dict[Any, Any]) -> tuple[dict[Any, float], dict[Any, dict]]:
    """``contexts``: Serve's AutoscalingContext of each autoscaled deployment of the application, by deployment id."""
    decisions, states = {}, {}
    for deployment, ctx in contexts.items():
        decisions[deployment], states[deployment] = replica_queue_length_autoscaling_policy(ctx)
    collections: dict[str, list[Any]] = defaultdict(list)
    for deployment, ctx in contexts.items():
        collection = slot_collection(ctx.deployment_name)
        if collection is not None:
            collections[collection].append(deployment)
    for groups in collections.values():
        most = max(decisions[g] for g in groups)
        for g in groups:
            decisions[g] = most
    return decisions, states
