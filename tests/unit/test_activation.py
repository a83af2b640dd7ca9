"""The router's version switch, Ray-free: warm every shard, then one swap; refusals keep the old version."""

from __future__ import annotations

import asyncio

import pytest

from deployments.edge.errors import status_of
from deployments.errors import ServiceError
from deployments.search.activation import DeployedCollection, VersionSwitch
from deployments.search.clients import Collection
from index_format.prompts import EncoderSpec
from index_format.versions import activate, active_version, versions_dir
from tests.conftest import fake_version
from tests.waiting import until


def _publish(root, name, shards=2, encoder="hashing:64", dimension=64):
    fake_version(versions_dir(root) / name, name, shards, encoder, dimension)


# Closed, a slot's ``info`` waits until a test opens it again (a flag polled by yielding to the loop, not a
# timer: the order is the test's own on any machine).
GATE: dict[str, asyncio.Event | None] = {"closed": None}  # a test's closed gate: slots wait until it is set


class Slot:
    """A shard slot's stand-in: answers ``info`` for a version once the gate is open, or fails for one named
    version."""

    def __init__(self, name, version, log, broken=frozenset()):
        self.name, self.version, self.log, self.broken = name, version, log, broken

    async def info(self):
        self.log.append((self.name, self.version))
        if GATE["closed"] is not None:
            await GATE["closed"].wait()
        if self.version in self.broken:
            raise OSError("checksum mismatch")
        return {"fields": {f"field-of-{self.version}": "keyword"}}


@pytest.fixture
def setup(tmp_path):
    for name, shards in (("v1", 2), ("v2", 2), ("v3", 3), ("v4", 1)):
        _publish(tmp_path, name, shards)
    _publish(tmp_path, "other-encoder", encoder="some/other-model", dimension=384)
    activate(tmp_path, "v1")
    log: list = []
    broken: set = set()
    slots = [("shard-000", None, ["shard-000"]), ("shard-001", None, ["shard-001"])]
    deployed = {"docs": DeployedCollection("docs", tmp_path, EncoderSpec("hashing:64"), 64, slots, encoder=None)}

    def make_shard(name, _handle, version, _shards):
        return Slot(name, version, log, broken)

    collections = {"docs": Collection("docs", "v1", [make_shard(n, h, "v1", s) for n, h, s in slots], None)}
    return VersionSwitch(collections, deployed, make_shard, warm_timeout_s=5, retry_s=0.0), collections, log, broken


def test_every_shard_loads_the_version_before_the_one_swap(setup, tmp_path):
    switch, collections, log, _ = setup
    before = collections["docs"]

    async def run():
        GATE["closed"] = asyncio.Event()
        try:
            task = asyncio.create_task(switch.activate("docs", "v2"))
            await until(lambda: len(log) >= 2, 5, "both shards asked to load v2")  # neither done
            assert collections["docs"] is before  # still warming: requests keep the old version
        finally:
            GATE["closed"].set()
        try:
            return await task
        finally:
            GATE["closed"] = None

    result = asyncio.run(run())
    assert result["previous"] == "v1" and result["version"] == "v2"
    assert sorted(log) == [("shard-000", "v2"), ("shard-001", "v2")]
    now = collections["docs"]
    assert now.version == "v2" and {s.version for s in now.shards} == {"v2"}
    assert now.fields == {"field-of-v2": "keyword"}
    assert before.version == "v1" and {s.version for s in before.shards} == {"v1"}  # in-flight requests' view
    assert active_version(tmp_path) == "v2"
    assert asyncio.run(switch.rollback("docs"))["version"] == "v1" and active_version(tmp_path) == "v1"


def test_what_needs_a_redeploy_is_refused_with_the_reason(setup, tmp_path):
    switch, collections, _, _ = setup
    with pytest.raises(ServiceError, match="3 shards; this app was deployed with 2 shards in 2 shard slots") as e:
        asyncio.run(switch.activate("docs", "v3"))
    assert status_of(e.value) == 409
    with pytest.raises(ServiceError, match="some/other-model"):
        asyncio.run(switch.activate("docs", "other-encoder"))
    with pytest.raises(ServiceError, match="no index version 'v9'") as e:
        asyncio.run(switch.activate("docs", "v9"))
    assert status_of(e.value) == 404
    assert collections["docs"].version == "v1" and active_version(tmp_path) == "v1"
    assert asyncio.run(switch.activate("docs", "v4"))["version"] == "v4"
    assert [s.name for s in collections["docs"].shards] == ["shard-000"]  # fewer shards: the first slots


def test_a_version_the_shards_cannot_load_leaves_the_old_one_serving(setup, tmp_path):
    switch, collections, _, broken = setup
    broken.add("v2")
    with pytest.raises(ServiceError, match="checksum mismatch") as e:
        asyncio.run(switch.activate("docs", "v2"))
    assert status_of(e.value) == 503
    assert collections["docs"].version == "v1" and active_version(tmp_path) == "v1"  # ACTIVE not moved


def test_follow_switches_when_active_moves_elsewhere_and_reports_what_it_cannot_serve(setup, tmp_path):
    switch, collections, _, broken = setup
    asyncio.run(switch.follow())
    assert collections["docs"].version == "v1"
    activate(tmp_path, "v2")  # e.g. index_build finishing, or the versions CLI
    asyncio.run(switch.follow())
    assert collections["docs"].version == "v2"
    activate(tmp_path, "v3")
    asyncio.run(switch.follow())
    assert collections["docs"].version == "v2"
    state = switch.describe()["docs"]
    assert state["serving"] == "v2" and state["active"] == "v3" and "3 shards" in state["error"]
    assert state["previous"] == "v2"


def test_a_pinned_collection_never_moves(tmp_path):
    _publish(tmp_path, "v1")
    deployed = {"docs": DeployedCollection("docs", None, EncoderSpec("hashing:64"), 64, [("shard-000", None)], encoder=None)}
    collections = {"docs": Collection("docs", "v1", [], None)}
    switch = VersionSwitch(collections, deployed, lambda *a: None)
    with pytest.raises(ServiceError, match="pinned"):
        asyncio.run(switch.activate("docs", "v1"))
    asyncio.run(switch.follow())
    assert switch.describe() == {"docs": {"serving": "v1", "follows_active": False}}


def test_a_shard_group_serves_the_shards_a_version_has(tmp_path):
    from deployments.search.activation import check_switchable
    from index_format.versions import read_version_manifest

    for name, shards in (("v2", 2), ("v3", 3), ("v4", 1)):
        _publish(tmp_path, name, shards)
    group = [("docs-group-000", "handle", ["shard-000", "shard-001"])]
    deployed = DeployedCollection("docs", tmp_path, EncoderSpec("hashing:64"), 64, group, encoder=None)
    manifest = read_version_manifest(versions_dir(tmp_path) / "v4")
    assert check_switchable(deployed, manifest) == [("docs-group-000", "handle", ["shard-000"])]
    assert check_switchable(deployed, read_version_manifest(versions_dir(tmp_path) / "v2")) == group
    with pytest.raises(ServiceError, match="3 shards; this app was deployed with 2 shards in 1 shard slots"):
        check_switchable(deployed, read_version_manifest(versions_dir(tmp_path) / "v3"))
    pairs = [("a", 1, ["shard-000"]), ("b", 2, ["shard-001", "shard-002"])]
    deployed = DeployedCollection("docs", tmp_path, EncoderSpec("hashing:64"), 64, pairs, encoder=None)
    assert check_switchable(deployed, read_version_manifest(versions_dir(tmp_path) / "v2")) == [
        ("a", 1, ["shard-000"]), ("b", 2, ["shard-001"])]
