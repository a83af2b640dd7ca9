"""The container and the KubeRay manifest cannot be built or applied here; what can drift is checked."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import yaml

from deployments.config import AppConfig

ROOT = Path(__file__).parents[2]


def manifest() -> dict:
    return yaml.safe_load((ROOT / "deploy" / "rayservice.yaml").read_text())


def test_the_manifests_serve_config_is_this_apps_config():
    serve = yaml.safe_load(manifest()["spec"]["serveConfigV2"])
    (app,) = serve["applications"]
    module, _, name = app["import_path"].partition(":")
    assert callable(getattr(importlib.import_module(module), name))
    cfg = AppConfig.model_validate(app["args"])  # every field known and valid, as the app checks it at start
    assert cfg.index == "/indexes/docs" and cfg.shards.resources == {"search_node": 1}
    groups = {g["groupName"]: g for g in manifest()["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert groups["search"]["rayStartParams"]["resources"] == '"{\\"search_node\\": 8}"'


def test_the_readme_shows_the_manifest_as_it_is():
    readme = (ROOT / "README.md").read_text()
    assert (ROOT / "deploy" / "rayservice.yaml").read_text() in readme


def test_the_dockerfile_copies_what_exists_and_serves_as_readme_says():
    text = (ROOT / "Dockerfile").read_text()
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, _ = line.split()
        assert all((ROOT / s).exists() for s in sources), line
    assert "make setup" in text  # the README's own install
    cmd = re.search(r'^CMD (\[.+\])$', text, re.M).group(1)
    argv = yaml.safe_load(cmd)
    assert argv[:3] == ["python", "-m", "deployments"] and "--index" in argv
    readme = (ROOT / "README.md").read_text()
    assert "python -m deployments --index" in readme and shlex.join(argv[1:3]) == "-m deployments"
