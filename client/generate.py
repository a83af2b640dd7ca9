"""Writes client/raysearch_client/models.py from the server's models: ``python -m client.generate``.

The client cannot import the server (a 3 GB install that reaches fcntl), so it holds a copy of the models it
speaks. The copy is rendered from each server model's JSON schema (``model_json_schema()``), so its field names,
types, defaults, limits and descriptions are the server's by construction; tests/unit/test_client_models.py
fails when the copy is stale or renders a different schema. Only the schema is copied: the server's validators
(a body's nesting and numbers, ``stream`` needing ``synthesize``, ...) stay server-side, so the client refuses
what the schema refuses and leaves the rest to the server's 422.

Run from the repository root, in the server's venv; a schema keyword it cannot render is an error, never dropped.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel

from deployments.edge import schemas

MODELS_PY = Path(__file__).parent / "raysearch_client" / "models.py"

# The API's bodies the client sends and reads; everything they nest comes along.
ROOTS: tuple[type[BaseModel], ...] = (
    schemas.SearchRequest, schemas.SearchResponse, schemas.BatchSearchRequest, schemas.BatchSearchResponse,
    schemas.FeedbackRequest, schemas.FeedbackResponse, schemas.HealthResponse, schemas.UpsertDocumentsRequest,
    schemas.DeleteDocumentsRequest, schemas.WriteResponse, schemas.DocumentResponse, schemas.ListDocumentsRequest,
    schemas.DocumentsPage, schemas.CreateCollectionRequest, schemas.CollectionCreated, schemas.BuildRequest,
    schemas.BuildJob, schemas.BuildJobs, schemas.CollectionsResponse, schemas.ErrorResponse,
)

# JSON schema limits -> pydantic Field arguments, in the order they are written.
LIMITS = {"minimum": "ge", "exclusiveMinimum": "gt", "maximum": "le", "exclusiveMaximum": "lt",
          "minLength": "min_length", "minItems": "min_length", "minProperties": "min_length",
          "maxLength": "max_length", "maxItems": "max_length", "maxProperties": "max_length", "pattern": "pattern",
          "multipleOf": "multiple_of"}
SHAPE = {"type", "items", "additionalProperties", "patternProperties", "propertyNames", "$ref", "anyOf", "enum", "const"}
ANNOTATION = {"title", "description", "default"}
SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}
# Model settings the schema does not show (extra="forbid" it does: additionalProperties false).
CONFIG_KEYS = ("extra", "allow_inf_nan", "frozen")
LINE = 110  # ruff's line-length


def classes(model: type[BaseModel], found: dict[str, type[BaseModel]]) -> dict[str, type[BaseModel]]:
    """``model`` and every model its fields nest, by class name (for the settings a schema does not show)."""
    found[model.__name__] = model
    todo = [f.annotation for f in model.model_fields.values()]
    while todo:
        t = todo.pop()
        if isinstance(t, type) and issubclass(t, BaseModel) and t.__name__ not in found:
            classes(t, found)
        todo.extend(get_args(t))
    return found


def definitions() -> dict[str, dict]:
    """Every schema the roots hold, by name, dependencies before their users (roots in ``ROOTS`` order)."""
    defs: dict[str, dict] = {}
    for model in ROOTS:
        schema = model.model_json_schema()
        for name, sub in schema.pop("$defs", {}).items():
            if defs.setdefault(name, sub) != sub:
                raise ValueError(f"two schemas named {name}")
        defs[model.__name__] = schema
    ordered: dict[str, dict] = {}

    def visit(name: str) -> None:
        if name not in ordered:
            for ref in refs(defs[name]):
                visit(ref)
            ordered[name] = defs[name]

    for model in ROOTS:
        visit(model.__name__)
    return ordered


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else []
        return own + [r for value in node.values() for r in refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in refs(value)]
    return []


def literal(value: Any) -> str:
    """A JSON value as Python source (strings double-quoted, as ruff writes them)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def limits(node: dict) -> dict[str, Any]:
    unknown = set(node) - SHAPE - ANNOTATION - set(LIMITS)
    if unknown:
        raise ValueError(f"schema keywords this generator does not render: {sorted(unknown)} in {node}")
    return {LIMITS[k]: node[k] for k in LIMITS if k in node}


def shape(node: dict) -> str:
    """The type a schema node describes, without its own limits."""
    if "$ref" in node:
        return node["$ref"].rsplit("/", 1)[1]
    if "anyOf" in node:
        return " | ".join(inner(branch) for branch in node["anyOf"])
    if "enum" in node or "const" in node:
        return "Literal[" + ", ".join(literal(v) for v in node.get("enum", [node.get("const")])) + "]"
    kind = node.get("type")
    if kind is None:
        return "Any"
    if kind in SCALARS:
        return SCALARS[kind]
    if kind == "array":
        return f"list[{inner(node['items']) if 'items' in node else 'Any'}]"
    if kind == "object":
        values = node.get("additionalProperties", True)
        key = inner({"type": "string", **node["propertyNames"]}) if "propertyNames" in node else "str"
        if "patternProperties" in node:  # dict[Annotated[str, pattern], V]
            ((pattern, values),) = node["patternProperties"].items()
            key = inner({"type": "string", "pattern": pattern})
        return f"dict[{key}, {'Any' if values is True else inner(values)}]"
    raise ValueError(f"schema type this generator does not render: {kind!r}")


def inner(node: dict) -> str:
    """A nested type with its limits: ``Annotated[float, Field(ge=0)]``."""
    lim = limits(node)
    return f"Annotated[{shape(node)}, Field({', '.join(f'{k}={literal(v)}' for k, v in lim.items())})]" if lim else shape(node)


def wrapped(text: str, indent: str) -> str:
    """A long string as implicitly concatenated literals, one per line."""
    lines = textwrap.wrap(text, LINE - 24, drop_whitespace=False, break_on_hyphens=False) or [""]
    return f"\n{indent}".join(literal(line) for line in lines)


def field_line(name: str, node: dict, required: bool, defs: dict[str, dict]) -> str:
    node = dict(node)
    description, title, has_default = node.pop("description", None), node.pop("title", None), "default" in node
    default = node.pop("default", None)
    branches = node.get("anyOf", [])
    real = [b for b in branches if b != {"type": "null"}]
    if len(real) == 1 and len(branches) == 2:  # X | None: X's limits go on the field, as the server writes them
        lim, node["anyOf"] = limits(real[0]), [{k: v for k, v in real[0].items() if k not in LIMITS}, {"type": "null"}]
    else:
        lim = limits(node)
        node = {k: v for k, v in node.items() if k not in LIMITS}
    annotation = shape(node)
    args = []
    if has_default:
        enum = defs.get(node.get("$ref", "").rsplit("/", 1)[-1], {}).get("enum", [])
        args.append(f"{shape(node)}.{default}" if default in enum else literal(default))
    elif not required:  # a default_factory: the schema shows no default
        args.append(f"default_factory={'list' if node.get('type') == 'array' else 'dict'}")
    args += [f"{k}={literal(v)}" for k, v in lim.items()]
    if title is not None and title != name.title().replace("_", " "):
        args.append(f"title={literal(title)}")
    if has_default and len(args) == 1 and not description:
        return f"    {name}: {annotation} = {args[0]}"
    if not args and not description:
        return f"    {name}: {annotation}"
    head = f"    {name}: {annotation} = Field(" + ", ".join(args)
    if not description:
        return head + ")"
    line = head + (", " if args else "") + f"description={literal(description)})"
    if len(line) <= LINE:
        return line
    return head + ("," if args else "") + "\n        description=" + wrapped(description, " " * 8) + ")"


def docstring(text: str | None) -> list[str]:
    if not text:
        return []
    body = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return ['    """' + body.replace("\n", "\n    ") + '"""', ""]


def render_class(name: str, node: dict, defs: dict[str, dict], found: dict[str, type[BaseModel]]) -> list[str]:
    if "enum" in node:
        members = [f"    {v} = {literal(v)}" for v in node["enum"]]
        return [f"class {name}(StrEnum):", *docstring(node.get("description")), *members]
    config = {k: v for k, v in found[name].model_config.items() if k in CONFIG_KEYS}
    lines = [f"class {name}(BaseModel):", *docstring(node.get("description"))]
    if config:
        lines += ["    model_config = ConfigDict(" + ", ".join(f"{k}={literal(v)}" for k, v in config.items()) + ")", ""]
    required = set(node.get("required", []))
    lines += [field_line(f, sub, f in required, defs) for f, sub in node.get("properties", {}).items()]
    return lines


HEADER = '''"""The API's request and response models, as the server defines them (deployments/edge/schemas.py).

GENERATED by ``python -m client.generate``: do not edit. Field names, types, defaults, limits and descriptions are
the server's (tests/unit/test_client_models.py compares their JSON schemas); the server's own checks beyond the
schema (validators) are not copied, so a request they refuse is answered with the server's 422.
"""

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
'''


def render() -> str:
    defs = definitions()
    found: dict[str, type[BaseModel]] = {}
    for model in ROOTS:
        classes(model, found)
    blocks = ["\n".join(render_class(name, node, defs, found)) for name, node in defs.items()]
    return HEADER + "\n\n" + "\n\n\n".join(blocks) + "\n"


def main() -> None:
    MODELS_PY.write_text(render())
    print(f"wrote {MODELS_PY}", file=sys.stderr)


if __name__ == "__main__":
    main()
