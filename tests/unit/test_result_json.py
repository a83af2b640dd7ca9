"""Results written from cached JSON fragments are the bytes pydantic writes for the same Result models."""

from __future__ import annotations

from deployments.edge.schemas import Result, StageScores
from deployments.search.hits import Hit
from deployments.search.result_json import FragmentCache, PageScores, render_results, source_of

ROWS = [
    {"chunk_id": "d1#0", "doc_id": "d1", "collection": "main", "text": 'a "quoted" line\nand a tab\t, é, \u2028, </script>',
     "title": "Ünïcode ✓", "section": "", "char_start": 0, "char_end": 42,
     "metadata": {"url": "https://example.org/d1", "year": 2021, "nested": {"a": [1, None, 2.5]}, "none": None,
                  "big": 2**70, "flag": True}},
    {"chunk_id": "d2#3", "doc_id": "d2", "collection": "other", "text": "", "title": "", "section": "Methods",
     "char_start": 100, "char_end": 100, "metadata": {"source": "  "}},
    {"chunk_id": "d3#1", "doc_id": "d3", "collection": "main", "text": "tiny scores", "title": "t", "section": "s",
     "char_start": 5, "char_end": 16, "metadata": {}},
]
HITS = [Hit("d1#0", 0.9000000000000001, 0, "main"), Hit("d2#3", 1e-7, 1, "other"), Hit("d3#1", 0.0, 2, "main")]


def models(reranked: bool, dense_of, keyword_of, fused_of, relevance_of) -> str:
    """The oracle: the models the pipeline builds otherwise, serialized as a response serializes them."""
    out = []
    for rank, (hit, row) in enumerate(zip(HITS, ROWS, strict=True), start=1):
        cid = hit.key
        out.append(Result(
            rank=rank, chunk_id=row["chunk_id"], doc_id=row["doc_id"], collection=row["collection"],
            content=row["text"], source=source_of(row["doc_id"], row["metadata"]), title=row["title"],
            section=row["section"], metadata=row["metadata"], relevance_score=relevance_of[cid], score=hit.score,
            scores=StageScores(dense=dense_of.get(cid), keyword=keyword_of.get(cid), fused=fused_of.get(cid),
                               reranked=hit.score if reranked else None),
            char_start=row["char_start"], char_end=row["char_end"]).model_dump_json(exclude_none=True))
    return f"[{','.join(out)}]"


def test_rendered_results_are_the_models_bytes():
    dense_of = {("d1#0", "main"): 0.8123456789, ("d2#3", "other"): -0.25}
    keyword_of = {("d1#0", "main"): 12.5, ("d3#1", "main"): 1e22}
    fused_of = {h.key: h.score for h in HITS}
    relevance_of = {("d1#0", "main"): 1.0, ("d2#3", "other"): 0.00001, ("d3#1", "main"): 0.0}
    versions = {"main": "v1", "other": "v7"}
    for reranked in (False, True):
        for fused in (fused_of, {}):
            cache = FragmentCache()
            page = PageScores(dense_of, keyword_of, fused, relevance_of, reranked)
            first = render_results(cache, versions, HITS, ROWS, page)
            again = render_results(cache, versions, HITS, ROWS, page)
            assert first == again == models(reranked, dense_of, keyword_of, fused, relevance_of)


def test_fragments_are_kept_per_collection_and_version_and_bounded():
    cache = FragmentCache(kept=2)
    row = dict(ROWS[2])
    old = cache.of("main", "v1", row)
    assert cache.of("main", "v1", row | {"text": "changed"}) is old  # a version never changes a chunk
    assert cache.of("main", "v2", row | {"text": "changed"}) != old  # a new version gets its own
    cache.of("other", "v1", row)
    assert len(cache.fragments) <= 2
