"""Command-line flags generated from ``BuildConfig``: one source for options, help and validation."""

from __future__ import annotations

import argparse
import enum
import json
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

from index_format.process import configure_process

from .config import BuildConfig, load_yaml


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_model_arguments(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One flag per field; defaults stay None so a YAML file's values are only overridden when given."""
    for name, info in model.model_fields.items():
        annotation = info.annotation
        origin = typing.get_origin(annotation)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and len(args) == 1:
            annotation, origin = args[0], typing.get_origin(args[0])
        help_text = _help(info.description or "", info.default)
        kwargs: dict[str, Any] = {"default": None, "help": help_text, "dest": name}
        if annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif origin is tuple:
            kwargs["nargs"] = "+"
            kwargs["metavar"] = "NAME"
        elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            kwargs["choices"] = [m.value for m in annotation]
        elif annotation in (int, float):
            kwargs["type"] = annotation
        elif annotation is Path or name in METAVARS:
            kwargs["metavar"] = METAVARS.get(name, "PATH")
        parser.add_argument(_flag(name), **kwargs)


# README, "One vocabulary"; a ROOT or a corpus file may be a URL (``config.Location``).
METAVARS = {"out": "ROOT", "reuse_from": "ROOT", "corpus": "PATH|URL", "changes": "PATH|URL", "deletes": "PATH|URL"}


def _help(description: str, default: Any) -> str:
    """The field's description and its default, said once: a description that already names its default
    (the version's name, the base version) keeps its own words, and an absent default (None) is not shown."""
    if default is PydanticUndefined:
        return f"{description} (required)"
    if default is None or "default:" in description:
        return description
    return f"{description} (default: {_show(default)})"


def _show(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return " ".join(value)
    return str(value)


def config_from_args(argv: list[str] | None, prog: str = "python -m index_build") -> BuildConfig:
    return parse_args(argv, prog)[0]


def parse_args(argv: list[str] | None, prog: str = "python -m index_build") -> tuple[BuildConfig, Path | None]:
    """The build's config from flags (and a YAML file), and where to write its summary as JSON (or None)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Build a sharded, versioned hybrid index (FAISS dense + Lucene BM25) from a corpus.\n"
            "Reads a BEIR folder, a JSONL or Parquet file, or a folder or glob of them (in parallel); chunks,\n"
            "embeds with actors on each shard's node, builds each shard's FAISS and Lucene index in parallel Ray\n"
            "tasks, and publishes the\n"
            "result atomically as OUT/versions/<version> (OUT/ACTIVE names the live version).\n"
            "OUT (and the corpus) may be a URL in object storage, s3://bucket/prefix: the build stages on this\n"
            "node, uploads each shard as it is committed, publishes the version, and activates it only if no one\n"
            "else activated a version since it started (endpoint and keys: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,\n"
            "AWS_SECRET_ACCESS_KEY, AWS_REGION)."
        ),
        epilog=(
            "examples:\n"
            "  python -m index_build --corpus data/scifact --out indexes/scifact --shards 4\n"
            "  python -m index_build --config build.yaml --shards 2     # flags override the file\n"
            "  python -m index_build --corpus s3://data/scifact/corpus.jsonl --out s3://indexes/scifact\n"
            "  python -m index_build.versions list indexes/scifact\n\n"
            "A killed build resumes when rerun with the same corpus and options: finished shards are kept.\n"
            "A build into a root with earlier versions embeds only new or changed chunks and links unchanged\n"
            "shards (--no-reuse: everything afresh); the summary says how many chunks were embedded and reused."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, metavar="FILE.yaml", help="YAML file with any of the options below")
    parser.add_argument("--summary-json", type=Path, metavar="FILE",
                        help="Also write the build's summary to FILE as JSON (what a job started through the API reports)")
    add_model_arguments(parser, BuildConfig)
    ns = parser.parse_args(argv)
    values: dict[str, Any] = load_yaml(ns.config) if ns.config else {}
    values.update({k: v for k, v in vars(ns).items() if k not in ("config", "summary_json") and v is not None})
    try:
        cfg = BuildConfig(**values)
    except ValidationError as e:
        problems = "\n".join(
            f"  {_flag(str(err['loc'][0])) if err['loc'] else 'config'}: {err['msg']}" for err in e.errors()
        )
        parser.exit(2, f"{parser.prog}: invalid options:\n{problems}\n")
    try:
        return cfg.with_prompts(), ns.summary_json
    except ValueError as e:
        parser.exit(2, f"{parser.prog}: invalid options:\n  {e}\n")


def main(argv: list[str] | None = None) -> int:
    cfg, summary_json = parse_args(argv)
    configure_process()
    from index_format.manifest import IndexMismatch
    from index_format.store import StoreError

    from .build import build_index, shutdown_ray
    from .corpus import CorpusError

    try:
        summary = build_index(cfg)
    except (CorpusError, IndexMismatch, FileExistsError, StoreError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        shutdown_ray()
    print(summary.render())
    if summary_json is not None:
        summary_json.write_text(json.dumps(summary.as_dict(), indent=2))
    return 0
