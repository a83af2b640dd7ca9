"""BM25 per field: a 3-shard build scores each Lucene field (``contents``, ``title``) and their weighted sum exactly
like ONE unsharded Pyserini index over the same chunks with the same fields (Anserini's ``search_fields``: a
BooleanQuery of per-field boosted queries), and a version built without fields serves as before."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.search.inprocess import LocalIndex
from deployments.shard.lucene import LuceneShard, UnknownField
from index_build.build import build_index
from index_build.config import BuildConfig
from index_format.bm25_stats import lucene_idf
from index_format.lucene import boot
from tests.integration.conftest import ENCODER, unsharded_oracle

# Titles are "<topic> note <i>": topic words and "note" reach the title field, the rest only contents.
QUERIES = ["sailing boat wind", "astronomy telescope", "music note piano piano", "note", "cooking databases lucene",
           "unknownword", "galaxy"]
WEIGHTS = [{"contents": 1.0, "title": 0.5}, {"title": 1.0}, {"contents": 0.3, "title": 2.0}, {"contents": 1.0}]


@pytest.fixture(scope="module")
def oracle(built, tmp_path_factory):
    """One Pyserini LuceneSearcher over every chunk of the 3-shard build, ``title`` indexed beside ``contents``."""
    boot()
    return unsharded_oracle(built[3][1], tmp_path_factory.mktemp("fields-oracle"), fields=("title",))


def _lucene_scores(index_dir, terms: list[str], weights: dict[str, float]) -> dict[str, float]:
    """Every matching chunk's score in the one unsharded index, unrounded (Anserini rounds its scores to 4
    decimals and breaks ties by 1e-6 steps): plain Lucene, BM25(0.9, 0.4), a BooleanQuery of one
    ``BoostQuery(BooleanQuery(TermQuery(field:t)^count), weight)`` per field."""
    from collections import Counter

    from jnius import autoclass, cast

    reader = autoclass("org.apache.lucene.index.DirectoryReader").open(
        autoclass("org.apache.lucene.store.FSDirectory").open(autoclass("java.io.File")(str(index_dir)).toPath()))
    searcher = autoclass("org.apache.lucene.search.IndexSearcher")(cast("org.apache.lucene.index.IndexReader", reader))
    searcher.setSimilarity(autoclass("org.apache.lucene.search.similarities.BM25Similarity")(0.9, 0.4))
    Builder, Occur = (autoclass("org.apache.lucene.search.BooleanQuery$Builder"),
                      autoclass("org.apache.lucene.search.BooleanClause$Occur"))
    Boost, TermQuery, Term = (autoclass("org.apache.lucene.search.BoostQuery"),
                              autoclass("org.apache.lucene.search.TermQuery"), autoclass("org.apache.lucene.index.Term"))
    outer = Builder()
    for field, weight in weights.items():
        inner = Builder()
        for term, count in Counter(terms).items():
            inner.add(Boost(TermQuery(Term(field, term)), float(count)), Occur.SHOULD)
        outer.add(Boost(inner.build(), float(weight)), Occur.SHOULD)
    stored = reader.storedFields()
    try:
        return {stored.document(sd.doc).get("id"): sd.score
                for sd in searcher.search(outer.build(), max(1, reader.maxDoc())).scoreDocs}
    finally:
        reader.close()


@pytest.fixture(scope="module")
def local(built):
    _, summary = built[3]
    return LocalIndex(summary.version_dir)


def _truth(searcher, query, n, weights):
    return {h.docid: h.score for h in searcher.search(query, k=n, fields=weights)}


@pytest.mark.parametrize("weights", WEIGHTS, ids=lambda w: "+".join(f"{k}{v}" for k, v in w.items()))
@pytest.mark.parametrize("query", QUERIES)
def test_weighted_fields_over_shards_equal_one_pyserini_index(local, oracle, query, weights):
    searcher, n, _ = oracle
    expected = searcher.search(query, k=10, fields=weights)
    ours = local.bm25(query, k=10, weights=weights)
    assert len(ours) == len(expected)
    assert np.allclose([h.score for h in ours], [h.score for h in expected], rtol=1e-5, atol=1e-4)
    truth = _truth(searcher, query, n, weights)
    assert all(abs(truth[h.chunk_id] - h.score) < 1e-4 for h in ours)  # same chunks, ties aside


def test_the_title_field_alone_finds_titles(local):
    """Guards the test above against a title field that scores nothing on both sides."""
    hits = local.bm25("sailing", k=5, weights={"title": 1.0})
    assert len(hits) == 5
    titles = {r["chunk_id"]: r["title"] for s in local.shards for r in s.fetch([h.chunk_id for h in hits])}
    assert all(titles[h.chunk_id].startswith("sailing") for h in hits)


def test_field_scores_are_each_fields_exact_bm25_of_the_given_rows(local, oracle):
    """A ranking model's BM25 of each field for chosen rows, read in one pass over the postings (every field at once,
    no query built), against the unsharded index; a field's own query advanced to the rows (``scores_of``) and a
    search filtered to them (the path without the helper) agree."""
    *_, index_dir = oracle
    query = "sailing boat telescope astronomy"
    for shard in local.shards:
        rows = np.arange(shard.chunks - 1, -1, -2, dtype=np.int64)  # every other row, in reverse
        terms = shard.analyze(query)
        scores, _ = shard.lucene.candidate_facts(terms, rows, [])
        assert sorted(scores) == ["contents", "title"]
        for field, got in scores.items():
            truth = _lucene_scores(index_dir, terms, {field: 1.0})
            expected = [truth.get(shard.ids[int(r)], 0.0) for r in rows]
            assert got.dtype == np.float32 and len(got) == len(rows)
            assert np.allclose(got, expected, rtol=1e-5, atol=0), field
        assert (scores["title"] > 0).any() and (scores["title"] == 0).any()
        assert shard.lucene.fast
        for field, got in scores.items():  # the helper's field query advanced to the rows' doc numbers
            assert np.allclose(got, shard.lucene.scores_of(terms, rows, {field: 1.0}), rtol=1e-6, atol=0)
        shard.lucene.fast = False
        try:
            for field, got in scores.items():  # a search filtered to the rows, one field at a time
                assert np.allclose(got, shard.lucene.scores_of(terms, rows, {field: 1.0}), rtol=1e-6, atol=0)
        finally:
            shard.lucene.fast = True
    nothing, _ = local.shards[0].lucene.candidate_facts(["boat"], np.zeros(0, dtype=np.int64), [])
    assert all(len(v) == 0 for v in nothing.values())


def test_every_weighted_score_equals_plain_lucene_unrounded(local, oracle):
    """The whole ranking, not its top alone, against the unrounded scores of the one index."""
    *_, index_dir = oracle
    for q in QUERIES:
        terms = local.shards[0].analyze(q)
        for weights in WEIGHTS:
            truth = _lucene_scores(index_dir, terms, weights)
            ours = local.bm25(q, k=10_000, weights=weights)
            assert sorted(h.chunk_id for h in ours) == sorted(truth), (q, weights)
            assert all(abs(truth[h.chunk_id] - h.score) <= 1e-5 * truth[h.chunk_id] for h in ours), (q, weights)


def test_helper_and_proxy_paths_agree_on_weighted_fields(local):
    """Without a JDK, several fields are scored by one searcher each and summed: the helper's scores, within
    float rounding (the helper sums all clauses in one double; the proxies sum each field's float)."""
    for shard in local.shards:
        fast = shard.lucene
        slow = LuceneShard(shard.folder / "lucene", fast.chunk_ids, shard.manifest.lucene, fast.corpus,
                           fast.corpus_df, fast.shard, use_helper=False,
                           fields={f: v.stats for f, v in fast.fields.items() if f != "contents"})
        allowed = np.arange(0, len(fast.chunk_ids), 2, dtype=np.int64).tolist()
        for q in QUERIES:
            terms = fast.analyzer.analyze(q)
            for weights in WEIGHTS:
                for rows in (None, allowed, []):
                    a_rows, a_scores = fast.search_rows(terms, 15, rows, weights=weights)
                    b_rows, b_scores = slow.search_rows(terms, 15, rows, weights=weights)
                    assert np.allclose(a_scores, b_scores, rtol=1e-6, atol=0), (q, weights)
                    a, b = dict(zip(a_rows.tolist(), a_scores, strict=True)), dict(zip(b_rows.tolist(), b_scores, strict=True))
                    assert all(abs(a[r] - b[r]) <= 1e-6 * a[r] for r in set(a) & set(b))
        slow.close()


def test_unknown_or_zero_weighted_fields(local):
    lucene = local.shards[0].lucene
    with pytest.raises(UnknownField, match=r"\['body'\].*fields: \['contents', 'title'\]"):
        lucene.search_rows(["boat"], 5, weights={"body": 1.0})
    rows, _ = lucene.search_rows(["boat"], 5, weights={"contents": 0.0, "title": 0.0})
    assert len(rows) == 0


@pytest.fixture(scope="module")
def unfielded(corpus, ray_local, tmp_path_factory):
    """The corpus built as before fields (``bm25_fields=()``): ``contents`` alone."""
    path, _ = corpus
    cfg = BuildConfig(corpus=path, out=tmp_path_factory.mktemp("nofields"), shards=3, encoder=ENCODER,
                      chunk_size=40, chunk_overlap=8, progress=False, bm25_fields=())
    return build_index(cfg)


def test_a_version_without_fields_serves_as_before(unfielded, local):
    old = LocalIndex(unfielded.version_dir)
    assert not (unfielded.version_dir / "bm25" / "fields").exists()
    for shard in old.shards:
        assert list(shard.lucene.fields) == ["contents"]
        assert "fields" not in shard.manifest.lucene
        assert list(shard.lucene.candidate_facts(["boat"], np.arange(3), [])[0]) == ["contents"]
    for q in QUERIES:  # the same contents-only scores as a version with a title field beside
        a, b = old.bm25(q, k=10), local.bm25(q, k=10)
        assert [h.chunk_id for h in a] == [h.chunk_id for h in b] and [h.score for h in a] == [h.score for h in b]
    with pytest.raises(UnknownField, match=r"fields: \['contents'\]"):
        old.bm25("boat", weights={"contents": 1.0, "title": 0.5})




@pytest.mark.parametrize("group_size", [0, 2], ids=["one-group", "groups-of-2"])
def test_each_candidates_ranking_features_equal_their_oracles(built, oracle, group_size):
    """The table a ranking model reads, made as serving makes it (the shards in one group, or in groups of 2: a
    candidate found in its shard of its group, the groups' answers merged), against oracles: each field's BM25 from
    the one unsharded index, coverage from the chunk's own analyzed text, the lengths and position from its row,
    the relative features counted over the table."""
    import asyncio
    from collections import Counter

    from deployments.edge.schemas import SearchRequest
    from deployments.search.inprocess import inprocess_pipeline
    from deployments.shard.lucene import QueryAnalyzer
    from index_format.chunk_ids import doc_of

    _, summary = built[3]
    *_, index_dir = oracle
    pipeline = inprocess_pipeline({"default": summary.version_dir}, group_size=group_size)
    local = LocalIndex(summary.version_dir)
    rows = {r["chunk_id"]: r for s in local.shards for r in s.fetch(list(s.ids))}
    analyzer = QueryAnalyzer()
    for query in ["sailing boat wind", "astronomy telescope galaxy", "music note piano piano"]:
        table = asyncio.run(pipeline.ranking_features(SearchRequest(query=query)))
        ids = [h.chunk_id for h in table.hits]
        assert len(ids) > 20 and len(set(ids)) == len(ids)
        col = table.columns
        terms = analyzer.analyze(query)
        for field in ("contents", "title"):
            truth = _lucene_scores(index_dir, terms, {field: 1.0})
            assert np.allclose(col[f"bm25_{field}"], [truth.get(c, 0.0) for c in ids], rtol=1e-5, atol=1e-6), field
        distinct = sorted(set(terms))
        held = [set(analyzer.analyze(f"{rows[c]['title']}\n{rows[c]['text']}" if rows[c]["text"] else rows[c]["title"]))
                for c in ids]
        assert col["term_coverage"].tolist() == pytest.approx([sum(t in h for t in distinct) / len(distinct)
                                                               for h in held])
        corpus = local.shards[0].lucene  # each term weighed by its corpus idf
        idf = {t: lucene_idf(corpus.corpus.doc_count, corpus.corpus_df.get(t, 0)) for t in distinct}
        assert col["idf_coverage"].tolist() == pytest.approx([sum(idf[t] for t in distinct if t in h) /
                                                              sum(idf.values()) for h in held])
        assert col["length"].tolist() == [len(rows[c]["text"].split()) for c in ids]
        assert col["title_length"].tolist() == [len(rows[c]["title"].split()) for c in ids]
        assert col["position"].tolist() == [float(c.rsplit("#", 1)[1]) for c in ids]
        docs = Counter(doc_of(c) for c in ids)
        assert col["doc_chunks"].tolist() == [docs[doc_of(c)] for c in ids]
        assert col["fused_rank"].tolist() == list(range(1, len(ids) + 1))
        best = max(col["bm25_contents"])
        assert np.allclose(col["bm25_share"], col["bm25_contents"] / best)
        # The keyword leg ranked by BM25 of contents: its ranks are distinct, and in their order BM25 never rises.
        ranked = sorted((r, s) for r, s in zip(col["keyword_rank"], col["bm25_contents"], strict=True)
                        if not np.isnan(r))
        assert len({r for r, _ in ranked}) == len(ranked) > 0
        assert all(a[1] >= b[1] - 1e-5 for a, b in zip(ranked, ranked[1:], strict=False))
        dense = col["dense"]
        assert np.isfinite(dense).all() and np.allclose(col["dense_gap"], dense.max() - dense)


def test_a_model_that_reads_one_field_has_only_that_field_scored(built):
    """A shard group asked only for ``bm25_title`` and coverage (a model that reads no ``bm25_contents``) scores the
    title as when asked for everything, leaves ``contents`` unscored (NaN), and its coverage is unchanged (the masks
    then read from the postings on their own, no contents clause holding their terms)."""
    from deployments.shard.features import FeatureQuery
    from deployments.shard.group import ShardGroup

    _, summary = built[3]
    local = LocalIndex(summary.version_dir)
    group = ShardGroup(local.shards)
    ids = [c for s in local.shards for c in list(s.ids)[:15]]
    for query in ["sailing boat wind", "music note piano piano"]:
        every = group.features(FeatureQuery(query, ids))
        one = group.features(FeatureQuery(query, ids, names=frozenset({"bm25_title", "term_coverage",
                                                                         "idf_coverage"})))
        assert np.array_equal(one["bm25_title"], every["bm25_title"]) and (every["bm25_title"] > 0).any()
        assert np.isnan(one["bm25_contents"]).all() and (every["bm25_contents"] > 0).any()
        for name in ("term_coverage", "idf_coverage"):
            assert np.array_equal(one[name], every[name]) and (every[name] > 0).any()
