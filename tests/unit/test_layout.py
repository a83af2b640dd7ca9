"""The layout's promise: the search, shard, documents and synthesis cores, the work of the router's routes
(admin, feedback, health) and the offline relevance package run without Ray; the service, the job and the format
never import the offline relevance work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CODE = """
import importlib, pkgutil, sys
sys.modules["ray"] = None  # any `import ray` now fails
import deployments.documents, deployments.edge, deployments.judgments, deployments.search, deployments.shard
import deployments.synthesis, relevance
# The routes' work beside the packages: builds (the admin API's), judgments (POST /feedback's), health.
import deployments.admin, deployments.builds, deployments.feedback, deployments.health
# Every module of relevance: none needs Ray to be imported (only `relevance.tune --apply` reaches Ray, when it
# runs, through deployments.settings).
for pkg in (deployments.documents, deployments.edge, deployments.search, deployments.shard, deployments.synthesis,
            relevance):
    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{m.name}")
print("ok")
"""


def test_cores_import_without_ray():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def _modules() -> dict[str, Path]:
    """The project's modules by dotted name, and their files."""
    root = Path(__file__).parents[2]
    modules = {}
    for package in ("index_format", "index_build", "deployments", "relevance"):
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(top_level_only: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in its code, or only at its top level)."""
    import ast

    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        found = set()
        for node in (tree.body if top_level_only else ast.walk(tree)):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level:  # relative: from the module's own package up
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1])
                found |= {f"{base}.{node.module}" if node.module else base}
                found |= {f"{base}.{node.module}.{a.name}" if node.module else f"{base}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_the_service_never_imports_the_job_and_the_format_imports_neither():
    graph = _imports()
    assert {(a, b) for a, deps in graph.items() for b in deps
            if a.startswith("deployments") and b.startswith("index_build")} == set()
    assert {(a, b) for a, deps in graph.items() for b in deps
            if a.startswith("index_format") and not b.startswith("index_format")} == set()


def test_the_service_the_job_and_the_format_never_import_the_offline_relevance_work():
    """relevance (evaluation, tuning, training) may import deployments and index_format; nothing imports it."""
    graph = _imports()
    assert {(a, b) for a, deps in graph.items() for b in deps
            if a.split(".")[0] != "relevance" and b.split(".")[0] == "relevance"} == set()


def test_no_module_imports_itself_back_at_module_level():
    """No cycle among the modules' top-level imports (a cycle breaks as soon as one of them is imported first)."""
    graph = _imports(top_level_only=True)
    seen, stack, cycles = set(), [], []

    def visit(n):
        if n in stack:
            cycles.append(stack[stack.index(n):] + [n])
            return
        if n in seen:
            return
        seen.add(n)
        stack.append(n)
        for m in sorted(graph[n]):
            visit(m)
        stack.pop()

    for n in sorted(graph):
        visit(n)
    assert cycles == []


def test_the_edge_is_ray_free_and_the_cores_know_only_its_schemas():
    """The HTTP edge (schemas, keys, front door, shedding, the error table, console files, metrics) never imports
    the Serve deployments; the search and shard cores import from it only the API's schemas (the request they
    serve), never the HTTP layer, and raise error kinds that only the edge maps to status codes."""
    graph = _imports()
    assert {(a, b) for a, deps in graph.items() for b in deps
            if a.startswith("deployments.edge") and b.startswith("deployments.serve")} == set()
    assert {(a, b) for a, deps in graph.items() for b in deps
            if a.startswith(("deployments.search", "deployments.shard")) and b.startswith("deployments.edge")
            and b not in ("deployments.edge", "deployments.edge.schemas")} == set()
