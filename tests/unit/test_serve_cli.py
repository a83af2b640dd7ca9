"""``python -m deployments``'s flags are generated from ``AppConfig``: every field is a flag named by its place in
the config (``shards.num_replicas`` is ``--shards.num-replicas``), the defaults are the model's, ``--config``
reads the same file ``serve run`` does with flags over it, and a bad value is refused naming its flag. Parsing
only: no Ray."""

from __future__ import annotations

import enum
import types
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, TypeAdapter

from deployments.__main__ import absolute_indexes, parse_args, parser
from deployments.cli import is_section
from deployments.config import AppConfig

ROOT = Path(__file__).parents[2]
DIGEST = "ab" * 32


def leaves(model: type[BaseModel] = AppConfig, prefix: str = ""):
    """(dotted path, field info) of every field that holds a value rather than a section."""
    for name, info in model.model_fields.items():
        annotation = _unoptional(info.annotation)
        if is_section(annotation, info):
            yield from leaves(annotation, f"{prefix}{name}.")
        else:
            yield prefix + name, info


def _unoptional(annotation):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return args[0] if union and len(args) == 1 else annotation


def flag(path: str) -> str:
    return "--" + path.replace("_", "-")


def get(cfg: BaseModel, path: str):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


# Values the rule in other_value cannot make: the digests' format, a dict of lists, a pattern, sizes, groups.
OTHER = {"security.api_key_digests": [DIGEST], "security.admin_key_digests": [DIGEST],
         "security.write_key_digests": [DIGEST], "security.key_principals": {DIGEST: ["tenant-a"]},
         "router.synonyms": {"gzip": ["deflate"]}, "shards.lucene_heap": "1g",
         "shards.label_selector": {"zone": "a"}, "shards.groups": {0: {"resources": {"node_b": 1.0}}},
         "shards.memory_per_replica": "auto", "shards.memory_base": "2GiB",
         "security.key_limit": {"requests_per_s": 2.0, "burst": 4, "max_inflight": 2},
         "shards.autoscaling": {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 4.0},
         "router.autoscaling": {"min_replicas": 2, "max_replicas": 4},
         "security.key_limits": {DIGEST: {"requests_per_s": 1.0, "burst": 1, "max_inflight": 1}}}


def other_value(path: str, info):
    """A valid value of the field that is not its default."""
    default, annotation = info.get_default(call_default_factory=True), _unoptional(info.annotation)
    if path in OTHER:
        return OTHER[path]
    if annotation is bool:
        return not default
    if typing.get_origin(annotation) is typing.Literal:
        return next(c for c in typing.get_args(annotation) if c != default)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return next(m.value for m in annotation if m != default)
    if annotation is int:
        return 3 if default is None else default + 1
    if annotation is float:
        return default / 2 if default else 0.5
    if typing.get_origin(annotation) is dict:
        return {"search_node": 1.0}
    return "elsewhere"


def argv_for(path: str, value) -> list[str]:
    if isinstance(value, bool):
        return [flag(path)] if value else ["--no-" + flag(path)[2:]]
    if isinstance(value, list):
        return [flag(path), *map(str, value)]
    if isinstance(value, dict):
        return [flag(path), yaml.safe_dump(value, default_flow_style=True).strip()]
    return [flag(path), str(value)]


@pytest.mark.parametrize("path, info", list(leaves()), ids=[p for p, _ in leaves()])
def test_every_field_of_the_config_is_a_flag_named_by_its_place(path, info):
    base = [] if path == "collections" else ["--index", "ROOT"]  # collections replaces the index shorthand
    value = {"default": {"index": "ROOT"}} if path == "collections" else other_value(path, info)
    cfg, _ = parse_args(base + argv_for(path, value))
    assert get(cfg, path) == TypeAdapter(info.annotation).validate_python(value)
    assert get(cfg, path) != info.get_default(call_default_factory=True)


def test_the_flags_given_none_the_config_is_the_models_defaults():
    cfg, args = parse_args(["--index", "ROOT"])
    assert cfg == AppConfig(index="ROOT")
    _, paths = parser()
    assert all(getattr(args, path) is None for path in paths if path != "index")  # none of argparse's own


def test_each_flags_help_is_its_fields_description_and_names_its_default():
    ap, paths = parser()
    helps = {a.dest: a.help for a in ap._actions}
    assert set(paths) == {path for path, _ in leaves()}
    for path, info in leaves():
        description = " ".join((info.description or "").split())
        assert description and helps[path].startswith(description.replace("%", "%%")), path
        assert "default:" in helps[path], path
    assert helps["shards.num_cpus"].endswith("(default: 0.25)")
    assert helps["router.fusion"].endswith("(default: weighted)")
    assert helps["shards.verify_checksums"].endswith("(default: true)")
    assert helps["reranker.model"].endswith("(default: null)")
    assert helps["router.synonyms"].endswith("(default: {})")


def test_config_file_then_flags_over_it(tmp_path):
    f = tmp_path / "app.yaml"
    f.write_text("index: ROOT\nshards: {num_replicas: 2, num_cpus: 0.5}\nrouter: {fusion: rrf, cache_size: 10}\n")
    cfg, _ = parse_args(["--config", str(f), "--shards.num-replicas", "3", "--router.cache-size", "0"])
    assert cfg == AppConfig(index="ROOT", shards={"num_replicas": 3, "num_cpus": 0.5},
                            router={"fusion": "rrf", "cache_size": 0})


def test_the_serve_config_file_is_read_as_serve_run_reads_it():
    cfg, _ = parse_args(["--config", str(ROOT / "serve_config.yaml"), "--index", "other", "--no-synthesis.enabled"])
    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    args["index"], args["synthesis"]["enabled"] = "other", False
    assert cfg == AppConfig.model_validate(args)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shards.num-replicas", "0"], "--shards.num-replicas: Input should be greater than or equal to 1 (given: 0)"),
        (["--shards.num-replicas", "two"], "argument --shards.num-replicas: invalid int value: 'two'"),
        (["--router.fusion", "borda"], "argument --router.fusion: invalid choice: 'borda'"),
        (["--router.dense-weight", "1.5"], "--router.dense-weight: Input should be less than or equal to 1"),
        (["--router.synonyms", "{gzip: [deflate"], "argument --router.synonyms: not a YAML value"),
        (["--security.api-key-digests", "sk-123"], "--security.api-key-digests: api_key_digests holds SHA-256"),
        (["--reranker.autoscaling.min-replicas", "3"], "reranker.autoscaling: min_replicas 3 > max_replicas 2"),
        (["--shard-num-replicas", "2"], "unrecognized arguments: --shard-num-replicas"),  # an old name
    ],
)
def test_a_bad_value_exits_2_naming_its_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--index", "ROOT", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_key_in_the_file_is_named_as_the_file_names_it(tmp_path, capsys):
    f = tmp_path / "app.yaml"
    f.write_text("index: ROOT\nshards: {num_replica: 2}\n")
    with pytest.raises(SystemExit) as e:
        parse_args(["--config", str(f)])
    assert e.value.code == 2 and "shards.num_replica: Extra inputs are not permitted" in capsys.readouterr().err


def test_index_paths_are_made_absolute_where_they_were_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_indexes(parse_args(["--index", "idx"])[0]).index == str(tmp_path / "idx")
    cfg = absolute_indexes(parse_args(["--collections", "{a: {index: idx, version: v1}}", "--default-collection",
                                       "a"])[0])
    assert cfg.collections["a"].index == str(tmp_path / "idx") and cfg.collections["a"].version == "v1"
    assert absolute_indexes(parse_args(["--index", "s3://bucket/idx"])[0]).index == "s3://bucket/idx"  # a URL as it is
