import subprocess
import sys

import pytest

from index_build.cli import config_from_args
from index_build.config import BuildConfig, FaissIndexType


def test_contract_flags_with_defaults(tmp_path):
    cfg = config_from_args(["--corpus", "c.jsonl", "--out", str(tmp_path), "--shards", "3"])
    assert cfg.shards == 3 and cfg.faiss_index is FaissIndexType.auto and cfg.encoder == "all-MiniLM-L6-v2"


def test_yaml_then_flags_override(tmp_path):
    f = tmp_path / "build.yaml"
    f.write_text("corpus: c.jsonl\nout: idx\nshards: 2\nfaiss_index: hnsw\nprepend_title: false\n")
    cfg = config_from_args(["--config", str(f), "--shards", "5", "--prepend-title"])
    assert (cfg.shards, cfg.faiss_index, cfg.prepend_title) == (5, FaissIndexType.hnsw, True)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--corpus", "c", "--out", "o", "--shards", "0"], "--shards: Input should be greater than or equal to 1"),
        (["--corpus", "c", "--out", "o", "--chunk-size", "10", "--chunk-overlap", "10"], "must be smaller"),
        (["--out", "o"], "give --corpus (the whole corpus), or --changes"),
    ],
)
def test_invalid_options_exit_2_with_the_rule(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        config_from_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_yaml_key_is_refused(tmp_path, capsys):
    f = tmp_path / "b.yaml"
    f.write_text("corpus: c\nout: o\nshard: 3\n")
    with pytest.raises(SystemExit):
        config_from_args(["--config", str(f)])
    assert "--shard: Extra inputs are not permitted" in capsys.readouterr().err


def test_help_lists_every_option():
    out = subprocess.run([sys.executable, "-m", "index_build", "--help"], capture_output=True, text=True, check=True).stdout
    for name in BuildConfig.model_fields:
        assert "--" + name.replace("_", "-") in out


def test_build_key_ignores_where_and_how_fast_but_not_what():
    base = BuildConfig(corpus="c.jsonl", out="a")
    assert base.build_key("x") == BuildConfig(corpus="c.jsonl", out="b", embed_actors=4).build_key("x")
    assert base.build_key("x") != BuildConfig(corpus="c.jsonl", out="a", chunk_size=64).build_key("x")
    assert base.build_key("x") != base.build_key("y")
