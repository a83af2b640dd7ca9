"""The client stands alone: importing ``raysearch_client`` (the checkout's client/, as ``pip install ./client``
installs it) reaches no server module and no heavy dependency, and works where there is no fcntl (Windows).
(The install itself into a fresh venv needs the package registry: see the report of issue 43, item 1.)"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

CLIENT = Path(__file__).parents[2] / "client"
SERVER_SIDE = ["deployments", "index_format", "index_build", "relevance", "demo", "bench", "ray", "torch", "numpy",
               "fastapi", "starlette", "transformers", "faiss", "pyserini", "fcntl"]

CODE = """
import json, sys
for name in BLOCKED:
    sys.modules[name] = None  # importing any of them now fails
import raysearch_client, raysearch_client.models, raysearch_client.events
print(json.dumps({"file": raysearch_client.__file__, "loaded": [m for m, v in sys.modules.items() if v is not None]}))
"""


def test_the_client_imports_without_the_server_or_fcntl(tmp_path):
    done = subprocess.run([sys.executable, "-c", CODE.replace("BLOCKED", repr(SERVER_SIDE))], capture_output=True, text=True,
                          cwd=tmp_path, env={"PYTHONPATH": str(CLIENT), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout)
    assert answer["file"] == str(CLIENT / "raysearch_client" / "__init__.py")
    assert [m for m in answer["loaded"] if m.split(".")[0] in SERVER_SIDE] == []


def test_the_distribution_depends_on_httpx_and_pydantic_only():
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "raysearch-client"
    assert sorted(d.split(">")[0].split("=")[0] for d in project["dependencies"]) == ["httpx", "pydantic"]
