import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytest import approx

from deployments.search.fusion import (
    candidate_depth,
    is_flat,
    min_max,
    relevance_scores,
    rrf,
    weighted,
)
from deployments.search.hits import Hit, best, scores_by_key
from deployments.search.retrieval import leg_scores


def run(*pairs, shard=-1):
    return [Hit(cid, score, shard) for cid, score in pairs]


BM25 = run(("a", 12.0), ("b", 9.0), ("c", 3.0), shard=0)
DENSE = run(("b", 0.9), ("d", 0.8), ("a", 0.5), shard=1)


def scores(hits):
    return {h.chunk_id: h.score for h in hits}


def test_rrf_golden():
    fused = rrf([BM25, DENSE])
    assert [h.chunk_id for h in fused] == ["b", "a", "d", "c"]
    assert scores(fused) == approx({
        "a": 1 / 61 + 1 / 63,
        "b": 1 / 62 + 1 / 61,
        "c": 1 / 63,
        "d": 1 / 62,
    })


def test_rrf_weights_and_constant():
    fused = rrf([BM25, DENSE], rrf_k=0, weights=[2.0, 1.0])
    assert scores(fused) == approx({"a": 2 / 1 + 1 / 3, "b": 2 / 2 + 1 / 1, "c": 2 / 3, "d": 1 / 2})
    assert [h.chunk_id for h in fused] == ["a", "b", "c", "d"]


def test_rrf_shard_comes_from_first_run_containing_the_chunk():
    fused = {h.chunk_id: h.shard for h in rrf([BM25, DENSE])}
    assert fused == {"a": 0, "b": 0, "c": 0, "d": 1}


def test_rrf_ties_break_by_chunk_id():
    # z and y are each first in one run: equal scores 1/61, so chunk id ascending decides.
    fused = rrf([run(("z", 5.0)), run(("y", 1.0))])
    assert [h.chunk_id for h in fused] == ["y", "z"]
    assert fused[0].score == fused[1].score == approx(1 / 61)


def test_rrf_ignores_run_scores():
    assert scores(rrf([run(("a", 1e9), ("b", -5.0))])) == approx({"a": 1 / 61, "b": 1 / 62})


def test_weighted_golden():
    # BM25 normalized: a (12-3)/9 = 1, b (9-3)/9 = 2/3, c 0. Dense: b 1, d (0.8-0.5)/0.4 = 3/4, a 0.
    fused = weighted([BM25, DENSE], [0.25, 0.75])
    assert scores(fused) == approx({
        "a": 0.25 * 1 + 0.75 * 0,
        "b": 0.25 * (2 / 3) + 0.75 * 1,
        "c": 0.25 * 0,
        "d": 0.75 * (3 / 4),
    })
    assert [h.chunk_id for h in fused] == ["b", "d", "a", "c"]
    assert {h.chunk_id: h.shard for h in fused} == {"a": 0, "b": 0, "c": 0, "d": 1}


def test_weighted_needs_one_weight_per_run():
    with pytest.raises(ValueError, match="2 weights for 3 runs"):
        weighted([BM25, DENSE, BM25], [0.5, 0.5])
    with pytest.raises(ValueError, match="1 weights for 2 runs"):
        rrf([BM25, DENSE], weights=[1.0])


FUSERS = {
    "rrf": lambda runs: rrf(runs),
    "weighted": lambda runs: weighted(runs, [1.0] * len(runs)),
}


@pytest.mark.parametrize("fuse", FUSERS.values(), ids=FUSERS.keys())
def test_no_runs_and_empty_runs(fuse):
    assert fuse([]) == []
    assert fuse([[], []]) == []


@pytest.mark.parametrize("fuse", FUSERS.values(), ids=FUSERS.keys())
def test_one_empty_run_is_the_other_run(fuse):
    alone = fuse([BM25])
    assert fuse([BM25, []]) == alone
    assert [h.chunk_id for h in alone] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # Ranks after removing the later copy of a: a 1, b 2. The second "a" must not count.
        ("rrf", {"a": 1 / 61, "b": 1 / 62}),
        # First occurrences a 4, b 2 -> (s - 2) / 2. The duplicate a=1 must not lower the minimum.
        ("weighted", {"a": 1.0, "b": 0.0}),
    ],
)
def test_duplicates_within_a_run_count_once(mode, expected):
    dup = run(("a", 4.0), ("a", 1.0), ("b", 2.0))
    fused = FUSERS[mode]([dup])
    assert [h.chunk_id for h in fused] == ["a", "b"]
    assert scores(fused) == approx(expected)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("rrf", {"c": 1 / 61, "a": 1 / 62, "b": 1 / 63}),
        ("weighted", {"a": 1.0, "b": 1.0, "c": 1.0}),
    ],
)
def test_all_equal_scores(mode, expected):
    flat = run(("c", 0.5), ("a", 0.5), ("b", 0.5))
    fused = FUSERS[mode]([flat])
    assert scores(fused) == approx(expected)
    # rrf keeps the run's order; weighted gives every member 1.0, so chunk id ascending decides.
    assert [h.chunk_id for h in fused] == (["c", "a", "b"] if mode == "rrf" else ["a", "b", "c"])


def test_min_max():
    out = min_max(run(("a", 3.0), ("b", 1.0), ("c", 2.0)))
    assert [(h.chunk_id, h.score) for h in out] == [("a", approx(1.0)), ("b", approx(0.0)), ("c", approx(0.5))]
    assert [h.score for h in min_max(run(("a", 7.0), ("b", 7.0)))] == [1.0, 1.0]
    assert [h.score for h in min_max(run(("a", -3.0)))] == [1.0]
    assert min_max([]) == []


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(0, 50), (10, 50), (12, 50), (13, 52), (100, 400), (250, 1000), (10_000, 1000)],
)
def test_candidate_depth(limit, expected):
    assert candidate_depth(limit) == expected


def test_candidate_depth_knobs_and_bad_limit():
    assert candidate_depth(5, base=1, factor=3, cap=100) == 3 * 5
    assert candidate_depth(5, base=20, factor=3, cap=10) == 10
    with pytest.raises(ValueError):
        candidate_depth(-1)


@pytest.mark.parametrize(
    ("hit_scores", "expected"),
    [
        ([10.0, 9.6, 9.5], True),  # spread 0.5 <= 0.05 * 10
        ([10.0, 9.6, 9.4], False),  # spread 0.6 > 0.5
        ([9.4, 10.0, 9.6], False),  # input order does not matter
        ([-1.0, -1.04], True),  # |best| is used: 0.04 <= 0.05
        ([0.0, 0.0], True),
        ([0.0, -0.01], False),
        ([3.0], False),
        ([], False),
    ],
)
def test_is_flat(hit_scores, expected):
    assert is_flat([Hit(f"c{i}", s) for i, s in enumerate(hit_scores)]) is expected


def test_is_flat_only_looks_at_the_top():
    hits = [Hit("a", 10.0), Hit("b", 9.9), Hit("c", 1.0)]
    assert is_flat(hits, top=2)
    assert not is_flat(hits, top=3)


def test_relevance_scores_on_every_scale():
    assert relevance_scores([0.99, 0.5, -0.01, 1.2], "probability") == [0.99, 0.5, 0.0, 1.0]
    assert relevance_scores([1.5, 1.0, 0.0], "weighted", 2.0) == [0.75, 0.5, 0.0]
    assert relevance_scores([0.7, 0.2], "weighted", 1.0) == [0.7, 0.2]  # weights summing to 1: the score itself
    assert relevance_scores([12.0, 9.0, 6.0], "minmax") == [1.0, 0.5, 0.0]  # hand-computed
    assert relevance_scores([3.0, 3.0], "minmax") == [1.0, 1.0] and relevance_scores([], "minmax") == []
    with pytest.raises(ValueError, match="relevance scale"):
        relevance_scores([1.0], "sigmoid")


def test_the_same_chunk_id_in_two_collections_is_two_candidates():
    """A hit is told apart by its key (chunk id, collection): fusing two collections' runs never merges them."""
    a, b = Hit("d1#0", 0.9, 0, "papers"), Hit("d1#0", 0.8, 0, "notes")
    fused = rrf([[a], [b]], rrf_k=60)
    assert [(h.chunk_id, h.collection, h.score) for h in fused] == [("d1#0", "notes", 1 / 61), ("d1#0", "papers", 1 / 61)]
    assert {h.collection for h in weighted([[a, b]], [1.0])} == {"papers", "notes"}
    assert [h.collection for h in min_max([a, b])] == ["papers", "notes"]


def _fused_by_hand(runs, contribution):
    """The fusions' rule written plainly, one hit at a time: each run's first copy of a chunk (by key) counts, its
    contribution added; a candidate keeps the shard of the first run it is in; sorted by (-score, chunk id,
    collection) over Python tuples."""
    scores, first = {}, {}
    for r, run in enumerate(runs):
        seen = []
        for hit in run:
            if hit.key not in seen:
                seen.append(hit.key)
        for rank, key in enumerate(seen, start=1):
            hit = next(h for h in run if h.key == key)
            scores[key] = scores.get(key, 0.0) + contribution(r, run, hit, rank)
            first.setdefault(key, hit)
    return sorted(((k[0], s, first[k].shard, k[1]) for k, s in scores.items()), key=lambda h: (-h[1], h[0], h[3]))


@given(st.lists(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.sampled_from([0.0, 0.5, 1.0, 2.5, -1.0]),
                                   st.integers(0, 2), st.sampled_from(["", "", "notes"])), max_size=12),
                max_size=3),
       st.lists(st.floats(0.1, 2.0), min_size=3, max_size=3))
@settings(max_examples=300, deadline=None)
def test_the_fusions_and_best_equal_the_rule_written_hit_by_hit(raw_runs, raw_weights):
    """Every run sorted best first (as a leg is), with duplicates, tied scores and two collections in one run."""
    runs = [[Hit(*h) for h in sorted(run, key=lambda h: -h[1])] for run in raw_runs]
    weights = raw_weights[:len(runs)]

    def minmax(r, run, hit, rank):
        firsts = list({h.key: h for h in reversed(run)}.values())  # each key's first copy
        lo, hi = min(h.score for h in firsts), max(h.score for h in firsts)
        return weights[r] * ((hit.score - lo) / (hi - lo) if hi > lo else 1.0)

    got = [tuple(h) for h in weighted(runs, weights)]
    want = _fused_by_hand(runs, minmax)
    assert [h[0::2] for h in got] == [h[0::2] for h in want] and [h[1] for h in got] == approx([h[1] for h in want])
    got = [tuple(h) for h in rrf(runs, rrf_k=60, weights=weights)]
    want = _fused_by_hand(runs, lambda r, run, hit, rank: weights[r] / (60 + rank))
    assert [h[0::2] for h in got] == [h[0::2] for h in want] and [h[1] for h in got] == approx([h[1] for h in want])
    every = [h for run in runs for h in run]
    for k in (None, 0, 1, 3):
        by_hand = sorted(every, key=lambda h: (-h.score, h.chunk_id, h.collection))
        assert best(every, k) == (by_hand if k is None else by_hand[:k])


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.floats(-2, 2), st.integers(0, 2), st.sampled_from(["", "notes"])),
                max_size=20),
       st.sets(st.tuples(st.sampled_from("abcdefgh"), st.sampled_from(["", "notes"])), max_size=6))
@settings(max_examples=300, deadline=None)
def test_a_page_s_scores_are_those_of_every_hit_s_for_its_keys(hits, wanted):
    hits = [Hit(*h) for h in hits]  # duplicates, and a key in two collections: a later hit of a key wins
    every = scores_by_key(hits)
    assert scores_by_key(hits, wanted) == {k: s for k, s in every.items() if k in wanted}
    legs = {"a": (hits, hits[::-1]), "b": (hits[:3], [])}
    dense, keyword = leg_scores(legs, wanted)
    assert (dense, keyword) == tuple({k: s for k, s in d.items() if k in wanted} for d in leg_scores(legs))
