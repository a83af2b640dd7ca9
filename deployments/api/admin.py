"""The admin API's builds, without Ray: which index root a collection builds into, a build request's options
checked before a job starts (what ``python -m index_build`` or ``index_build.fold`` would refuse later, refused now
with a 422 naming the option), and the jobs' records. Versions (list, activate, roll back) are the version switch's
(``deployments.search.activation``).

Starting a job is handed in (``start_job``): the cluster's build supervisor (``deployments.serve.builds``) in the
service, a stand-in in tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployments.builds import list_records, read_record
from deployments.edge.schemas import BuildJob, BuildJobs, BuildRequest
from deployments.errors import Conflict, InvalidField
from deployments.search.clients import collection

if TYPE_CHECKING:
    from deployments.search.activation import DeployedCollection

# (root, kind, options, by, collection) -> the job's record; refuses (Conflict) a second job writing into a root.
StartJob = Callable[[str, str, dict[str, Any], str | None, str | None], Awaitable[dict[str, Any]]]
PATH_OPTIONS = ("corpus", "changes", "deletes")  # read on the service's machines
FOLD_OPTIONS = {"base", "version", "activate"}


def build_options(body: BuildRequest, exists: Callable[[Path], bool] = Path.exists) -> dict[str, Any]:
    """The command's options of a build request (its flags of the same names), or ``InvalidField`` naming the one at
    fault: a path option must exist (a glob's folder, for a glob); a build needs a corpus, or changes or deletes (a
    delta); a fold takes only base, version and activate, and its ``activate: false`` is the flag
    ``no_activate``."""
    options = body.model_dump(exclude={"kind", "collection"}, exclude_none=True)
    for name in PATH_OPTIONS:
        if name in options:
            path = Path(options[name])
            if not exists(path.parent if any(c in options[name] for c in "*?[") else path):
                raise InvalidField(f"{name}: {options[name]!r} does not exist on the service's machines")
    if body.kind == "build" and not (set(PATH_OPTIONS) & set(options)):
        raise InvalidField("corpus: a build needs a corpus, or changes or deletes for a delta")
    if body.kind == "fold" and set(options) - FOLD_OPTIONS:
        raise InvalidField(f"a fold takes only base, version and activate; got {', '.join(sorted(options))}")
    if body.kind == "fold" and "activate" in options:
        options["no_activate"] = not options.pop("activate") or None
    return options


class Builds:
    """Builds and folds of the collections' index roots, as jobs beside the service."""

    def __init__(self, deployed: Mapping[str, DeployedCollection], default_collection: str, start_job: StartJob,
                 created_roots: Callable[[], Iterable[str]] = tuple):
        """``created_roots``: the index roots of the collections created through the API (a listing of the store, so
        called off the event loop), whose builds are read too, served yet or not (a first build is followed before
        its collection is served)."""
        self.deployed, self.default_collection, self.start_job = deployed, default_collection, start_job
        self.created_roots = created_roots

    def root_of(self, name: str) -> str:
        """The index root a collection builds into (``Conflict`` for one serving a pinned version: it has none)."""
        root = collection(self.deployed, name).root
        if root is None:
            raise Conflict(f"collection {name!r} serves a pinned index version (a version folder, or 'version' "
                           "set): it has no index root to build into")
        return root

    def roots(self) -> list[str]:
        """Every root whose builds are listed: the served collections', and those created through the API."""
        return sorted({d.root for d in self.deployed.values() if d.root is not None} | set(self.created_roots()))

    async def start(self, body: BuildRequest, by: str | None) -> BuildJob:
        name = body.collection or self.default_collection
        root = self.root_of(name)
        return BuildJob(**await self.start_job(str(root), body.kind, build_options(body), by, name))

    async def fold(self, name: str) -> dict[str, Any]:
        """A fold of the collection's change log into its active version (started by the replicas, not a caller)."""
        return await self.start_job(str(self.root_of(name)), "fold", {}, "auto", name)

    async def jobs(self) -> BuildJobs:
        """The latest jobs of every collection's index root, newest first."""
        return BuildJobs(builds=[BuildJob(**r) for r in await asyncio.to_thread(lambda: list_records(self.roots()))])

    async def job(self, build_id: str) -> BuildJob:
        return BuildJob(**await asyncio.to_thread(lambda: read_record(self.roots(), build_id)))
