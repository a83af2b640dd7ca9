"""The layout's promise: the search, shard and relevance cores run without Ray."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import importlib, pkgutil, sys
sys.modules["ray"] = None  # any `import ray` now fails
import deployments.relevance, deployments.search, deployments.shard
for pkg in (deployments.search, deployments.shard, deployments.relevance):
    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{m.name}")
print("ok")
"""


def test_cores_import_without_ray():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
