"""What every operator command shares: flags generated from a config model, and exit codes.

The vocabulary the commands share (README.md, "One vocabulary"): ``--index ROOT`` is an index root a command
reads, ``--out`` what it writes; ``--train-split`` the queries learned or tuned on, ``--test-split`` the queries
measured on, ``--held-out-share`` the share held out of a collection with one split; replica counts are
``num_replicas`` as Serve names them. A config field's flag is its name, a nested section's fields under the
section's (``shards.num_replicas`` is ``--shards.num-replicas``). Usage errors exit with 2 (argparse's code),
failures with 1, and both write to stderr.

The build keeps its own flat copy of the generator (index_build/cli.py): the service never imports the job, nor
the job the service, and a flag generator is not part of the index format both import.
"""

from __future__ import annotations

import argparse
import copy
import enum
import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

USAGE_ERROR = 2
FAILURE = 1


def flag(path: str) -> str:
    """``shards.num_replicas`` -> ``--shards.num-replicas``."""
    return "--" + path.replace("_", "-")


def add_model_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, model: type[BaseModel],
                        metavars: dict[str, str] | None = None, prefix: str = "") -> list[str]:
    """One flag per field of ``model``, recursing into nested models (each top-level one a group of ``--help``
    titled by its name); returns the fields' dotted paths, which are also the flags' ``dest``. Defaults stay None
    (not given), so a file's value is replaced only by a flag given; the help names the model's default.
    Scalars take one value, lists of scalars several, dicts, models off by default and anything else one YAML
    value."""
    paths = []
    for name, info in model.model_fields.items():
        path, annotation = prefix + name, _unoptional(info.annotation)
        if is_section(annotation, info):
            group = parser
            if isinstance(parser, argparse.ArgumentParser):  # argparse does not nest groups
                doc = (annotation.__doc__ or "").split("\n\n")[0].replace("``", "")
                group = parser.add_argument_group(f"{path} (the config's {path}: section)",
                                                  _escape(" ".join(doc.split())))
            paths += add_model_arguments(group, annotation, metavars, path + ".")
            continue
        kwargs = _value_kind(annotation, (metavars or {}).get(path, name.upper()))
        parser.add_argument(flag(path), dest=path, default=None, help=_help(info), **kwargs)
        paths.append(path)
    return paths


def is_section(annotation: Any, info) -> bool:
    """A nested model present by default is a section, a flag per field; one that defaults to None (off until
    given, as ``security.key_limit``) is one value, given whole as YAML: its fields mean nothing apart."""
    return (isinstance(annotation, type) and issubclass(annotation, BaseModel)
            and info.get_default(call_default_factory=True) is not None)


def _unoptional(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _value_kind(annotation: Any, metavar: str) -> dict[str, Any]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is typing.Literal:
        return {"choices": list(args)}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"choices": [m.value for m in annotation]}
    if annotation in (int, float):
        return {"type": annotation, "metavar": metavar}
    if origin is list and args and args[0] in (str, int, float):
        return {"nargs": "*", "type": args[0], "metavar": metavar}
    if origin is not None or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return {"type": _yaml, "metavar": "YAML"}  # dicts, lists of mappings, a model off by default
    return {"metavar": metavar}  # str, Path: pydantic converts


def _yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"not a YAML value ({getattr(e, 'problem', e)}): {text!r}") from None


def _help(info) -> str:
    """The field's description and its default, said once (a description naming its default keeps its words)."""
    description = _escape(info.description or "")
    if info.is_required():
        return f"{description} (required)"
    if "default:" in description:
        return description
    return f"{description} (default: {_show(info.get_default(call_default_factory=True))})"


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse formats help with %


def _show(value: Any) -> str:
    """A default as it is written in YAML and on the command line."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
    return str(value)


def model_from_args(parser: argparse.ArgumentParser, model: type[BaseModel], paths: list[str],
                    ns: argparse.Namespace, values: dict[str, Any]) -> BaseModel:
    """``model`` from ``values`` (a file's) with each flag given put at its path; an invalid result exits with
    2 and one line a problem, naming the flag (or the file's key) and the value given."""
    merged = copy.deepcopy(values)
    for path in paths:
        value = getattr(ns, path)
        if value is None:
            continue
        *sections, key = path.split(".")
        node = merged
        for section in sections:
            node[section] = dict(node[section]) if isinstance(node.get(section), dict) else {}
            node = node[section]
        node[key] = value
    try:
        return model.model_validate(merged)
    except ValidationError as e:
        problems = "\n".join(_problem(err, set(paths)) for err in e.errors())
        parser.exit(USAGE_ERROR, f"{parser.prog}: error: invalid options:\n{problems}\n")


def _problem(err: dict, paths: set[str]) -> str:
    loc = [str(part) for part in err["loc"]]
    for n in range(len(loc), 0, -1):
        path = ".".join(loc[:n])
        if path in paths:
            inner = f" ({'.'.join(loc[n:])})" if loc[n:] else ""
            given = f" (given: {err['input']!r})" if not inner and not isinstance(err["input"], (dict, list)) else ""
            return f"  {flag(path)}{inner}: {_message(err)}{given}"
    return f"  {'.'.join(loc) or 'config'}: {_message(err)}"


def _message(err: dict) -> str:
    return err["msg"].removeprefix("Value error, ")  # pydantic's prefix to a validator's own words
