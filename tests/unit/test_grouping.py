"""Grouping and near-duplicate removal on hand-made rankings, where the answer is read off the input."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.search.grouping import group_hits, without_near_duplicates
from deployments.search.hits import Hit


def hits(*ids: str) -> list[Hit]:
    return [Hit(cid, 1.0 - i / 10) for i, cid in enumerate(ids)]


def test_groups_keep_their_best_hits_at_the_rank_of_the_first():
    ranking = hits("a#0", "b#0", "a#1", "c#0", "a#2", "b#1")
    keys = ["a", "b", "a", "c", "a", "b"]
    two = group_hits(ranking, keys, 2)
    assert [[h.chunk_id for h in g.hits] for g in two] == [["a#0", "a#1"], ["b#0", "b#1"], ["c#0"]]
    assert [g.found for g in two] == [3, 2, 1]  # a#2 fell in group a, not kept
    assert [[h.chunk_id for h in g.hits] for g in group_hits(ranking, keys, 1)] == [["a#0"], ["b#0"], ["c#0"]]


def test_a_hit_without_a_key_stands_alone_and_nothing_groups_to_nothing():
    groups = group_hits(hits("x", "y", "z"), [None, "k", None], 3)
    assert [[h.chunk_id for h in g.hits] for g in groups] == [["x"], ["y"], ["z"]]
    assert group_hits([], [], 1) == []
    with pytest.raises(ValueError, match="one key per hit"):
        group_hits(hits("x"), [], 1)


def test_near_duplicates_are_dropped_greedily_in_rank_order():
    # a and b 0.995 apart in cosine; c orthogonal to a; d is b's exact copy, scaled (cosine 1).
    theta = np.arccos(0.995)
    vectors = np.array([[1, 0], [np.cos(theta), np.sin(theta)], [0, 1], 3 * np.array([np.cos(theta), np.sin(theta)])])
    ranking = hits("a", "b", "c", "d")
    assert [h.chunk_id for h in without_near_duplicates(ranking, vectors, 0.99)] == ["a", "c"]
    # above 0.995 b is kept, and d (b's copy) goes: the better-ranked copy stays
    assert [h.chunk_id for h in without_near_duplicates(ranking, vectors, 0.999)] == ["a", "b", "c"]
    assert [h.chunk_id for h in without_near_duplicates(ranking, vectors, 1.0)] == ["a", "b", "c"]
    assert without_near_duplicates([], np.zeros((0, 2)), 0.9) == []


def test_spans_mark_the_words_whose_terms_meet_the_querys():
    from deployments.search.highlights import Highlighter, spans

    def stem(text: str) -> list[str]:  # a toy analyzer: lower case, "the" a stopword, a trailing "s" cut
        return [w.removesuffix("s") for w in text.lower().split() if w != "the"]

    text = "The Stars and the star's light, stars!"
    marked = spans(text, {"star"}, stem)
    assert [text[a:b] for a, b in marked] == ["Stars", "stars"]  # "star's" analyzes to "star's": not a match
    assert spans(text, set(), stem) == []
    calls = []
    h = Highlighter(lambda w: calls.append(w) or stem(w))
    assert h.spans("the stars", [text, "no match here"]) == [marked, []]
    assert calls.count("stars") == 1 and calls.count("The") == 1  # each word analyzed once
