"""deploy/rayservice.yaml read the way KubeRay reads it: its pod groups, what each pod offers Ray, what each
container is given. Shared by the manifest's unit checks and the test that runs its serveConfigV2."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]
MANIFEST = ROOT / "deploy" / "rayservice.yaml"
SCHEMA = ROOT / "tests" / "fixtures" / "kuberay" / "rayservice-v1.openapi.json"


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def serve_config(doc: dict | None = None) -> dict:
    """serveConfigV2, parsed (a string in the CRD; Serve's own config inside)."""
    return yaml.safe_load((doc or manifest())["spec"]["serveConfigV2"])


def app_args(doc: dict | None = None) -> dict:
    (app,) = serve_config(doc)["applications"]
    return app["args"]


def cpu_quantity(value: str | int | float) -> float:
    """A Kubernetes CPU quantity in cores: 2, "2", "500m"."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


@dataclass
class Group:
    """One pod group: the head (min = max = 1) or a worker group, and the Ray resources each of its pods offers
    (``ray start --num-cpus/--num-gpus/--resources``, as KubeRay passes rayStartParams)."""

    name: str
    min_pods: int
    max_pods: int
    offers: dict[str, float]
    pod: dict = field(repr=False)
    start_params: dict = field(repr=False)

    @property
    def ray_container(self) -> dict:
        return self.pod["containers"][0]  # KubeRay's Ray container is the first


def offers(params: dict, container: dict) -> dict[str, float]:
    """What `ray start` advertises for these rayStartParams: num-cpus (else the container's CPU limit, as KubeRay
    sets it), num-gpus (else the nvidia.com/gpu limit), and the custom resources' JSON (a shell word)."""
    limits = container.get("resources", {}).get("limits", {})
    out = {"CPU": float(params["num-cpus"]) if "num-cpus" in params else cpu_quantity(limits.get("cpu", 0)),
           "GPU": float(params.get("num-gpus", limits.get("nvidia.com/gpu", 0)))}
    if "resources" in params:
        (text,) = shlex.split(params["resources"])
        out.update({k: float(v) for k, v in json.loads(text).items()})
    return out


def groups(doc: dict | None = None) -> list[Group]:
    cluster = (doc or manifest())["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    out = [Group("head", 1, 1, offers(head["rayStartParams"], head["template"]["spec"]["containers"][0]),
                 head["template"]["spec"], head["rayStartParams"])]
    for g in cluster["workerGroupSpecs"]:
        spec = g["template"]["spec"]
        out.append(Group(g["groupName"], g["minReplicas"], g["maxReplicas"],
                         offers(g["rayStartParams"], spec["containers"][0]), spec, g["rayStartParams"]))
    return out


def container_env(container: dict, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The variables a container's spec gives it: ``env`` values, and each ``envFrom`` Secret's keys from
    ``secrets`` (name -> its data), as the kubelet fills them."""
    env = {}
    for source in container.get("envFrom", []):
        env.update(secrets[source["secretRef"]["name"]])
    for var in container.get("env", []):
        env[var["name"]] = var["value"]
    return env


def mounts(pod: dict, container: dict) -> dict[str, dict]:
    """mountPath -> the pod volume mounted there."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    return {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def dockerfile_env() -> dict[str, str]:
    """The image's ENV (one instruction of KEY=VALUE words, continued over lines)."""
    (body,) = re.findall(r"^ENV ((?:.*\\\n)*.*)$", dockerfile(), re.M)
    return dict(word.split("=", 1) for word in shlex.split(body.replace("\\\n", " ")))
