"""One vocabulary (README.md, "One vocabulary"): the same thing has the same name in every command and config,
under one spelling (no old names taken), help says each default once, errors go to stderr and usage errors exit
with 2."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

COMMANDS = ["index_build", "index_build.versions", "deployments", "relevance.tune", "relevance.evaluate",
            "relevance.train_encoder", "relevance.train_reranker"]


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    out = {}
    for module in COMMANDS:
        done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        out[module] = done.stdout
    return out


def _options(help_text: str) -> dict[str, str]:
    """Each option's help, joined onto one line."""
    options: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        m = re.match(r"^  (-[-\w]+)", line)
        if m:
            current = m.group(1)
            options[current] = line
        elif current and line.startswith("    "):
            options[current] += " " + line.strip()
        else:
            current = None
    return options


def test_help_says_each_default_once(helps):
    for module, text in helps.items():
        for line in _options(text).values():
            assert line.count("default:") <= 1 and line.count("(default") <= 1, (module, line)
            assert "(default: None)" not in line, (module, line)


def test_the_same_things_have_the_same_flags(helps):
    for module in ("relevance.tune", "relevance.train_encoder", "relevance.train_reranker"):
        assert "--test-split" in helps[module] and "--held-out-share" in helps[module], module
    for module in ("relevance.tune", "relevance.train_encoder", "relevance.train_reranker"):
        assert "--train-split" in helps[module], module
    assert "--test-split" in helps["relevance.evaluate"]
    assert "--shards.num-replicas" in helps["deployments"] and "--synthesis.num-replicas" in helps["deployments"]
    for module in ("deployments", "relevance.train_encoder", "relevance.train_reranker"):
        assert "--index ROOT" in helps[module], module
    assert "--out ROOT" in helps["index_build"]
    for module, text in helps.items():  # the old names are gone
        for old in ("--shard-replicas", "--reranker-replicas", "--held-out ", "--split "):
            assert old not in text, (module, old)


def test_usage_errors_exit_2_and_failures_1_on_stderr(tmp_path):
    bad_flag = subprocess.run([sys.executable, "-m", "index_build.versions", "list"], capture_output=True, text=True)
    assert bad_flag.returncode == 2 and "ROOT" in bad_flag.stderr
    failed = subprocess.run([sys.executable, "-m", "index_build.versions", "activate", str(tmp_path), "nope"],
                            capture_output=True, text=True)
    assert failed.returncode == 1 and failed.stderr.startswith("error:") and not failed.stdout
    bad_value = subprocess.run([sys.executable, "-m", "deployments", "--index", str(tmp_path),
                                "--shards.num-replicas", "0"], capture_output=True, text=True, timeout=120)
    assert bad_value.returncode == 2 and "error:" in bad_value.stderr and not bad_value.stdout
