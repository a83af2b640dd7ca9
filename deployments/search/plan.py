"""What a search will do, decided before any work: a pure function of the request and the router's settings.

How deep each leg searches, how far pages may go, how many candidates are reranked and how many rows ride
along with the shards' answers are all fixed here, once, from the request (its tuned defaults applied), the
settings and how many collections it searches. The pipeline then only carries the plan out; a request the
plan refuses (a page past what the search ranks) is refused before the query is even embedded.
"""

from __future__ import annotations

from dataclasses import dataclass

from deployments.config import RouterSettings
from deployments.edge.schemas import Method, SearchRequest
from deployments.search.fusion import candidate_depth
from deployments.search.paging import check_window


@dataclass(frozen=True)
class SearchPlan:
    offset: int  # ranked results before the page
    window: int  # offset + limit: the ranks the search must produce
    depth: int  # candidates each leg asks of each shard
    k_dense: int  # the dense leg's depth (0: not searched)
    k_keyword: int  # the keyword leg's
    reorders: bool  # fusion, MMR, several collections, grouping or dedupe: candidates beyond the page are needed
    pages_end: int  # how far pages of this search may go
    rerank_depth: int  # candidates rescored (0: no reranking)
    rows_for_top: int  # chunk rows a shard deployment sends with its answer
    capped: bool  # the request's candidates were lowered to router.candidate_cap


def plan_search(req: SearchRequest, s: RouterSettings, collections: int, rerank: bool, offset: int = 0) -> SearchPlan:
    """``req`` with its tuned defaults applied; ``rerank``: whether this search is reranked."""
    window = offset + req.limit
    # Grouping and dedupe fold or drop candidates: a page of them needs candidates beyond its own ranks.
    reorders = (req.method is Method.hybrid or req.mmr_lambda is not None or collections > 1
                or req.group_by is not None or req.dedupe_threshold is not None)
    capped = False
    if reorders:  # fusion and MMR look past the final top-n: each leg asks for more candidates
        if req.candidates:
            depth = max(req.candidates, req.limit)
            if depth > max(s.candidate_cap, req.limit):  # the operator's cap binds clients too
                capped, depth = True, max(s.candidate_cap, req.limit)
        else:
            depth = candidate_depth(req.limit, s.candidate_base, s.candidate_factor, s.candidate_cap)
        if req.mmr_lambda is not None:
            depth = max(depth, min(req.limit * s.mmr_pool_factor, s.candidate_cap))
        # Fused scores depend on the candidates (min-max over each leg's list): pages stay inside them, and
        # depths follow ``limit``, never the offset, so every page ranks the same candidates.
        pages_end = depth
    else:  # one leg, no reordering: each shard's top-k merged is the exact top-k, to any depth
        pages_end = max(s.candidate_cap, req.limit)
        depth = window
    if offset:
        check_window(offset, req.limit, pages_end)
    rerank_depth = 0
    if rerank:
        rerank_depth = max(req.rerank_depth or s.rerank_depth, req.limit)
        depth = max(depth, min(rerank_depth, s.candidate_cap))
    return SearchPlan(
        offset=offset, window=window, depth=depth,
        k_dense=depth if req.method is not Method.keyword else 0,
        k_keyword=depth if req.method is not Method.vector else 0,
        reorders=reorders, pages_end=pages_end, rerank_depth=rerank_depth,
        rows_for_top=min(max(window, rerank_depth), s.rows_with_answers), capped=capped)
