"""The search plan: every depth of a search from the request and the settings alone, hand-computed here."""

import pytest

from deployments.config import RouterSettings
from deployments.edge.schemas import SearchRequest
from deployments.errors import ServiceError
from deployments.search.plan import plan_search

S = RouterSettings()  # candidate_base 200, factor 1, cap 1000, rerank_depth 40


def plan(rerank=False, offset=0, collections=1, settings=S, **fields):
    return plan_search(SearchRequest(query="q", **fields), settings, collections, rerank, offset)


def test_hybrid_asks_each_leg_for_the_candidate_rule_and_pages_stay_inside_it():
    p = plan(limit=10)
    assert (p.depth, p.k_dense, p.k_keyword, p.pages_end, p.window, p.reorders) == (200, 200, 200, 200, 10, True)
    assert plan(limit=10, offset=150).depth == 200  # a later page ranks the same candidates
    with pytest.raises(ServiceError, match="past the 200 results"):
        plan(limit=10, offset=195)


def test_one_leg_asks_for_exactly_the_window_and_pages_go_to_the_cap():
    p = plan(limit=10, method="keyword", offset=30)
    assert (p.depth, p.k_dense, p.k_keyword, p.pages_end, p.reorders) == (40, 0, 40, 1000, False)
    assert plan(limit=5, method="vector").k_keyword == 0
    assert plan(limit=5, method="vector", collections=2).depth == 200  # collections are fused: the rule


def test_caps_mmr_and_reranking_deepen_as_documented():
    capped = plan(limit=10, candidates=1000, settings=RouterSettings(candidate_cap=300))
    assert capped.capped and capped.depth == 300
    assert not plan(limit=10, candidates=50).capped and plan(limit=10, candidates=50).depth == 50
    assert plan(limit=100, mmr_lambda=0.5, candidates=50).depth == min(100 * S.mmr_pool_factor, 1000)
    r = plan(limit=10, rerank=True, candidates=20)
    assert (r.rerank_depth, r.depth) == (40, 40)
    assert plan(limit=10, rerank=True, rerank_depth=5).rerank_depth == 10  # never below the page
    assert plan(limit=10, rerank=True).rows_for_top == min(40, S.rows_with_answers)
