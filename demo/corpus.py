"""A demo corpus made on the user's own machine, with no download: Python's documentation as it is
installed here.

Every module, class and function docstring of the standard library (and, to pass ~10k chunks, of a
few installed packages) becomes one document. The source is parsed with ``ast``, never imported, so
nothing runs and nothing prints. Metadata for filters: ``package``, ``module``, ``kind``
(module/class/function), ``lineno`` and ``words``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

# Parts of the tree that are tests, demos or GUI scaffolding rather than documentation.
_SKIP_PARTS = {"test", "tests", "testing", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages",
               "__pycache__", "_vendor", "vendored", "benchmarks"}
DEFAULT_PACKAGES = ("pydantic", "fastapi", "pyarrow")
MIN_WORDS = 5


def _module_name(root: Path, path: Path, prefix: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([prefix, *parts] if prefix else parts) or prefix


def _docstrings(tree: ast.Module, module: str) -> Iterator[tuple[str, str, int, str]]:
    """(qualified name, kind, line, docstring) for the module and its public classes and functions."""
    doc = ast.get_docstring(tree)
    if doc:
        yield module, "module", 1, doc
    stack: list[tuple[ast.AST, str]] = [(tree, module)]
    while stack:
        node, prefix = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                if child.name.startswith("_") and not child.name.startswith("__init__"):
                    continue
                name = f"{prefix}.{child.name}"
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                text = ast.get_docstring(child)
                if text:
                    yield name, kind, child.lineno, text
                if isinstance(child, ast.ClassDef):
                    stack.append((child, name))


def _sources(packages: tuple[str, ...]) -> Iterator[tuple[str, Path, str]]:
    """(package label, root folder, module prefix) for the stdlib and each installed package."""
    yield "stdlib", Path(sysconfig.get_paths()["stdlib"]), ""
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec and spec.submodule_search_locations:
            yield name, Path(next(iter(spec.submodule_search_locations))), name


def iter_demo_documents(packages: tuple[str, ...] = DEFAULT_PACKAGES) -> Iterator[dict]:
    seen: set[str] = set()
    for label, root, prefix in _sources(packages):
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).parts
            if _SKIP_PARTS.intersection(rel) or any(p.startswith("test_") for p in rel):
                continue
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            module = _module_name(root, path, prefix)
            for name, kind, line, text in _docstrings(tree, module):
                words = len(text.split())
                if words < MIN_WORDS or name in seen:
                    continue
                seen.add(name)
                yield {"_id": name, "title": name, "text": text,
                       "metadata": {"package": label, "module": module, "kind": kind, "lineno": line,
                                    "words": words}}


def write_demo_corpus(out: Path, packages: tuple[str, ...] = DEFAULT_PACKAGES) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for doc in iter_demo_documents(packages):
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(out)
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.corpus", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/demo/corpus.jsonl"), help="JSONL file to write")
    parser.add_argument("--packages", nargs="*", default=list(DEFAULT_PACKAGES),
                        help="installed packages to include besides the standard library (missing ones are skipped)")
    args = parser.parse_args(argv)
    n = write_demo_corpus(args.out, tuple(args.packages))
    print(f"wrote {n:,} documents to {args.out} (Python {sys.version.split()[0]} docstrings)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
