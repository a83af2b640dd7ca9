"""Results shaped for RAG, in-process over the real 3-shard index: grouped by document or a metadata field (paged
over groups), near-duplicates dropped, highlight spans, and cursors that page from a point in time while writes go
on. Each oracle is the ungrouped (or undeduped) ranking of the same candidates, regrouped here by hand, or the
pages read before any write."""

from __future__ import annotations

import asyncio
import json
import re
import shutil

import numpy as np
import pytest
from pydantic import ValidationError

from deployments.edge.errors import status_of
from deployments.edge.schemas import SearchRequest
from deployments.errors import ServiceError
from deployments.search.inprocess import inprocess_pipeline
from index_format.chunk_ids import doc_of

Q = "telescope galaxy lucene shard"


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def pipeline(built):
    return inprocess_pipeline({"main": built[3][1].version_dir}, default="main")


def search(pipeline, **kw):
    return run(pipeline.search(SearchRequest(**kw)))


def regrouped(ranking: list[tuple[str, object]], size: int) -> list[list[str]]:
    """The oracle: an ungrouped ranking of (chunk id, group key) folded by hand into groups in the order of their
    best chunk."""
    groups: dict = {}
    for chunk_id, key in ranking:
        if key is None:  # a chunk without the field stands alone
            groups[("alone", chunk_id)] = [chunk_id]
            continue
        if len(groups.setdefault(key, [])) < size:
            groups[key].append(chunk_id)
    return list(groups.values())


def ungrouped(pipeline, method: str, candidates: int) -> tuple[list[str], dict]:
    """The whole ranking of ``candidates`` per leg, ungrouped: a hybrid search fuses up to twice that many, all of
    them in its debug trace's fused list (50 shown); a one-leg search returns them all in one page. Also the
    results by chunk id (the first page's)."""
    whole = search(pipeline, query=Q, method=method, limit=candidates, candidates=candidates, debug=True)
    ranking = ([h["chunk_id"] for h in whole.debug["fused"]] if method == "hybrid"
               else [r.chunk_id for r in whole.results])
    assert len(ranking) < 50 and len(ranking) >= len(whole.results)
    return ranking, {r.chunk_id: r for r in whole.results}


def pages(pipeline, limit: int, **kw) -> list:
    out, cursor = [], None
    while True:
        page = search(pipeline, limit=limit, **kw, **({"cursor": cursor} if cursor else {}))
        out.append(page)
        cursor = page.next_cursor
        if cursor is None or len(out) == 20:
            return out


@pytest.mark.parametrize("method", ["hybrid", "keyword"])
def test_group_by_doc_id_is_the_ungrouped_ranking_folded_and_pages_count_groups(pipeline, method):
    # The same 20 candidates a leg either way (depth is max(candidates, limit)).
    ranking, by_chunk = ungrouped(pipeline, method, 20)
    want = regrouped([(c, doc_of(c)) for c in ranking], 2)
    assert len(want) < len(ranking)  # the corpus has multi-chunk documents: grouping folds some
    got = pages(pipeline, 3, query=Q, method=method, candidates=20, group_by="doc_id", group_size=2)
    results = [r for p in got for r in p.results]
    assert [[r.chunk_id, *(c.chunk_id for c in r.group.chunks)] for r in results] == want
    assert [r.rank for r in results] == list(range(1, len(want) + 1))  # ranks and pages count groups
    assert all(p.total == len(want) for p in got) and len(got) == -(-len(want) // 3)
    assert [p.offset for p in got] == list(range(0, len(want), 3))
    for r in results:
        assert r.group.key == r.doc_id and all(doc_of(c.chunk_id) == r.doc_id for c in r.group.chunks)
        assert r.group.found == sum(doc_of(c) == r.doc_id for c in ranking)
        for hit in (r, *r.group.chunks):  # at the rank of its best chunk, with the ungrouped scores and texts
            if hit.chunk_id in by_chunk:
                assert (hit.content, hit.score) == (by_chunk[hit.chunk_id].content,
                                                    pytest.approx(by_chunk[hit.chunk_id].score))
    # group_size 1 (the default): the best chunk of each document alone; offset pages over groups too
    firsts = [g[0] for g in regrouped([(c, doc_of(c)) for c in ranking], 1)]
    page = search(pipeline, query=Q, method=method, limit=4, offset=2, candidates=20, group_by="doc_id")
    assert [r.chunk_id for r in page.results] == firsts[2:6] and all(r.group.chunks == [] for r in page.results)


def test_group_by_a_metadata_field_and_invalid_combinations(pipeline):
    whole = search(pipeline, query=Q, method="keyword", limit=40, candidates=40)
    want = regrouped([(r.chunk_id, r.metadata.get("topic")) for r in whole.results], 3)
    got = search(pipeline, query=Q, method="keyword", limit=10, candidates=40, group_by="topic", group_size=3)
    assert [[r.chunk_id, *(c.chunk_id for c in r.group.chunks)] for r in got.results] == want
    assert len({r.group.key for r in got.results}) == len(got.results) == len(want) <= 5
    assert all(r.group.key == r.metadata["topic"] for r in got.results)
    with pytest.raises(ServiceError) as e:
        search(pipeline, query=Q, group_by="colour")
    assert status_of(e.value) == 422 and "group_by field 'colour'" in str(e.value) and "topic" in str(e.value)
    for bad in ({"group_by": "doc_id", "mmr_lambda": 0.5}, {"group_size": 2}):
        with pytest.raises(ValidationError):  # a 422 at the edge
            SearchRequest(query=Q, **bad)
    # A served response writes the group as JSON (models, not cached fragments).
    rendered = run(pipeline.search(SearchRequest(query=Q, limit=2, group_by="doc_id"), rendered=True))
    assert rendered.results and rendered.results[0].group is not None
    assert json.loads(rendered.model_dump_json())["results"][0]["group"]["key"] == rendered.results[0].doc_id


def test_a_cursor_pages_from_its_point_in_time_while_documents_are_written(built, tmp_path):
    """Pages followed by cursor while documents are added, replaced and deleted are the pages followed with no write
    at all (the oracle, read before the writes): no result repeated or skipped, none of the writes seen, a deleted
    document still there as it was. A search begun after the writes sees them. Past router.cursor_keep_alive_s
    the next page is a 409."""
    from deployments.documents.service import open_documents

    version = built[1][1].version_dir
    root = tmp_path / "root"
    shutil.copytree(version, root / version.name)  # the change log is written beside the version, here only
    pipe = inprocess_pipeline({"main": root / version.name})
    collection = pipe.collections["main"]
    documents = open_documents("main", root, root / version.name, collection.encoder, 64)
    collection.fresh = documents.segment  # what the router does with a collection's documents API
    hot = "telescope galaxy lucene shard notes " * 4
    run(documents.write([{"id": "fresh-0", "title": "telescope galaxy", "text": hot}], [], None))

    def pages(first) -> list[list[tuple]]:
        out, page = [], first
        while True:
            out.append([(r.rank, r.chunk_id, r.score, r.content) for r in page.results])
            if page.next_cursor is None or len(out) == 6:
                return out
            page = search(pipe, query=Q, limit=3, cursor=page.next_cursor)

    oracle = pages(search(pipe, query=Q, limit=3))
    first = search(pipe, query=Q, limit=3)
    assert [(r.rank, r.chunk_id, r.score, r.content) for r in first.results] == oracle[0]
    doomed = oracle[2][0][1].split("#")[0]  # a document on the third page, deleted before it is read
    run(documents.write([{"id": "fresh-1", "title": "telescope galaxy", "text": hot},
                         {"id": "fresh-0", "title": "other", "text": "replaced: nothing of the query"}], [], None))
    change, _ = run(documents.write([], [doomed], None))
    assert pages(first)[1:] == oracle[1:]  # the point in time of the first page, whole
    after = [r.doc_id for r in search(pipe, query=Q, limit=30).results]
    assert "fresh-1" in after and doomed not in after and "fresh-0" not in after
    original = pipe.settings
    try:
        pipe.reconfigure(original.model_copy(update={"cursor_keep_alive_s": 0.001}))
        with pytest.raises(ServiceError) as e:
            search(pipe, query=Q, limit=3, cursor=first.next_cursor)
        assert status_of(e.value) == 409 and "router.cursor_keep_alive_s" in str(e.value)
    finally:
        pipe.reconfigure(original)
    assert change.seq == documents.segment.applied_seq


def test_highlights_are_the_query_terms_as_lucene_analyzes_them(pipeline):
    """Spans of the query's stems in each returned text: the query says "telescopes galaxies", the corpus holds
    "telescope" and "galaxy" (Porter stems meet); the oracle finds those words with a regular expression."""
    from deployments.search.highlights import Highlighter

    text = "The Galaxy's telescopes observed galaxies; observing them is the point."
    marked = Highlighter().spans("galaxy observe", [text])[0]  # Lucene's English analyzer, for real
    assert [text[a:b] for a, b in marked] == ["Galaxy's", "observed", "galaxies", "observing"]

    words = re.compile(r"\b(telescope|galaxy)\b")
    got = search(pipeline, query="telescopes galaxies", limit=5, group_by="doc_id", group_size=2, highlights=True)
    texts = [(r.content, r.highlights) for r in got.results]
    texts += [(c.content, c.highlights) for r in got.results for c in r.group.chunks]
    assert len(texts) > 5 and any(spans for _, spans in texts)
    for content, spans in texts:
        assert [(s.start, s.end) for s in spans] == [m.span() for m in words.finditer(content)]
    plain = search(pipeline, query="telescopes galaxies", limit=5)
    assert all(r.highlights is None for r in plain.results)


def test_dedupe_drops_what_lies_within_the_threshold_of_a_better_result_kept(pipeline, built):
    """The oracle: the undeduped ranking, each chunk's stored vector read straight from its shard, and the greedy
    rule by hand (keep a chunk unless its cosine with one kept above it reaches the threshold)."""
    from deployments.search.inprocess import LocalIndex

    local = LocalIndex(built[3][1].version_dir)
    whole = search(pipeline, query=Q, method="keyword", limit=40, candidates=40)
    ids = [r.chunk_id for r in whole.results]
    vectors = np.stack([next(s.vectors([c])[0] for s in local.shards if c in s.ids) for c in ids])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    threshold = 0.6
    kept: list[int] = []
    for i in range(len(ids)):
        if all(float(unit[i] @ unit[j]) < threshold for j in kept):
            kept.append(i)
    assert 0 < len(kept) < len(ids)  # something to drop
    deduped = search(pipeline, query=Q, method="keyword", limit=40, candidates=40, dedupe_threshold=threshold)
    assert [r.chunk_id for r in deduped.results] == [ids[i] for i in kept] and deduped.total == len(kept)
    assert [r.rank for r in deduped.results] == list(range(1, len(kept) + 1))
    # before grouping: the groups are those of the deduped ranking
    grouped = search(pipeline, query=Q, method="keyword", limit=40, candidates=40, dedupe_threshold=threshold,
                     group_by="doc_id", group_size=10)
    assert ([[r.chunk_id, *(c.chunk_id for c in r.group.chunks)] for r in grouped.results]
            == regrouped([(ids[i], doc_of(ids[i])) for i in kept], 10))
