"""Ranking models under an index root (index_format.rankers): publish, the activation rule, compare-and-swap,
rollback, in a folder and in object storage."""

from __future__ import annotations

import json
import threading

import pytest

from index_format.rankers import (
    RankerError,
    activate_ranker,
    active_ranker,
    list_rankers,
    publish_ranker,
    ranker_state,
    read_ranker,
    rollback_ranker,
)


def model_folder(tmp_path, model_id: str, text: str = "tree\n"):
    folder = tmp_path / model_id
    folder.mkdir()
    (folder / "model.txt").write_text(text)
    (folder / "ranker.json").write_text(json.dumps({"id": model_id, "features": ["fused_rank"]}))
    return folder


def won(model_id, served=None, model_ndcg=0.6, served_ndcg=0.5):
    """A comparison as ``relevance.rankers.compare`` makes it, the guard's verdict from 50 queries that each gained
    (or lost) the same."""
    from relevance.guard import decide

    gain = model_ndcg - served_ndcg
    verdict = decide({f"q{i}": 0.3 + gain for i in range(50)}, {f"q{i}": 0.3 for i in range(50)})
    return {"model": model_id, "served": served, "queries": 50, "model_ndcg": model_ndcg, "served_ndcg": served_ndcg,
            "guard": verdict}


@pytest.fixture(params=["folder", "s3"])
def root(request, tmp_path):
    if request.param == "folder":
        return str(tmp_path / "root")
    return request.getfixturevalue("s3_root")


def test_publish_list_read(root, tmp_path):
    assert list_rankers(root) == [] and active_ranker(root) is None
    assert publish_ranker(root, model_folder(tmp_path, "a")) == "a"
    assert publish_ranker(root, model_folder(tmp_path, "b")) == "b"
    assert publish_ranker(root, tmp_path / "a") == "a"  # again: nothing changes
    assert list_rankers(root) == ["a", "b"]
    description, text = read_ranker(root, "a")
    assert description["id"] == "a" and text == "tree\n"
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.txt").write_text("another tree\n")
    (other / "ranker.json").write_text(json.dumps({"id": "a", "features": []}))
    with pytest.raises(RankerError, match="another ranking model is published as 'a'"):
        publish_ranker(root, other)
    with pytest.raises(RankerError, match="published: a, b"):
        read_ranker(root, "c")
    with pytest.raises(RankerError, match="not valid"):
        read_ranker(root, "../versions")


def test_activation_needs_a_winning_comparison_against_what_is_served(root, tmp_path):
    for m in ("a", "b"):
        publish_ranker(root, model_folder(tmp_path, m))
    with pytest.raises(RankerError, match="no comparison"):
        activate_ranker(root, "a", None)
    with pytest.raises(RankerError, match=r"nDCG@10 gain -0.1000 on 50 held-out queries is within chance"):
        activate_ranker(root, "a", won("a", model_ndcg=0.4))
    with pytest.raises(RankerError, match=r"gain \+0.0000 on 50 held-out queries is within chance"):
        activate_ranker(root, "a", won("a", model_ndcg=0.5))  # a tie is no gain
    without = won("a")
    del without["guard"]
    with pytest.raises(RankerError, match="no verdict of the guard"):
        activate_ranker(root, "a", without)
    assert active_ranker(root) is None
    assert activate_ranker(root, "a", won("a")) is None
    assert active_ranker(root) == "a"
    with pytest.raises(RankerError, match="compare again"):  # compared against no model, but a is served now
        activate_ranker(root, "b", won("b"))
    assert activate_ranker(root, "b", won("b", served="a")) == "a"
    state, _ = ranker_state(root)
    assert [e["model"] for e in state["history"]] == ["a", "b"]
    assert state["history"][-1]["comparison"]["served"] == "a"


def test_rollback_and_off(root, tmp_path):
    with pytest.raises(RankerError, match="no earlier"):
        rollback_ranker(root)
    for m in ("a", "b"):
        publish_ranker(root, model_folder(tmp_path, m))
    activate_ranker(root, "a", won("a"))
    activate_ranker(root, "b", won("b", served="a"))
    assert rollback_ranker(root) == ("b", "a") and active_ranker(root) == "a"
    assert activate_ranker(root, None, None) == "a" and active_ranker(root) is None  # off: always allowed
    assert rollback_ranker(root) == (None, "a") and active_ranker(root) == "a"  # and back in one call


def test_concurrent_activations_never_lose_an_entry(tmp_path):
    root = str(tmp_path / "root")
    ids = [f"m{i}" for i in range(6)]
    for m in ids:
        publish_ranker(root, model_folder(tmp_path, m))
    activate_ranker(root, None, None)
    errors = []

    def go(m):
        try:
            activate_ranker(root, m, None, rollback=True)  # the rule aside: only the swap is under test
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=go, args=(m,)) for m in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    state, _ = ranker_state(root)
    history = state["history"]
    assert sorted(e["model"] for e in history) == ids
    # Each activation names the one before it: one chain, no entry written over another.
    assert [e["previous"] for e in history] == [None] + [e["model"] for e in history[:-1]]
