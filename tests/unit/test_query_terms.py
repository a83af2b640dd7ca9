"""A long query's keyword terms bounded (deployments.shard.query.bounded_terms): its rarest distinct terms kept,
the same on every shard, with every occurrence, in the query's order."""

from __future__ import annotations

from deployments.shard.query import MAX_QUERY_CLAUSES, bounded_terms


def test_a_short_query_is_searched_as_it_is():
    df = {"a": 5, "b": 1}.get
    assert bounded_terms(["a", "b", "a", "zzz"], lambda t: df(t, 0)) == (["a", "b", "a", "zzz"], 2, 2)


def test_past_the_limit_the_rarest_terms_stay_with_every_occurrence():
    terms = [f"t{i}" for i in range(MAX_QUERY_CLAUSES + 10)]
    df = {t: 1 + i % 7 for i, t in enumerate(terms)}  # rare: df 1, common: df 7
    query = terms + ["t0", "unseen", "t0"]
    kept, searched, distinct = bounded_terms(query, lambda t: df.get(t, 0))
    assert (searched, distinct) == (MAX_QUERY_CLAUSES, MAX_QUERY_CLAUSES + 10)
    # Hand-made: ranked by (df, first place in the query), the first 1,024 kept.
    expected = {t for _, _, t in sorted((df[t], i, t) for i, t in enumerate(terms))[:MAX_QUERY_CLAUSES]}
    assert set(kept) == expected and kept.count("t0") == 3 and "unseen" not in kept
    assert kept == [t for t in query if t in expected]  # the query's order


def test_with_two_fields_half_as_many_terms_fit():
    terms = [f"t{i}" for i in range(600)]
    kept, searched, distinct = bounded_terms(terms, lambda t: 3, fields=2)
    assert (searched, distinct) == (MAX_QUERY_CLAUSES // 2, 600) and kept == terms[:MAX_QUERY_CLAUSES // 2]
