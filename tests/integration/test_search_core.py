"""Sharded search cores against one unsharded index: BM25 vs Pyserini, dense vs brute force, filters."""

from __future__ import annotations

import random

import numpy as np
import pytest

from deployments.search.inprocess import LocalIndex
from deployments.shard.query import ShardQuery
from index_format.lucene import boot
from tests.conftest import TOPICS
from tests.integration.conftest import shard_dirs, unsharded_oracle

QUERIES = [
    "telescope galaxy",
    "bread oven butter flour",
    "the lucene shard and the replica",
    "piano piano chord",  # a repeated term counts twice
    "title:anchor AND (mast OR \"keel",  # Lucene syntax is searched as text
    "unknownword",
    "sail wind tide harbor captain rope",
]


@pytest.fixture(scope="module")
def oracle(built, tmp_path_factory):
    """One Pyserini LuceneSearcher over every chunk of the 3-shard build, BM25 k1=0.9 b=0.4."""
    boot()
    searcher, n, _ = unsharded_oracle(built[3][1], tmp_path_factory.mktemp("oracle"))
    return searcher, n


@pytest.fixture(scope="module")
def local(built):
    _, summary = built[3]
    return LocalIndex(summary.version_dir)


def _all_scores(searcher, query, n):
    return {h.docid: h.score for h in searcher.search(query, k=n)}


def test_query_analysis_matches_pyserini(local):
    from pyserini.analysis import Analyzer, get_lucene_analyzer

    theirs = Analyzer(get_lucene_analyzer())
    ours = local.shards[0].lucene.analyzer
    for text in QUERIES + ["Running runners ran quickly; The LUCENE-based indexes!"]:
        assert ours.analyze(text) == theirs.analyze(text)


@pytest.mark.parametrize("query", QUERIES)
def test_sharded_bm25_equals_one_pyserini_index(local, oracle, query):
    searcher, n = oracle
    expected = searcher.search(query, k=10)
    ours = local.bm25(query, k=10)
    assert len(ours) == len(expected)
    assert np.allclose([h.score for h in ours], [h.score for h in expected], rtol=0, atol=1e-4)
    truth = _all_scores(searcher, query, n)
    assert all(abs(truth[h.chunk_id] - h.score) < 1e-4 for h in ours)  # same documents, ties aside


def test_random_queries_keep_max_difference_below_1e4(local, oracle):
    searcher, n = oracle
    rng = random.Random(11)
    vocab = " ".join(TOPICS.values()).split()
    worst = 0.0
    for _ in range(40):
        q = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 6)))
        truth = _all_scores(searcher, q, n)
        for h in local.bm25(q, k=20):
            worst = max(worst, abs(truth[h.chunk_id] - h.score))
    assert worst < 1e-4


def test_filtered_bm25_is_complete_not_post_filtered(local, oracle):
    """Only rows of documents about sailing allowed: the top-k equals brute force over those rows."""
    searcher, n = oracle
    query = "telescope galaxy sail"
    truth = _all_scores(searcher, query, n)
    allowed, allowed_ids = [], set()
    for shard in local.shards:
        topics = shard.table["title"].to_pylist()
        allowed.append(np.array([i for i, t in enumerate(topics) if t.startswith("sailing")], dtype=np.int64))
        allowed_ids.update(shard.table["chunk_id"].to_pylist()[i] for i in allowed[-1])
    hits = local.bm25(query, 5, allowed)
    expected = sorted((s for c, s in truth.items() if c in allowed_ids), reverse=True)[:5]
    assert [round(h.score, 4) for h in hits[:5]] == [round(s, 4) for s in expected]
    assert all(h.chunk_id in allowed_ids for h in hits)
    # unfiltered, the same query's top-5 holds no sailing chunk at all: a post-filter would return nothing
    assert not any(h.chunk_id in allowed_ids for h in local.bm25(query, 5))


def test_sharded_dense_with_and_without_filter_equals_brute_force(local):
    vectors, ids = [], []
    for shard in local.shards:
        vectors.append(np.load(shard.folder / "embeddings.npy"))
        ids += shard.table["chunk_id"].to_pylist()
    matrix = np.concatenate(vectors)
    q = local.embed(["lucene index replica"])
    truth = dict(zip(ids, (matrix @ q[0]).tolist(), strict=True))
    hits = local.dense(q, k=8)
    assert np.allclose([h.score for h in hits], sorted(truth.values(), reverse=True)[:8], atol=1e-5)
    shard = local.shards[1]
    rows = np.arange(0, shard.table.num_rows, 3, dtype=np.int64)
    allowed = {shard.table["chunk_id"].to_pylist()[i] for i in rows}
    filtered_rows, filtered_scores = shard.dense_leg(q[0], 4, rows)
    assert set(shard.ids.take(filtered_rows)) <= allowed
    assert np.allclose(filtered_scores, sorted((truth[c] for c in allowed), reverse=True)[:4], atol=1e-5)
    assert len(shard.dense_leg(q[0], 4, np.array([], dtype=np.int64))[0]) == 0


def test_the_java_helper_is_compiled_here_and_in_use(local):
    """Where a JDK is present (CI's machine has one), BM25 runs through the compiled helper."""
    from index_format.lucene import _javac, helper_classes

    if _javac() is None:
        pytest.skip("no JDK on this machine: BM25 runs through pyjnius proxies")
    assert helper_classes() is not None
    assert all(shard.lucene.fast for shard in local.shards)


def test_helper_and_proxy_paths_give_identical_hits(local):
    """One JNI call building the query and returning arrays == the query built and read through proxies."""
    from deployments.shard.lucene import LuceneShard

    for shard in local.shards:
        fast = shard.lucene
        slow = LuceneShard(shard.folder / "lucene", fast.chunk_ids, shard.manifest.lucene, fast.corpus,
                           fast.corpus_df, fast.shard, use_helper=False)
        assert not slow.fast
        allowed = np.arange(0, len(fast.chunk_ids), 2, dtype=np.int64).tolist()
        for q in QUERIES + ["telescope " * 40]:
            terms = fast.analyzer.analyze(q)
            for rows in (None, allowed, []):
                a_rows, a_scores = fast.search_rows(terms, 15, rows)
                b_rows, b_scores = slow.search_rows(terms, 15, rows)
                assert a_rows.tolist() == b_rows.tolist() and a_scores.tolist() == b_scores.tolist()
        slow.close()


def test_term_masks_say_which_query_terms_each_chunk_holds(local):
    """A ranking model's coverage: the helper's read of the postings, the proxies' filtered search per term, and
    the chunk's own analyzed text (the oracle) agree on which terms each chunk holds."""
    from deployments.shard.lucene import LuceneShard

    for shard in local.shards:
        fast = shard.lucene
        slow = LuceneShard(shard.folder / "lucene", fast.chunk_ids, shard.manifest.lucene, fast.corpus,
                           fast.corpus_df, fast.shard, use_helper=False)
        rows = np.arange(len(fast.chunk_ids) - 1, -1, -3, dtype=np.int64)  # descending: the helper sorts them
        texts = shard.table["text"].to_pylist()
        titles = shard.table["title"].to_pylist()
        for q in QUERIES:
            terms = sorted(set(fast.analyzer.analyze(q)))
            masks = fast.term_masks(terms, rows)
            assert masks.tolist() == slow.term_masks(terms, rows).tolist()
            # Read beside each field's BM25 in one pass (the masks of terms a clause holds come from its postings).
            assert fast.candidate_facts(fast.analyzer.analyze(q), rows, terms)[1].tolist() == masks.tolist()
            assert slow.candidate_facts(fast.analyzer.analyze(q), rows, terms)[1].tolist() == masks.tolist()
            for row, mask in zip(rows.tolist(), masks.tolist(), strict=True):
                held = set(fast.analyzer.analyze(f"{titles[row]}\n{texts[row]}" if texts[row] else titles[row]))
                assert [bool(mask >> i & 1) for i in range(len(terms))] == [t in held for t in terms]
        slow.close()


@pytest.mark.parametrize("use_helper", [True, False])
def test_shards_sharing_one_top_k_prune_yet_merge_to_the_same_hits(local, oracle, use_helper):
    """A group's shards searched with one shared top-k: later shards skip what cannot reach the k best so far
    (they return fewer rows), and the merged top-k still equals one unsharded index's."""
    from deployments.shard.lucene import LuceneShard

    searcher, n = oracle
    engines = [s.lucene if use_helper else
               LuceneShard(s.folder / "lucene", s.lucene.chunk_ids, s.manifest.lucene, s.lucene.corpus,
                           s.lucene.corpus_df, s.lucene.shard, use_helper=False) for s in local.shards]
    assert all(e.fast == use_helper for e in engines) or not use_helper
    k, pruned = 3, 0
    vocab = " ".join(TOPICS.values()).split()
    rng = random.Random(5)
    for q in QUERIES + [" ".join(rng.choice(vocab) for _ in range(4)) for _ in range(20)]:
        terms = engines[0].analyzer.analyze(q)
        shared = engines[0].shared_top_k(k)
        alone = [e.search_rows(terms, k) for e in engines]
        together = [e.search_rows(terms, k, None, shared) for e in engines]
        pruned += sum(len(b[0]) < len(a[0]) for a, b in zip(alone, together, strict=True))
        merged = sorted((s for _, scores in together for s in scores.tolist()), reverse=True)[:k]
        expected = [h.score for h in searcher.search(q, k=k)]
        assert np.allclose(merged, expected, rtol=0, atol=1e-4), q
        truth = _all_scores(searcher, q, n)
        for e, (rows, scores) in zip(engines, together, strict=True):
            assert all(abs(truth[e.chunk_ids[r]] - s) < 1e-4 for r, s in zip(rows.tolist(), scores.tolist(), strict=True))
    assert pruned > 0  # the bound did skip hits somewhere, or this test shows nothing
    if not use_helper:
        for e in engines:
            e.close()


def test_a_large_groups_legs_run_side_by_side_and_answer_as_one_thread(built, monkeypatch):
    """``ShardHost.search`` on a group past ``LEGS_APART_MIN_CHUNKS`` runs the dense leg on its own thread beside
    BM25; its answer is the one-thread ``ShardGroup.search``'s, filtered or not, one leg or both."""
    import asyncio
    import threading

    from deployments.shard import host as host_module
    from deployments.shard.host import ShardHost
    from index_format.encoders import load_encoder
    from index_format.versions import read_version_manifest

    _, summary = built[3]
    manifest = read_version_manifest(summary.version_dir)
    names = [p.name for p in shard_dirs(summary)]
    host = ShardHost(None, str(summary.version_dir), names,
                     {"encoder": manifest.encoder, "dimension": manifest.dimension})
    group = host.open_version(summary.version_dir.name)
    threads = {"dense": set(), "keyword": set()}

    def recording(leg, fn):
        def call(*args):
            threads[leg].add(threading.current_thread().name.rsplit("_", 1)[0])
            return fn(*args)
        return call

    for s in group.services:
        for leg in ("dense", "keyword"):
            monkeypatch.setattr(s, f"{leg}_leg", recording(leg, getattr(s, f"{leg}_leg")))
    vector = load_encoder(manifest.encoder).encode(["telescope galaxy"])[0]
    cases = [
        ShardQuery(vector, "telescope galaxy", 20, 20, rows_for_top=5),
        ShardQuery(vector, "bread oven butter", 20, 20, {"topic": "cooking"}, 5),
        ShardQuery(vector, "sail wind", 10, 0),
        ShardQuery(None, "piano chord", 0, 10, rows_for_top=3),
        ShardQuery(vector, "piano chord", 10, 10, {"year": {"gte": 2010}}, 3, ("topic", ["music", "cooking"])),
        ShardQuery(vector, "piano chord", 10, 10, {"year": {"between": 1}}),
    ]

    async def both(case):
        monkeypatch.setattr(host_module, "LEGS_APART_MIN_CHUNKS", 10**9)
        alone = await host.search(group, case)
        monkeypatch.setattr(host_module, "LEGS_APART_MIN_CHUNKS", 0)
        apart = await host.search(group, case)
        return alone, apart

    answers = [asyncio.run(both(case)) for case in cases]
    assert answers[0][1].dense and answers[0][1].keyword and answers[0][1].rows  # the oracle is not empty
    assert answers[-1][1].filter_error and answers[1][1].allowed
    for case, (alone, apart) in zip(cases, answers, strict=True):
        assert apart.dense == alone.dense and apart.keyword == alone.keyword, case.text
        assert apart.rows == alone.rows and apart.allowed == alone.allowed, case.text
        assert apart.filter_error == alone.filter_error
    assert threads == {"dense": {"shard-search", "shard-dense"}, "keyword": {"shard-search"}}
    group.close()


def test_shards_asked_for_their_share_merge_to_the_same_top_k(built, monkeypatch):
    """Each shard asked for its likely share of the top k (``shard_depth``) and again for k where its last hit
    could still belong: the same merged legs as every shard asked for k, even when the share is far too small."""
    from deployments.shard import group as group_module
    from deployments.shard.host import ShardHost
    from deployments.shard.shares import shard_depth
    from index_format.encoders import load_encoder
    from index_format.versions import read_version_manifest

    assert [shard_depth(200, n) for n in (1, 2, 4, 16)] == [200, 127, 74, 27] and shard_depth(10, 4) == 10
    _, summary = built[3]
    manifest = read_version_manifest(summary.version_dir)
    host = ShardHost(None, str(summary.version_dir), [p.name for p in shard_dirs(summary)],
                     {"encoder": manifest.encoder, "dimension": manifest.dimension})
    group = host.open_version(summary.version_dir.name)
    encoder = load_encoder(manifest.encoder)
    for depth_of, label in ((lambda k, n: k, "all k"), (lambda k, n: max(1, k // 10), "a tenth")):
        monkeypatch.setattr(group_module, "shard_depth", depth_of)
        answers = []
        for query in QUERIES:
            for filters in (None, {"topic": "music"}):
                answers.append(group.search(ShardQuery(encoder.encode([query])[0], query, 30, 30, filters)))
        if label == "all k":
            expected, asked_again = answers, dict(group.deepened)
        else:
            for got, want in zip(answers, expected, strict=True):
                assert got.dense == want.dense and got.keyword == want.keyword
            # The tenth was too little for some shards, in both legs: they were asked again.
            assert all(group.deepened[leg] > asked_again[leg] for leg in ("dense", "keyword"))
    assert any(a.keyword for a in expected) and any(a.dense for a in expected)
    group.close()


def test_features_without_postings_are_read_on_the_callers_thread_and_equal_the_index_threads(built, monkeypatch):
    """``ShardHost.features`` computes on the index thread whatever calls Lucene (the postings a model reads) or reads
    a shard's chunk table (its lengths, the first time); a model's features that are array reads only are computed
    where asked, without the hop, with no call into Lucene, and equal to those computed on the index thread."""
    import asyncio
    import threading

    from deployments.shard.features import FeatureQuery
    from deployments.shard.host import ShardHost
    from deployments.shard.lucene import FactsReader
    from index_format.encoders import load_encoder
    from index_format.versions import read_version_manifest

    _, summary = built[3]
    manifest = read_version_manifest(summary.version_dir)
    host = ShardHost(None, str(summary.version_dir), [p.name for p in shard_dirs(summary)],
                     {"encoder": manifest.encoder, "dimension": manifest.dimension})
    group = host.open_version(summary.version_dir.name)
    where: list[str] = []
    lucene: list[str] = []
    computed = group.features
    monkeypatch.setattr(group, "features", lambda q: where.append(threading.current_thread().name) or computed(q))
    terms, read = group.terms, FactsReader.read
    monkeypatch.setattr(group, "terms", lambda text: lucene.append("analyze") or terms(text))
    monkeypatch.setattr(FactsReader, "read", lambda self, *a, **k: lucene.append("postings") or read(self, *a, **k))

    text = "telescope galaxy piano"
    ids = [str(c) for s in group.services for c in s.ids[:7]] + ["no-such-chunk#0"]
    vector = load_encoder(manifest.encoder).encode([text])[0]
    no_postings = FeatureQuery(text, ids, vector, frozenset({"dense", "length", "title_length", "position"}))
    every = FeatureQuery(text, ids, vector)

    def ask(query):
        return asyncio.run(host.features(group, query))

    first = ask(no_postings)  # the lengths not read yet: on the index thread
    assert where == ["shard-search_0"] and not lucene
    again = ask(no_postings)  # now array reads only: here
    assert where[1] == threading.current_thread().name != "shard-search_0" and not lucene
    everything = ask(every)
    assert where[2] == "shard-search_0" and lucene == ["analyze", "postings"]
    assert np.isfinite(everything["bm25_contents"][:-1]).all()
    for name in ("dense", "length", "title_length", "position"):
        assert np.isfinite(first[name][:-1]).all() and np.isnan(first[name][-1]), name
        assert np.array_equal(first[name], again[name], equal_nan=True), name
        assert np.array_equal(first[name], everything[name], equal_nan=True), name
    group.close()
