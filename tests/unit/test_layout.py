"""The layout's promise: the search, shard, documents and synthesis cores, the work of the router's routes
(deployments.api) and the offline relevance package run without Ray; the service and the job never import
each other, the format neither of them, and none of them the offline relevance work or the demo; the packages import
one another one way, with no loop."""

from __future__ import annotations

import subprocess
import sys
from itertools import pairwise
from pathlib import Path

CODE = """
import importlib, pkgutil, sys
sys.modules["ray"] = None  # any `import ray` now fails
import deployments.api, deployments.documents, deployments.edge, deployments.judgments, deployments.search
import deployments.shard, deployments.synthesis, relevance
# Beside the packages: builds (the admin API's jobs), the one bounded cache, and where shard groups are placed.
import deployments.builds, deployments.bounded, deployments.placement
# Every module of relevance: none needs Ray to be imported (only `relevance.tune --apply` reaches Ray, when it
# runs, through deployments.settings).
for pkg in (deployments.api, deployments.documents, deployments.edge, deployments.search, deployments.shard,
            deployments.synthesis, relevance):
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
    for package in ("index_format", "index_build", "deployments", "relevance", "demo"):
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


def _top(module: str) -> str:
    return module.split(".")[0]


def test_the_service_and_the_job_never_import_each_other_and_the_format_imports_neither():
    """Any import, anywhere in a module (a function's own too): what both sides share is the format, and what uses
    both (the demo) lives apart from either."""
    graph = _imports()
    assert {(a, b) for a, deps in graph.items() for b in deps
            if _top(a) == "deployments" and _top(b) == "index_build"} == set()
    assert {(a, b) for a, deps in graph.items() for b in deps
            if _top(a) == "index_build" and _top(b) == "deployments"} == set()
    assert {(a, b) for a, deps in graph.items() for b in deps
            if _top(a) == "index_format" and _top(b) != "index_format"} == set()
    assert {(a, b) for a, deps in graph.items() for b in deps if _top(a) != "demo" and _top(b) == "demo"} == set()


def test_the_service_the_job_and_the_format_never_import_the_offline_relevance_work():
    """relevance (evaluation, tuning, training) may import deployments and index_format; nothing imports it."""
    graph = _imports()
    assert {(a, b) for a, deps in graph.items() for b in deps
            if a.split(".")[0] != "relevance" and b.split(".")[0] == "relevance"} == set()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles of a directed graph, each as its nodes with the first repeated at the end (empty: none; one cycle
    found per back edge of a depth-first search, so not every cycle is listed, but some is while any is left)."""
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
    return cycles


def test_no_module_imports_itself_back_at_module_level():
    """No cycle among the modules' top-level imports (a cycle breaks as soon as one of them is imported first)."""
    assert _cycles(_imports(top_level_only=True)) == []


def test_no_module_imports_itself_back_anywhere():
    """No cycle either among every import, a function's own too: a module that imports another inside a function to
    dodge a circle still depends on it both ways (the change logs once did, through the function that opened one)."""
    assert _cycles(_imports()) == []


def test_no_package_imports_itself_back():
    """The packages (each folder with an ``__init__.py``: ``deployments.search``, ``deployments.shard``,
    ``deployments.synthesis`` and the root ``deployments``, which holds ``config``, ``errors`` and the rest, each
    count apart) import one another one way. A imports B when a module of A imports a module of B at its top level;
    a loop means neither package can be read, tested or moved without the other. Each step of a loop found is
    shown with one import that makes it."""
    modules = _modules()
    package = {m: m if path.name == "__init__.py" else m.rpartition(".")[0] for m, path in modules.items()}
    why: dict[tuple[str, str], str] = {}
    for a, deps in sorted(_imports(top_level_only=True).items()):
        for b in sorted(deps):
            if package[a] != package[b]:
                why.setdefault((package[a], package[b]), f"{a} -> {b}")
    graph = {p: set() for p in set(package.values())}
    for a, b in why:
        graph[a].add(b)
    loops = [[why[step] for step in pairwise(cycle)] for cycle in _cycles(graph)]
    assert loops == [], "\n".join(", then ".join(loop) for loop in loops)


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
