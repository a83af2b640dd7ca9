"""The client stands alone: importing ``raysearch_client`` (the checkout's client/, as ``pip install ./client``
installs it) reaches no server module, no heavy dependency and no framework, and works where there is no fcntl
(Windows); each framework adapter imports its own framework and no other (each is its own optional extra).
(The install itself into a fresh venv needs the package registry: see the report of issue 43, item 1.)"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

CLIENT = Path(__file__).parents[2] / "client"
SERVER_SIDE = ["deployments", "index_format", "index_build", "relevance", "demo", "bench", "ray", "torch", "numpy",
               "fastapi", "starlette", "transformers", "faiss", "pyserini", "fcntl"]
OWN = SERVER_SIDE[:7] + ["fcntl"]  # the server's packages and Ray (an adapter's framework may well need numpy)
FRAMEWORKS = {"langchain": "langchain_core", "llamaindex": "llama_index", "haystack": "haystack"}  # module: package

CODE = """
import json, sys
for name in BLOCKED:
    sys.modules[name] = None  # importing any of them now fails
import raysearch_client, raysearch_client.models, raysearch_client.events
print(json.dumps({"file": raysearch_client.__file__, "loaded": [m for m, v in sys.modules.items() if v is not None]}))
"""


def test_the_client_imports_without_the_server_any_framework_or_fcntl(tmp_path):
    blocked = [*SERVER_SIDE, *FRAMEWORKS.values()]
    answer = imported(tmp_path, blocked, "raysearch_client.models, raysearch_client.events")
    assert answer["file"] == str(CLIENT / "raysearch_client" / "__init__.py")
    assert [m for m in answer["loaded"] if m.split(".")[0] in blocked] == []


def imported(cwd, blocked: list[str], modules: str) -> dict:
    code = CODE.replace("BLOCKED", repr(blocked)).replace("raysearch_client.models, raysearch_client.events", modules)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                          env={"PYTHONPATH": str(CLIENT), "PATH": "/usr/bin:/bin",
                               "HAYSTACK_TELEMETRY_ENABLED": "False"}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("adapter", sorted(FRAMEWORKS))
def test_each_adapter_imports_its_own_framework_and_no_other_nor_the_server(tmp_path, adapter):
    others = [package for name, package in FRAMEWORKS.items() if name != adapter]
    answer = imported(tmp_path, [*OWN, *others], f"raysearch_client.{adapter}")
    assert FRAMEWORKS[adapter] in answer["loaded"]


def test_the_distribution_depends_on_httpx_and_pydantic_only():
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "raysearch-client"
    assert sorted(d.split(">")[0].split("=")[0] for d in project["dependencies"]) == ["httpx", "pydantic"]
    assert sorted(project["optional-dependencies"]) == sorted(FRAMEWORKS)


MISSING = """
import sys
sys.modules[PACKAGE] = None  # as if its extra were not installed
try:
    import raysearch_client.ADAPTER
except ImportError as e:
    print(str(e))
"""


@pytest.mark.parametrize("adapter", sorted(FRAMEWORKS))
def test_an_adapter_whose_framework_is_missing_names_the_extra_to_install(tmp_path, adapter):
    code = MISSING.replace("PACKAGE", repr(FRAMEWORKS[adapter])).replace("ADAPTER", adapter)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={"PYTHONPATH": str(CLIENT), "PATH": "/usr/bin:/bin", "HAYSTACK_TELEMETRY_ENABLED": "False"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f'pip install "raysearch-client[{adapter}]"' in done.stdout


def test_the_package_ships_its_types():
    """PEP 561: ``py.typed`` beside the modules and in the distribution's package data, so a type checker reads the
    client's annotations (the models, not ``Any``)."""
    assert (CLIENT / "raysearch_client" / "py.typed").is_file()
    setuptools = tomllib.loads((CLIENT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in setuptools["package-data"]["raysearch_client"]
