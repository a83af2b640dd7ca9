"""The ONNX query encoder against sentence-transformers: the same vectors from the same weights."""

from __future__ import annotations

import numpy as np
import pytest

from index_format.encoders import OnnxEncoder, load_encoder
from index_format.prompts import EncoderSpec

TEXTS = [
    "What is the role of p53 in apoptosis of cancer cells?",
    "0-dimensional biomaterials show inductive properties.",
    "a",
    "Ünïcode, punctuation -- and [brackets]!",
    "lucene shard replica " * 150,  # past max_seq_length: truncated like sentence-transformers does
]


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    import os

    cache = tmp_path_factory.mktemp("onnx-cache")
    old = os.environ.get("RAYSEARCH_CACHE")
    os.environ["RAYSEARCH_CACHE"] = str(cache)
    try:
        onnx = load_encoder("all-MiniLM-L6-v2", backend="onnx")
    finally:
        if old is None:
            os.environ.pop("RAYSEARCH_CACHE")
        else:
            os.environ["RAYSEARCH_CACHE"] = old
    return onnx, load_encoder("all-MiniLM-L6-v2", backend="torch"), cache


def test_onnx_vectors_equal_sentence_transformers(encoders):
    onnx, torch_encoder, _ = encoders
    assert isinstance(onnx, OnnxEncoder) and onnx.dimension == torch_encoder.dimension == 384
    a, b = onnx.encode(TEXTS), torch_encoder.encode(TEXTS)
    assert a.dtype == np.float32 and a.shape == b.shape
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert (a * b).sum(axis=1).min() > 0.99999
    assert np.abs(a - b).max() < 1e-4


def test_batches_and_single_queries_agree(encoders):
    onnx, _, _ = encoders
    one_by_one = np.stack([onnx.encode([t])[0] for t in TEXTS])
    assert np.abs(onnx.encode(TEXTS, batch_size=2) - one_by_one).max() < 1e-5


def test_the_export_is_cached_by_content(encoders, monkeypatch):
    _, _, cache = encoders
    exported = list(cache.glob("onnx/*/model.onnx"))
    assert len(exported) == 1
    stamp = exported[0].stat().st_mtime_ns
    monkeypatch.setenv("RAYSEARCH_CACHE", str(cache))
    load_encoder("all-MiniLM-L6-v2", backend="onnx")
    assert [p.stat().st_mtime_ns for p in cache.glob("onnx/*/model.onnx")] == [stamp]


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend"):
        load_encoder("all-MiniLM-L6-v2", backend="tensorrt")


def test_int8_is_close_and_opt_in(encoders, monkeypatch):
    onnx, _, cache = encoders
    monkeypatch.setenv("RAYSEARCH_CACHE", str(cache))
    int8 = load_encoder("all-MiniLM-L6-v2", backend="onnx-int8")
    assert list(cache.glob("onnx/*/model-int8.onnx"))
    a, b = int8.encode(TEXTS), onnx.encode(TEXTS)
    cosine = (a * b).sum(axis=1)
    assert cosine.min() > 0.97 and cosine.max() < 0.99999  # close, and not the fp32 model


def test_the_routers_encoder_embeds_queries_at_once_on_its_threads():
    """Two forward passes at once (``encoder_router_threads: 2``) on one session give each query its own
    vector: the vector it gets embedded alone. The torch backend, whose tokenizer is not safe to share
    between threads, keeps one."""
    import asyncio
    import threading

    from deployments.serve.handles import LocalEncoder

    local = LocalEncoder(EncoderSpec("all-MiniLM-L6-v2"), "onnx", threads=2)
    queries = [f"{t} {i}" for i in range(12) for t in TEXTS[:4]]
    alone = np.stack([local.encoder.encode([q])[0] for q in queries])
    threads: set[str] = set()
    encode = local.encoder.encode

    def traced(texts, *args, **kwargs):
        threads.add(threading.current_thread().name)
        return encode(texts, *args, **kwargs)

    local.encoder.encode = traced

    async def together():
        return await asyncio.gather(*(local.embed(q) for q in queries))

    assert np.abs(np.stack(asyncio.run(together())) - alone).max() < 1e-6
    assert len(threads) == 2
    assert LocalEncoder(EncoderSpec("all-MiniLM-L6-v2"), "torch", threads=2).worker._max_workers == 1


def test_a_folder_saved_by_this_sentence_transformers_encodes_as_torch(encoders, tmp_path, monkeypatch):
    """What relevance.train_encoder writes (``model.save``): its pooling and length limit are kept where this
    sentence-transformers keeps them (one ``pooling_mode``; the tokenizer's model_max_length), so ONNX truncates
    and pools as torch does, also for a text past the limit."""
    from index_format.encoders import _pooling_of

    _, torch_encoder, _ = encoders
    saved = tmp_path / "saved"
    torch_encoder.model.save(str(saved))
    assert _pooling_of(saved) == ("mean", torch_encoder.model.max_seq_length)
    monkeypatch.setenv("RAYSEARCH_CACHE", str(tmp_path / "cache"))
    onnx = load_encoder(str(saved), backend="onnx")
    assert (onnx.encode(TEXTS) * torch_encoder.encode(TEXTS)).sum(axis=1).min() > 0.99999


def test_named_encoders_load_on_first_use(tmp_path):
    """In the router, a collection's own query encoder is loaded when the app starts; a named one (a version's
    second encoder, or a ranking model's fold encoders, which no served query uses) only when a request first needs
    it, and then embeds as the one loaded at once does. A named encoder that is also a collection's own is loaded."""
    import asyncio

    from deployments.serve.handles import LocalEncoder, deployed_collections
    from deployments.serve.specs import CollectionSpec

    own, named = EncoderSpec("all-MiniLM-L6-v2"), EncoderSpec("all-MiniLM-L6-v2", query_prompt="query: ")
    specs = {"a": CollectionSpec("a", "v1", [], own, 384, str(tmp_path), named_encoders={"fold0": (named, None)})}
    deployed = deployed_collections(specs)
    assert deployed["a"].encoder.loaded
    lazy = deployed["a"].named["fold0"][1]
    assert isinstance(lazy, LocalEncoder) and not lazy.loaded and lazy.encoder is None
    got = asyncio.run(lazy.embed(TEXTS[0]))
    assert lazy.loaded
    assert np.abs(got - LocalEncoder(named, "onnx").encoder.encode([TEXTS[0]], prompt="query: ")[0]).max() < 1e-6
    both = {"a": specs["a"], "b": CollectionSpec("b", "v1", [], named, 384, str(tmp_path))}
    assert deployed_collections(both)["a"].named["fold0"][1].loaded  # b's own encoder: loaded at start
