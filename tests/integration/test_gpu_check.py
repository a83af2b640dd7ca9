"""bench.gpu_check, the script a GPU machine runs once, checked here before it travels: its dry run (every
section at tiny sizes, the GPU side on CPU) in a process where the packages that machine lacks cannot be
imported, from the packed model it will carry; and that packed model (float16 weights) encodes as the
installed float32 one does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.gpu_check import PACK_RECORD, SECTIONS, WEIGHTS, pack
from index_format.encoders import SentenceTransformerEncoder, resolve_model_path

ROOT = Path(__file__).parents[2]
ABSENT_THERE = ("ray", "faiss", "pyserini", "jnius", "pydantic", "fastapi")
TEXTS = ["What is the role of p53 in apoptosis of cancer cells?", "a", "lucene shard replica " * 150]


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("carry") / "minilm-fp16"
    pack(out)
    return out


def test_the_packed_model_is_half_the_weights_and_encodes_alike(packed):
    original = Path(resolve_model_path("all-MiniLM-L6-v2"))
    assert (packed / WEIGHTS).stat().st_size < 0.51 * (original / WEIGHTS).stat().st_size
    assert json.loads((packed / PACK_RECORD).read_text())["weights"] == "float16"
    fp32 = SentenceTransformerEncoder("all-MiniLM-L6-v2").encode(TEXTS)
    fp16 = SentenceTransformerEncoder(str(packed)).encode(TEXTS)  # loaded as it travels, in float16
    assert (np.sum(fp32 * fp16, axis=1) > 0.999).all()


def test_the_dry_run_measures_every_section_without_the_service_packages(packed, tmp_path):
    out = tmp_path / "out"
    argv = ["bench.gpu_check", "--dry-run", "--model", str(packed), "--out", str(out)]
    code = (f"import sys, runpy; [sys.modules.__setitem__(m, None) for m in {ABSENT_THERE!r}]; "
            f"sys.argv = {argv!r}; runpy.run_module('bench.gpu_check', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "gpu_check.json").read_text())
    assert record["dry_run"] and record["model"]["run_weights"].startswith("float16 on disk")
    assert list(record["sections"]) == list(SECTIONS)
    for name, section in record["sections"].items():
        assert not section.get("error"), f"{name}: {section.get('error')}"
        assert section["rows"] and all(r["value"] > 0 for r in section["rows"]), name
        assert all(c["ok"] for c in section["checks"]), section["checks"]
    assert {name for name, s in record["sections"].items() if s["checks"]} == {"embedding", "queries", "reranker",
                                                                               "dense"}
    assert record["verdict"] == {"errors": [], "failed_checks": []}
    table = (out / "gpu_check.md").read_text()
    assert all(f"| {name} |" in table for name in SECTIONS) and "| NO |" not in table
