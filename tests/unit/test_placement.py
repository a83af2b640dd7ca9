"""Partitioned placement: each shard group on its own nodes, with the memory its files need, checked without Ray.

The fake version here has shard files of hand-picked sizes, so every memory figure is arithmetic a reviewer can
redo: shard-000 holds 1,000 + 500 bytes, shard-001 300, shard-002 200 (their manifests are not counted).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from ray.serve.deployment import deployment_to_schema

from deployments.config import AppConfig, ShardsConfig
from deployments.placement import GroupNeed, group_options, replica_memory, unplaceable
from index_format.versions import activate, shard_bytes, versions_dir
from tests.conftest import fake_version

GIB = 2**30
SIZES = {"shard-000": {"dense.faiss": 1000, "lucene/_0.cfs": 500}, "shard-001": {"dense.faiss": 300},
         "shard-002": {"dense.faiss": 200}}


@pytest.fixture
def root(tmp_path) -> Path:
    """An index root whose active version v1 has three shards of the sizes above."""
    folder = fake_version(versions_dir(tmp_path / "idx") / "v1", "v1", shards=3)
    for shard, files in SIZES.items():
        for rel, size in files.items():
            path = folder / "shards" / shard / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * size)
    activate(tmp_path / "idx", "v1", verify=False)
    return tmp_path / "idx"


# ---------------------------------------------------------------- the config


@pytest.mark.parametrize(
    "shards, message",
    [
        ({"groups": {-1: {"resources": {"a": 1}}}}, "greater than or equal to 0"),
        ({"groups": {0: {"num_replicas": 0}}}, "greater than or equal to 1"),
        ({"groups": {0: {"cpus": 1}}}, "Extra inputs are not permitted"),
        ({"max_replicas_per_node": 0}, "greater than or equal to 1"),
        ({"max_replicas_per_node": 101}, "less than or equal to 100"),
        ({"memory_per_replica": "lots"}, "could not parse value and unit from byte string"),
        ({"memory_factor": 0}, "greater than 0"),
        ({"placement": "router", "groups": {0: {"resources": {"a": 1}}}}, "so groups would be ignored"),
        ({"placement": "router", "memory_per_replica": "auto"}, "so memory_per_replica would be ignored"),
    ],
)
def test_bad_shard_placements_fail_before_anything_starts(shards, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        AppConfig(index="a", shards=shards)


def test_sizes_read_as_yaml_writes_them_and_auto_is_kept():
    assert ShardsConfig(memory_per_replica="12GiB").memory_per_replica == 12 * GIB
    assert ShardsConfig(memory_per_replica=1000).memory_per_replica == 1000
    assert ShardsConfig(memory_per_replica="auto").memory_per_replica == "auto"
    assert ShardsConfig().memory_per_replica is None and ShardsConfig().memory_base == GIB


def test_placing_a_group_makes_auto_a_deployment():
    for placed in ({"label_selector": {"zone": "a"}}, {"groups": {0: {"num_replicas": 2}}},
                   {"max_replicas_per_node": 1}, {"memory_per_replica": "auto"}):
        assert not ShardsConfig(**placed).in_router, placed
    assert AppConfig(index="a", encoder={"resources": {"gpu_node": 1}}).encoder.in_router is False
    assert AppConfig(index="a", encoder={"max_replicas_per_node": 1}).encoder.in_router is False
    with pytest.raises(ValidationError, match="so resources and max_replicas_per_node would be ignored"):
        AppConfig(index="a", encoder={"placement": "router", "resources": {"gpu_node": 1}})


def test_a_group_takes_its_own_entry_over_the_block():
    s = ShardsConfig(resources={"search_node": 1}, label_selector={"zone": "a"}, num_replicas=2,
                     groups={1: {"resources": {"node_c": 1}, "num_replicas": 3}, 2: {"label_selector": {}}})
    assert s.group(0).model_dump() == {"resources": {"search_node": 1}, "label_selector": {"zone": "a"},
                                       "num_replicas": 2, "autoscaling": None}
    assert s.group(1).model_dump() == {"resources": {"node_c": 1}, "label_selector": {"zone": "a"}, "num_replicas": 3,
                                       "autoscaling": None}
    assert s.group(2).label_selector == {}  # an empty selector given: any node, not the block's


def test_a_collection_overrides_fields_of_the_top_level_block():
    cfg = AppConfig(collections={"docs": {"index": "a", "shards": {"group_size": 0, "groups": {0: {"num_replicas": 3}}}},
                                 "code": {"index": "b"}},
                    default_collection="docs", shards={"group_size": 2, "num_cpus": 0.5, "max_replicas_per_node": 1})
    docs, code = cfg.shards_of("docs"), cfg.shards_of("code")
    assert (docs.group_size, docs.num_cpus, docs.max_replicas_per_node, docs.group(0).num_replicas) == (0, 0.5, 1, 3)
    assert (code.group_size, code.groups) == (2, {})
    # How python -m deployments hands Serve the config (defaults dropped): a value set back to the default survives.
    again = AppConfig.model_validate(cfg.model_dump(mode="json", exclude_defaults=True))
    assert again.shards_of("docs") == docs and again.shards_of("code") == code


def test_a_collections_override_is_validated_with_the_block_it_overrides():
    with pytest.raises(ValidationError, match=r"collections\.docs\.shards: placement: router .* so resources would "
                                              "be ignored"):
        AppConfig(collections={"docs": {"index": "a", "shards": {"placement": "router"}}}, default_collection="docs",
                  shards={"resources": {"search_node": 1}})
    with pytest.raises(ValidationError, match="cache_dir"):  # a node's cache is every collection's
        AppConfig(collections={"docs": {"index": "a", "shards": {"cache_dir": "/x"}}}, default_collection="docs")


# ---------------------------------------------------------------- sizes and memory


def test_shard_bytes_are_the_files_of_each_shard_without_its_manifest(root):
    expected = {"shard-000": 1500, "shard-001": 300, "shard-002": 200}
    assert shard_bytes(root) == expected
    assert shard_bytes(root, "v1") == expected
    assert shard_bytes(versions_dir(root) / "v1") == expected  # a version folder named as the index


def test_shard_bytes_of_a_root_in_object_storage_come_from_its_file_table(root, s3_root, tmp_path):
    from index_format.object_root import ObjectRoot

    store = ObjectRoot(s3_root, cache_dir=tmp_path / "cache")
    store.upload_version(versions_dir(root) / "v1", "v1")
    store.activate("v1")
    assert shard_bytes(s3_root) == shard_bytes(root)
    assert not (tmp_path / "cache").exists()  # read from files.json: nothing downloaded


def test_auto_memory_is_base_plus_factor_times_versions_times_the_groups_files():
    s = ShardsConfig(memory_per_replica="auto", memory_factor=1.5, memory_base="1GiB", max_versions=2)
    assert replica_memory(s, 1800) == GIB + 1.5 * 2 * 1800
    assert replica_memory(s.model_copy(update={"memory_per_replica": 5000}), 1800) == 5000
    assert replica_memory(ShardsConfig(), 1800) is None


# ---------------------------------------------------------------- what the deployments get


def shard_deployments(cfg: AppConfig) -> dict[str, dict]:
    """Each shard deployment of the app ``build_app`` makes, as Serve's own schema reads its options (no Ray)."""
    from deployments.serve.app import build_app

    router = build_app(cfg)._bound_deployment
    collections = router.init_args[0]
    return {slot.name: deployment_to_schema(slot.target._bound_deployment).model_dump(exclude_unset=True)
            for spec in collections.values() for slot in spec.slots}


def test_each_group_needs_its_own_nodes(root):
    """The multi-node harness's case: group 0's replicas need node_b, group 1's node_c."""
    cfg = AppConfig(index=root, shards={"group_size": 1, "max_replicas_per_node": 1,
                                        "groups": {0: {"resources": {"node_b": 1}}, 1: {"resources": {"node_c": 1}}}})
    deployments = shard_deployments(cfg)
    assert sorted(deployments) == ["default-shard-000", "default-shard-001", "default-shard-002"]
    actor = {name: d["ray_actor_options"] for name, d in deployments.items()}
    assert actor["default-shard-000"]["resources"] == {"node_b": 1}
    assert actor["default-shard-001"]["resources"] == {"node_c": 1}
    assert actor["default-shard-002"]["resources"] == {}  # no entry: the block's (none)
    assert all(d["max_replicas_per_node"] == 1 and d["num_replicas"] == 1 for d in deployments.values())
    assert all("memory" not in a for a in actor.values())


def test_groups_reserve_memory_from_their_files_and_take_labels(root):
    cfg = AppConfig(index=root, shards={"group_size": 2, "memory_per_replica": "auto", "memory_base": 1000,
                                        "memory_factor": 2.0, "max_versions": 2, "label_selector": {"pool": "search"},
                                        "groups": {1: {"label_selector": {"pool": "in(big,huge)"}, "num_replicas": 3}}})
    deployments = shard_deployments(cfg)
    g0, g1 = deployments["default-group-000"], deployments["default-shard-002"]
    assert g0["ray_actor_options"]["memory"] == 1000 + 2.0 * 2 * (1500 + 300)
    assert g1["ray_actor_options"]["memory"] == 1000 + 2.0 * 2 * 200
    assert g0["ray_actor_options"]["label_selector"] == {"pool": "search"}
    assert g1["ray_actor_options"]["label_selector"] == {"pool": "in(big,huge)"}
    assert (g0["num_replicas"], g1["num_replicas"]) == (1, 3)


def test_cpus_needed_to_start_count_each_groups_own_replicas(root):
    from deployments.serve.app import logical_cpus_needed

    cfg = AppConfig(index=root, router={"num_cpus": 0.25},
                    shards={"group_size": 1, "num_cpus": 0.25, "groups": {1: {"num_replicas": 3}}})
    assert logical_cpus_needed(cfg) == pytest.approx((1 + 3 + 1) * 0.25 + 0.25)


def test_a_group_no_collection_has_is_refused(root):
    cfg = AppConfig(index=root, shards={"group_size": 2, "groups": {2: {"resources": {"node_c": 1}}}})
    with pytest.raises(ValueError, match=r"places group\(s\) \[2\] but collection 'default' has 2 group\(s\)"):
        shard_deployments(cfg)


def test_encoder_and_reranker_go_to_their_own_nodes(root, tmp_path):
    from deployments.serve.app import build_app

    cfg = AppConfig(index=root, encoder={"resources": {"gpu_node": 1}, "max_replicas_per_node": 1},
                    reranker={"model": str(tmp_path), "resources": {"gpu_node": 1}, "max_replicas_per_node": 2})
    router = build_app(cfg)._bound_deployment
    encoder = router.init_args[0]["default"].encoder._bound_deployment
    reranker = router.init_args[2]._bound_deployment
    for d, per_node in ((encoder, 1), (reranker, 2)):
        schema = deployment_to_schema(d).model_dump(exclude_unset=True)
        assert schema["ray_actor_options"]["resources"] == {"gpu_node": 1}
        assert schema["max_replicas_per_node"] == per_node


def test_the_shard_options_are_resolved_in_one_place():
    s = ShardsConfig(num_cpus=0.5, resources={"a": 1}, groups={0: {"resources": {"b": 1}}}, max_replicas_per_node=2)
    assert group_options(s, 0, 0) == {"num_replicas": 1, "max_replicas_per_node": 2,
                                      "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 0, "resources": {"b": 1}}}


# ---------------------------------------------------------------- a group too large for every node


NODES = [{"CPU": 8, "memory": 8 * GIB, "node_b": 1}, {"CPU": 8, "memory": 16 * GIB}]


def need(memory: float, **custom: float) -> GroupNeed:
    return GroupNeed("docs", 1, ["shard-002", "shard-003"], {"CPU": 0.25, "memory": memory, **custom}, 5 * GIB)


def test_a_group_some_node_can_hold_is_not_reported():
    assert unplaceable([need(12 * GIB), need(6 * GIB, node_b=1)], NODES) == []


def test_a_group_too_large_for_every_node_is_named_with_its_need_and_the_largest_node():
    (warning,) = unplaceable([need(12 * GIB, node_b=1)], NODES)
    assert warning.startswith("collection 'docs', shard group 1 (shard-002, shard-003): a replica needs CPU 0.25, "
                              "memory 12.0 GiB, node_b 1 (its shard files: 5.0 GiB); the largest node with "
                              "{'node_b': 1} has CPU 8, memory 8.0 GiB, node_b 1.")
    assert "stay pending until a node that can hold one joins" in warning


def test_a_group_whose_resources_no_node_has_says_so():
    (warning,) = unplaceable([need(1 * GIB, node_c=1)], NODES)
    assert "no node has the custom resources {'node_c': 1}" in warning


def test_the_app_logs_what_the_running_cluster_cannot_hold_and_still_builds(root, monkeypatch):
    from deployments.serve import app

    logged = []
    monkeypatch.setattr(app.logger, "warning", lambda fmt, *args: logged.append(fmt % args))
    cfg = AppConfig(index=root, shards={"group_size": 1, "memory_per_replica": "auto", "memory_base": "2GiB"})
    app.build_app(cfg)
    assert logged == [] and app.placement_warnings(cfg) == []  # before Ray runs there is no cluster to compare
    monkeypatch.setattr(app, "cluster_nodes", lambda: [{"CPU": 4, "memory": 2 * GIB}])
    app.build_app(cfg)
    assert [line.split(":")[1].strip() for line in logged] == ["collection 'default', shard group 0 (shard-000)",
                                                                "collection 'default', shard group 1 (shard-001)",
                                                                "collection 'default', shard group 2 (shard-002)"]
    assert app.placement_warnings(cfg, [{"CPU": 4, "memory": 3 * GIB}]) == []


# ---------------------------------------------------------------- the README's example


def test_the_readmes_placement_example_is_a_valid_config():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = re.search(r"### Splitting an index across nodes.*?```yaml\n(.*?)```", readme, re.S).group(1)
    cfg = AppConfig.model_validate(yaml.safe_load(block))
    assert cfg.shards.memory_per_replica == "auto" and set(cfg.shards.groups) == {0, 1}


# ---------------------------------------------------------------- replicas that follow the load


def test_shard_groups_and_routers_autoscale_each_on_its_own_load(root):
    """``shards.autoscaling`` makes each group a Serve deployment whose replicas follow its own load (a hot group grows
    alone); a group's own entry overrides it, a fixed num_replicas included; the router's the same way."""
    from deployments.serve.app import build_app, logical_cpus_needed

    load = {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 3, "upscale_delay_s": 2}
    cfg = AppConfig(index=root, router={"autoscaling": {"min_replicas": 2, "max_replicas": 5}},
                    shards={"group_size": 1, "autoscaling": load,
                            "groups": {1: {"autoscaling": {"min_replicas": 2, "max_replicas": 8}},
                                       2: {"num_replicas": 3}}})
    assert cfg.shards_of("default").placement == "auto" and not cfg.shards_of("default").in_router
    router = build_app(cfg)._bound_deployment
    routed = deployment_to_schema(router).model_dump(exclude_unset=True)
    assert routed["autoscaling_config"]["min_replicas"] == 2 and routed["autoscaling_config"]["max_replicas"] == 5
    assert "num_replicas" not in routed or routed["num_replicas"] in (None, "auto")
    schemas = list(shard_deployments(cfg).values())
    scaling = [(s.get("autoscaling_config") or {}).get("max_replicas") for s in schemas]
    assert scaling == [4, 8, None]  # group 0 the block's, group 1 its own, group 2 fixed
    assert schemas[0]["autoscaling_config"]["target_ongoing_requests"] == 3
    assert schemas[0]["autoscaling_config"]["upscale_delay_s"] == 2
    assert schemas[2]["num_replicas"] == 3
    # What starting needs: each group's starting replicas (1, 2, 3) and the router's 2, a quarter CPU each.
    assert logical_cpus_needed(cfg) == pytest.approx((1 + 2 + 3) * 0.25 + 2 * 0.25)


def test_autoscaling_cannot_be_asked_of_shards_searched_inside_the_router(root):
    with pytest.raises(ValidationError, match="autoscaling would be ignored"):
        ShardsConfig(placement="router", autoscaling={"max_replicas": 2})
