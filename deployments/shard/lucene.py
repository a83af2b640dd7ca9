"""BM25 over one Lucene shard that scores exactly like one unsharded index.

Lucene's BM25 term score is ``boost * idf(df, N) * f / (f + k1 * (1 - b + b * L / avgdl))`` computed
with the statistics of the index it searches. A shard sees its own N, df and avgdl. Given the
corpus-wide statistics stored at build time, the shard is made to score like the whole corpus with no
extra round trip (Elasticsearch's ``dfs_query_then_fetch`` does one):

* the length norm: with ``r = avgdl_shard / avgdl_corpus``, searching the shard with
  ``k1' = k1 * (1 - b) + k1 * b * r`` and ``b' = k1 * b * r / k1'`` gives the same denominator for every
  document length L (expand both sides);
* the idf: each query term's clause gets the boost ``count(t in query) * idf_corpus(t) / idf_shard(t)``;
  a term absent from the shard is left out (it would score nothing there anyway).

The searcher stays pure Lucene; only parameters and boosts change. Lucene classes are used through
jnius directly (``index_format.lucene.boot`` starts the JVM): importing ``pyserini.search`` would load
torch for nothing. Where a JDK compiled the small Java helper (``raysearch.ShardSearch``), a search is
one JNI call that builds the same query and returns the hits as primitive arrays; without it, the same
query is built and read clause by clause and hit by hit through pyjnius proxies (~1 ms more a shard).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from index_format.bm25_stats import CollectionStats, lucene_idf
from index_format.lucene import CONTENTS_FIELD, HELPER_CLASS, boot

MAX_CLAUSES = 1024  # Lucene's default BooleanQuery clause limit


def shard_bm25_params(k1: float, b: float, avgdl_shard: float, avgdl_corpus: float) -> tuple[float, float]:
    """(k1', b') that make a shard's length norm equal the corpus's (see the module docstring)."""
    if avgdl_corpus <= 0 or avgdl_shard <= 0:
        return k1, b
    r = avgdl_shard / avgdl_corpus
    k1_shard = k1 * (1 - b) + k1 * b * r
    return k1_shard, (k1 * b * r / k1_shard) if k1_shard else b


class _Java:
    """Lucene and Anserini classes, resolved once per process after the JVM is up."""

    _loaded = False

    @classmethod
    def load(cls) -> type[_Java]:
        if not cls._loaded:
            boot()
            from jnius import autoclass

            for name, path in {
                "File": "java.io.File",
                "ArrayList": "java.util.ArrayList",
                "FSDirectory": "org.apache.lucene.store.FSDirectory",
                "DirectoryReader": "org.apache.lucene.index.DirectoryReader",
                "IndexSearcher": "org.apache.lucene.search.IndexSearcher",
                "BM25Similarity": "org.apache.lucene.search.similarities.BM25Similarity",
                "Term": "org.apache.lucene.index.Term",
                "TermQuery": "org.apache.lucene.search.TermQuery",
                "BoostQuery": "org.apache.lucene.search.BoostQuery",
                "BooleanQueryBuilder": "org.apache.lucene.search.BooleanQuery$Builder",
                "Occur": "org.apache.lucene.search.BooleanClause$Occur",
                "TermInSetQuery": "org.apache.lucene.search.TermInSetQuery",
                "TopScoreDocCollector": "org.apache.lucene.search.TopScoreDocCollector",
                "BytesRef": "org.apache.lucene.util.BytesRef",
                "AnalyzerUtils": "io.anserini.analysis.AnalyzerUtils",
                "DefaultEnglishAnalyzer": "io.anserini.analysis.DefaultEnglishAnalyzer",
            }.items():
                setattr(cls, name, autoclass(path))
            try:
                cls.ShardSearch = autoclass(HELPER_CLASS)
            except Exception:  # no JDK compiled it (see index_format.lucene.helper_classes)
                cls.ShardSearch = None
            cls._loaded = True
        return cls


class QueryAnalyzer:
    """The analyzer the indexer used (Anserini's default English: Porter stemming, stopwords)."""

    def __init__(self):
        self.j = _Java.load()
        self.analyzer = self.j.DefaultEnglishAnalyzer.newDefaultInstance()

    def analyze(self, text: str) -> list[str]:
        if self.j.ShardSearch is not None:
            return list(self.j.ShardSearch.analyze(self.analyzer, CONTENTS_FIELD, text))
        return [str(t) for t in self.j.AnalyzerUtils.analyze(self.analyzer, text).toArray()]


class LuceneShard:
    def __init__(
        self,
        index_dir: Path,
        chunk_ids: Sequence[str],
        shard_stats: Mapping[str, int],
        corpus: CollectionStats,
        corpus_df: Mapping[str, int],
        shard: int = -1,
        use_helper: bool = True,
    ):
        """``use_helper=False`` searches through pyjnius proxies even where the Java helper is compiled
        (the path of machines without a JDK; tests compare the two)."""
        j = self.j = _Java.load()
        self.shard = shard
        self.corpus = corpus
        self.corpus_df = corpus_df
        self.reader = j.DirectoryReader.open(j.FSDirectory.open(j.File(str(index_dir)).toPath()))
        from jnius import cast

        self.searcher = j.IndexSearcher(cast("org.apache.lucene.index.IndexReader", self.reader))
        # Lucene scores with its own N and average length, which count deleted documents until their segment
        # is merged (a folded shard's replaced chunks: ``index_build.fold``). The boosts and (k1', b') are
        # made from the same numbers, so they cancel exactly and the score is the live corpus's.
        lucene_stats = self.searcher.collectionStatistics(CONTENTS_FIELD)
        if lucene_stats is not None:
            self.doc_count, total_terms = int(lucene_stats.docCount()), int(lucene_stats.sumTotalTermFreq())
        else:  # no document has a term
            self.doc_count, total_terms = int(shard_stats["non_empty_documents"]), int(shard_stats["total_terms"])
        avgdl = total_terms / self.doc_count if self.doc_count else 0.0
        self.k1, self.b = shard_bm25_params(corpus.k1, corpus.b, avgdl, corpus.avgdl)
        self.searcher.setSimilarity(j.BM25Similarity(float(self.k1), float(self.b)))
        self.chunk_ids = list(chunk_ids)
        # Lucene doc number -> row of the shard's chunk table (the FAISS row too).
        row_of = {cid: i for i, cid in enumerate(self.chunk_ids)}
        stored = self.reader.storedFields()
        # A deleted document (a folded shard's replaced chunk) is never a hit; its id may be gone from the table.
        self.row_of_doc = np.array([row_of.get(stored.document(d).get("id"), -1) for d in range(self.reader.maxDoc())],
                                   dtype=np.int64)
        self.analyzer = QueryAnalyzer()
        self.fast = use_helper and j.ShardSearch is not None
        live = np.flatnonzero(self.row_of_doc >= 0)
        self.doc_of_row = np.full(len(self.chunk_ids), -1, dtype=np.int64)  # chunk-table row -> Lucene doc number
        self.doc_of_row[self.row_of_doc[live]] = live

    def close(self) -> None:
        self.reader.close()

    def shard_df(self, term: str) -> int:
        return int(self.reader.docFreq(self.j.Term(CONTENTS_FIELD, term)))

    def build_query(self, terms: list[str]):
        """Bag-of-words SHOULD clauses, each boosted so the shard's idf becomes the corpus idf."""
        j = self.j
        builder = j.BooleanQueryBuilder()
        clauses = 0
        for term, count in sorted(Counter(terms).items()):
            df_shard, df_corpus = self.shard_df(term), int(self.corpus_df.get(term, 0))
            if df_shard == 0 or df_corpus == 0 or clauses >= MAX_CLAUSES:
                continue
            boost = count * lucene_idf(self.corpus.doc_count, df_corpus) / lucene_idf(self.doc_count, df_shard)
            builder.add(j.BoostQuery(j.TermQuery(j.Term(CONTENTS_FIELD, term)), float(boost)), j.Occur.SHOULD)
            clauses += 1
        return builder, clauses

    def term_masks(self, terms: Sequence[str], rows: np.ndarray) -> np.ndarray:
        """Which of the distinct ``terms`` (at most 64, in their order) each chunk-table row holds, as bits of one
        uint64 a row: bit i set when the row holds ``terms[i]``."""
        terms = list(terms)[:64]
        if self.fast:
            docs = self.doc_of_row[rows]
            return np.asarray(self.j.ShardSearch.termMasks(self.reader, CONTENTS_FIELD, terms, docs.tolist()),
                              dtype=np.int64).view(np.uint64)
        masks = np.zeros(len(rows), dtype=np.uint64)
        for i, term in enumerate(terms):  # one filtered search a term
            masks[np.isin(rows, self.search_rows([term], len(rows), rows.tolist())[0])] |= np.uint64(1 << i)
        return masks

    def shared_top_k(self, k: int):
        """One query's top-k collector, shared by shards searched one after another in this process (pass it
        as ``shared`` to each): once a shard has k hits, its k-th score bounds the group's k-th score, and
        the next shards skip every block of postings that cannot reach it. Scores are comparable across
        shards because each is corpus-exact, so the merged top k is the same; only less work is done (at a
        million chunks in 4 shards, BM25 was most of a query's CPU)."""
        j = self.j
        if j.ShardSearch is not None:
            return j.ShardSearch.sharedTopK(int(k))
        return j.TopScoreDocCollector.createSharedManager(int(k), None, int(k))

    def search_rows(self, terms: list[str], k: int, allowed_rows: Sequence[int] | None = None,
                    shared=None) -> tuple[np.ndarray, np.ndarray]:
        """(chunk-table rows, float32 scores) of the top-k by corpus-exact BM25 over the query's analyzed ``terms``
        (``QueryAnalyzer.analyze``), best first; ``allowed_rows`` restricts the search itself (a FILTER clause).
        With ``shared`` (``shared_top_k``), hits below another shard's k-th score are left out."""
        if self.fast:
            return self._search_fast(terms, k, allowed_rows, shared)
        return self._search_proxies(terms, k, allowed_rows, shared)

    def _search_fast(self, terms, k, allowed_rows, shared=None):
        counted = sorted(Counter(terms).items())
        allowed = None
        if allowed_rows is not None:
            allowed = [self.chunk_ids[r] for r in allowed_rows]
        found = self.j.ShardSearch.search(
            self.searcher, CONTENTS_FIELD, [t for t, _ in counted], [c for _, c in counted],
            [int(self.corpus_df.get(t, 0)) for t, _ in counted], int(self.corpus.doc_count), self.doc_count,
            MAX_CLAUSES, int(k), "id", allowed, shared)
        docs = np.asarray(found.docs, dtype=np.int64)
        return self.row_of_doc[docs], np.asarray(found.scores, dtype=np.float32)

    def _search_proxies(self, terms, k, allowed_rows, shared=None):
        empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
        builder, clauses = self.build_query(terms)
        if clauses == 0 or k <= 0 or (allowed_rows is not None and len(allowed_rows) == 0):
            return empty
        if allowed_rows is not None:
            ids = self.j.ArrayList()
            for row in allowed_rows:
                ids.add(self.j.BytesRef(self.chunk_ids[row].encode("utf-8")))
            builder.add(self.j.TermInSetQuery("id", ids), self.j.Occur.FILTER)
            # With a FILTER clause, SHOULD clauses become optional: without this every allowed chunk would
            # match with score 0, query terms or not.
            builder.setMinimumNumberShouldMatch(1)
        from jnius import cast

        collector = shared.newCollector() if shared is not None else self.j.TopScoreDocCollector.create(int(k), int(k))
        self.searcher.search(builder.build(), cast("org.apache.lucene.search.Collector", collector))
        top = cast("org.apache.lucene.search.TopScoreDocCollector", collector).topDocs()
        docs = np.array([sd.doc for sd in top.scoreDocs], dtype=np.int64)
        return self.row_of_doc[docs], np.array([sd.score for sd in top.scoreDocs], dtype=np.float32)
