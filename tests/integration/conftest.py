"""Builds shared by the integration tests: one corpus with bad lines, built with 1 and 3 shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from index_build.build import build_index
from index_build.config import BuildConfig
from index_build.corpus import Document
from index_format.chunking import chunk_document
from tests.conftest import make_corpus, write_jsonl

ENCODER = "hashing:64"
BAD_LINES = ["{broken json", json.dumps({"title": "no id", "text": "x"}), json.dumps({"_id": "d000", "text": "dup"})]


def oracle_chunks(docs: list[dict], cfg: BuildConfig):
    """Chunks computed straight from the records, independently of the build's tables."""
    out = []
    for d in docs:
        doc = Document(d["_id"], d["title"], d["text"], d.get("metadata", {}))
        out.extend(chunk_document(doc, cfg.chunk_size, cfg.chunk_overlap))
    return out



def shard_dirs(summary) -> list[Path]:
    return sorted((summary.version_dir / "shards").iterdir())


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> tuple[Path, list[dict]]:
    docs = make_corpus(60)
    lines = [json.dumps(d) for d in docs]
    lines[10:10] = BAD_LINES[:2]
    lines.append(BAD_LINES[2])
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", lines), docs


@pytest.fixture(scope="session")
def built(corpus, ray_local, tmp_path_factory):
    path, docs = corpus
    out = {}
    for shards in (1, 3):
        cfg = BuildConfig(corpus=path, out=tmp_path_factory.mktemp(f"idx{shards}"), shards=shards, encoder=ENCODER,
                          chunk_size=40, chunk_overlap=8, progress=False)
        out[shards] = (cfg, build_index(cfg))
    return out


