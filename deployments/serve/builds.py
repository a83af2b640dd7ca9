"""The one build runner of a cluster, as a detached Ray actor: builds and folds started through the API run as
jobs it supervises (``deployments.builds``), so a job outlives the router replica that asked for it, and two
replicas asking to build one root are told apart in one place."""

from __future__ import annotations

from typing import Any

import ray

from deployments.builds import BuildRunner
from deployments.errors import Conflict

ACTOR_NAME = "raysearch-builds"


@ray.remote(num_cpus=0, max_restarts=-1)
class BuildSupervisor:
    def __init__(self):
        self.runner = BuildRunner()

    def start(self, root: str, kind: str, options: dict[str, Any], by: str | None,
              collection: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """(the job's record, None), or (None, why it was refused: another build writes into the root)."""
        try:
            return self.runner.start(root, kind, options, by, collection), None
        except Conflict as e:
            return None, str(e)


def supervisor():
    """The cluster's build supervisor, started by the first caller."""
    return BuildSupervisor.options(name=ACTOR_NAME, lifetime="detached", get_if_exists=True).remote()


async def start_build(root: str, kind: str, options: dict[str, Any], by: str | None = None,
                      collection: str | None = None) -> dict[str, Any]:
    record, refused = await supervisor().start.remote(root, kind, options, by, collection)
    if refused:
        raise Conflict(refused)
    return record
