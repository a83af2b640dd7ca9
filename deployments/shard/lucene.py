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

Fields. A title (or any field the build was told about: ``index_build.config.BuildConfig.bm25_fields``) is a
Lucene field of its own beside ``contents``, with corpus statistics of its own (``bm25/fields/<name>/``). Each
field has its own average length, so its own (k1', b') (Lucene's ``PerFieldSimilarityWrapper``, made in the
Java helper) and its own idf boosts. A query with ``weights`` {field: w} is one BooleanQuery of every (field,
term) clause, boosted by ``w`` too: the weighted sum of the fields' corpus-exact BM25 (Elasticsearch's
``multi_match`` of type ``most_fields``). Without the helper (no JDK) each field is searched by a searcher of its
own (pyjnius cannot subclass the wrapper) and a query of several fields scores every match of each and sums them
in numpy: the same scores, at a cost that grows with the matches (only machines without a JDK pay it).

The searcher stays pure Lucene; only parameters and boosts change. Lucene classes are used through
jnius directly (``index_format.lucene.boot`` starts the JVM): importing ``pyserini.search`` would load
torch for nothing. Where a JDK compiled the small Java helper (``raysearch.ShardSearch``), a search is
one JNI call that builds the same query and returns the hits as primitive arrays; without it, the same
query is built and read clause by clause and hit by hit through pyjnius proxies (~1 ms more a shard).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from deployments.shard.chunk_ids import ids_at, rows_of
from deployments.shard.query import MAX_QUERY_CLAUSES
from index_format.bm25_stats import CollectionStats, lucene_idf
from index_format.lucene import CONTENTS_FIELD, HELPER_CLASS, boot


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
                cls.Shards = autoclass(f"{HELPER_CLASS}$Shards")
            except Exception:  # no JDK compiled it (see index_format.lucene.helper_classes)
                cls.ShardSearch = cls.Shards = None
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


@dataclass(frozen=True)
class FieldStats:
    """One Lucene field's corpus statistics: what its BM25 is made corpus-exact with."""

    corpus: CollectionStats
    df: Mapping[str, int]


@dataclass(frozen=True)
class _Field:
    stats: FieldStats
    doc_count: int  # Lucene's docCount of the field in this shard (deleted documents included, as it scores)
    k1: float
    b: float


class UnknownField(ValueError):
    """A field weight names a field this index version does not hold."""


class LuceneShard:
    def __init__(
        self,
        index_dir: Path,
        chunk_ids: Sequence[str],
        shard_stats: Mapping[str, Any],
        corpus: CollectionStats,
        corpus_df: Mapping[str, int],
        shard: int = -1,
        use_helper: bool = True,
        fields: Mapping[str, FieldStats] | None = None,
        row_of_doc: np.ndarray | None = None,
    ):
        """``fields``: the statistics of the Lucene fields beside ``contents`` (``corpus``, ``corpus_df``); none in
        a version built before fields. ``row_of_doc``: the map written beside the index (``DOC_ROWS_FILE``); without
        it (a version built before it) every document's stored id is read. ``use_helper=False`` searches through pyjnius proxies even where the Java
        helper is compiled (the path of machines without a JDK; tests compare the two)."""
        j = self.j = _Java.load()
        self.shard = shard
        self.corpus = corpus
        self.corpus_df = corpus_df
        self.reader = j.DirectoryReader.open(j.FSDirectory.open(j.File(str(index_dir)).toPath()))
        self.fast = use_helper and j.ShardSearch is not None
        from jnius import cast

        every = {CONTENTS_FIELD: FieldStats(corpus, corpus_df)} | dict(fields or {})
        self.fields: dict[str, _Field] = {}
        self.searchers = {}  # field -> a searcher scoring it (one, with per-field parameters, on the helper's path)
        for name, stats in every.items():
            searcher = j.IndexSearcher(cast("org.apache.lucene.index.IndexReader", self.reader))
            # Lucene scores with its own N and average length, which count deleted documents until their segment is
            # merged (a folded shard's replaced chunks: ``index_build.fold``). The boosts and (k1', b') are made from
            # the same numbers, so they cancel exactly and the score is the live corpus's.
            lucene_stats = searcher.collectionStatistics(name)
            if lucene_stats is not None:
                doc_count, total_terms = int(lucene_stats.docCount()), int(lucene_stats.sumTotalTermFreq())
            else:  # no document has a term in it
                own = shard_stats if name == CONTENTS_FIELD else shard_stats.get("fields", {}).get(name, {})
                doc_count, total_terms = int(own.get("non_empty_documents", 0)), int(own.get("total_terms", 0))
            avgdl = total_terms / doc_count if doc_count else 0.0
            k1, b = shard_bm25_params(stats.corpus.k1, stats.corpus.b, avgdl, stats.corpus.avgdl)
            self.fields[name] = _Field(stats, doc_count, k1, b)
            if not self.fast:
                searcher.setSimilarity(j.BM25Similarity(float(k1), float(b)))
            self.searchers[name] = searcher
        if self.fast:  # one searcher holds every field's parameters
            names = list(self.fields)
            self.searchers[CONTENTS_FIELD].setSimilarity(j.ShardSearch.perFieldBM25(
                names, [float(self.fields[f].k1) for f in names], [float(self.fields[f].b) for f in names]))
            self.searchers = dict.fromkeys(self.fields, self.searchers[CONTENTS_FIELD])
        self.searcher = self.searchers[CONTENTS_FIELD]
        contents = self.fields[CONTENTS_FIELD]
        self.doc_count, self.k1, self.b = contents.doc_count, contents.k1, contents.b
        self.chunk_ids = chunk_ids  # a shard's ChunkIds (read where needed), or a test's list
        # Lucene doc number -> row of the shard's chunk table (the FAISS row too), 4 bytes a document.
        if row_of_doc is not None and len(row_of_doc) == self.reader.maxDoc():
            self.row_of_doc = np.asarray(row_of_doc, dtype=np.int32)
        else:
            stored = self.reader.storedFields()
            # A deleted document (a folded shard's replaced chunk) is never a hit; its id may be gone from the table.
            self.row_of_doc = rows_of(chunk_ids, [stored.document(d).get("id") for d in range(self.reader.maxDoc())]
                                      ).astype(np.int32)
        self.analyzer = QueryAnalyzer()
        live = np.flatnonzero(self.row_of_doc >= 0)
        self.doc_of_row = np.full(len(self.chunk_ids), -1, dtype=np.int32)  # chunk-table row -> Lucene doc number
        self.doc_of_row[self.row_of_doc[live]] = live

    def close(self) -> None:
        self.reader.close()

    def shard_df(self, term: str, field: str = CONTENTS_FIELD) -> int:
        return int(self.reader.docFreq(self.j.Term(field, term)))

    def weights_of(self, weights: Mapping[str, float] | None) -> dict[str, float]:
        """The fields a search scores and their weights (None: ``contents`` alone, 1.0); a weight of 0 leaves its
        field out. Raises ``UnknownField`` naming the fields held."""
        weights = {CONTENTS_FIELD: 1.0} if weights is None else weights
        unknown = sorted(set(weights) - set(self.fields))
        if unknown:
            raise UnknownField(f"field_weights names {unknown}, which this index version does not hold; its fields: "
                               f"{sorted(self.fields)}")
        return {f: float(w) for f, w in sorted(weights.items()) if w}

    def clauses(self, terms: list[str], weights: Mapping[str, float]) -> list[tuple[str, str, float]]:
        """(field, term, factor) per field and distinct query term: the factor is the term's count in the query
        times the field's weight (``weights_of``), before the idf boost."""
        counted = sorted(Counter(terms).items())
        return [(f, t, c * w) for f, w in weights.items() for t, c in counted]

    def build_query(self, terms: list[str], weights: Mapping[str, float] | None = None):
        """Bag-of-words SHOULD clauses, each boosted so the shard's idf becomes the corpus idf (and by its field's
        weight)."""
        j = self.j
        builder = j.BooleanQueryBuilder()
        clauses = 0
        for name, term, factor in self.clauses(terms, self.weights_of(weights)):
            f = self.fields[name]
            df_shard, df_corpus = self.shard_df(term, name), int(f.stats.df.get(term, 0))
            if df_shard == 0 or df_corpus == 0 or clauses >= MAX_QUERY_CLAUSES:
                continue
            boost = factor * lucene_idf(f.stats.corpus.doc_count, df_corpus) / lucene_idf(f.doc_count, df_shard)
            builder.add(j.BoostQuery(j.TermQuery(j.Term(name, term)), float(boost)), j.Occur.SHOULD)
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

    def candidate_facts(self, terms: list[str], rows: np.ndarray, mask_terms: Sequence[str]
                        ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """A ranking model's view of the chunk-table ``rows``: each field's ``scores_of`` with that field alone, and
        ``term_masks`` of ``mask_terms`` (at most 64). On the helper's path one call reads both from the postings
        (``ShardSearch.candidateFacts``); without it, one call each."""
        rows = np.asarray(rows, dtype=np.int64)
        mask_terms = list(mask_terms)[:64]
        if not self.fast:
            return self._facts_apart(terms, rows, mask_terms)
        return self.facts_reader.read([rows], terms, mask_terms)[:2]

    def _facts_apart(self, terms: list[str], rows: np.ndarray, mask_terms: list[str],
                     fields: Sequence[str] | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """``candidate_facts`` without the helper: each field's ``scores_of`` (of ``fields``, None: all) and the
        ``term_masks`` apart."""
        return ({f: self.scores_of(terms, rows, {f: 1.0}) for f in (self.fields if fields is None else fields)},
                self.term_masks(mask_terms, rows) if mask_terms else np.zeros(len(rows), dtype=np.uint64))

    @functools.cached_property
    def facts_reader(self) -> FactsReader:
        return FactsReader([self])

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
                    shared=None, weights: Mapping[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(chunk-table rows, float32 scores) of the top-k by corpus-exact BM25 over the query's analyzed ``terms``
        (``QueryAnalyzer.analyze``), best first; ``allowed_rows`` restricts the search itself (a FILTER clause).
        ``weights`` {field: weight} (None: ``contents`` alone): the score is the weighted sum of the fields' BM25;
        ``{"title": 1.0}`` scores the title alone. With ``shared`` (``shared_top_k``), hits below another shard's
        k-th score may be left out."""
        weights = self.weights_of(weights)
        if self.fast:
            return self._search_fast(terms, k, allowed_rows, shared, weights)
        if len(weights) > 1:
            return self._search_fields_proxies(terms, k, allowed_rows, weights)
        return self._search_proxies(terms, k, allowed_rows, shared, weights)

    def _helper_clauses(self, terms, weights) -> list:
        """The helper's clause arguments (fields, terms, factors, corpus df, corpus and shard doc counts, the
        cap), the same for ``ShardSearch.search`` and ``ShardSearch.scoreDocs``."""
        clauses = self.clauses(terms, weights)
        fields = [self.fields[name] for name, _, _ in clauses]
        return [self.searcher, [name for name, _, _ in clauses], [t for _, t, _ in clauses],
                [float(factor) for _, _, factor in clauses],
                [int(f.stats.df.get(t, 0)) for f, (_, t, _) in zip(fields, clauses, strict=True)],
                [int(f.stats.corpus.doc_count) for f in fields], [int(f.doc_count) for f in fields], MAX_QUERY_CLAUSES]

    def _search_fast(self, terms, k, allowed_rows, shared, weights):
        allowed = None
        if allowed_rows is not None:
            allowed = ids_at(self.chunk_ids, allowed_rows)
        found = self.j.ShardSearch.search(*self._helper_clauses(terms, weights), int(k), "id", allowed, shared)
        docs = np.asarray(found.docs, dtype=np.int64)
        return self.row_of_doc[docs].astype(np.int64), np.asarray(found.scores, dtype=np.float32)

    def scores_of(self, terms: list[str], rows: np.ndarray, weights: Mapping[str, float] | None = None) -> np.ndarray:
        """The score ``search_rows`` gives each chunk-table row of ``rows`` (float32 in their order, 0 where no term
        matches): a ranking model's BM25 of chosen candidates. The helper advances the query's scorer to their
        Lucene doc numbers; without it, one search filtered to the rows."""
        weights = self.weights_of(weights)
        rows = np.asarray(rows, dtype=np.int64)
        if self.fast:
            docs = self.doc_of_row[rows].tolist()
            return np.asarray(self.j.ShardSearch.scoreDocs(*self._helper_clauses(terms, weights), docs),
                              dtype=np.float32)
        scores = np.zeros(len(rows), dtype=np.float32)
        if len(rows):
            hit_rows, hit_scores = self.search_rows(terms, len(rows), rows.tolist(), weights=weights)
            position = {int(r): i for i, r in enumerate(rows)}
            scores[[position[int(r)] for r in hit_rows]] = hit_scores
        return scores

    def _filtered(self, builder, allowed_rows):
        ids = self.j.ArrayList()
        for chunk_id in ids_at(self.chunk_ids, allowed_rows):
            ids.add(self.j.BytesRef(chunk_id.encode("utf-8")))
        builder.add(self.j.TermInSetQuery("id", ids), self.j.Occur.FILTER)
        # With a FILTER clause, SHOULD clauses become optional: without this every allowed chunk would
        # match with score 0, query terms or not.
        builder.setMinimumNumberShouldMatch(1)

    def _search_proxies(self, terms, k, allowed_rows, shared, weights):
        empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
        builder, clauses = self.build_query(terms, weights)
        if clauses == 0 or k <= 0 or (allowed_rows is not None and len(allowed_rows) == 0):
            return empty
        if allowed_rows is not None:
            self._filtered(builder, allowed_rows)
        from jnius import cast

        collector = shared.newCollector() if shared is not None else self.j.TopScoreDocCollector.create(int(k), int(k))
        self.searchers[next(iter(weights))].search(builder.build(), cast("org.apache.lucene.search.Collector", collector))
        top = cast("org.apache.lucene.search.TopScoreDocCollector", collector).topDocs()
        docs = np.array([sd.doc for sd in top.scoreDocs], dtype=np.int64)
        return self.row_of_doc[docs].astype(np.int64), np.array([sd.score for sd in top.scoreDocs], dtype=np.float32)

    def _search_fields_proxies(self, terms, k, allowed_rows, weights):
        """Several fields without the helper: every match of each field scored by its own searcher, summed."""
        total: Counter = Counter()
        if k > 0 and (allowed_rows is None or len(allowed_rows)):
            for name, weight in weights.items():
                builder, clauses = self.build_query(terms, {name: weight})
                if clauses == 0:
                    continue
                if allowed_rows is not None:
                    self._filtered(builder, allowed_rows)
                query = builder.build()
                searcher = self.searchers[name]
                matches = int(searcher.count(query))
                for sd in searcher.search(query, max(matches, 1)).scoreDocs if matches else []:
                    total[int(sd.doc)] += float(sd.score)
        best = sorted(total.items(), key=lambda item: (-np.float32(item[1]), item[0]))[:k]  # Lucene's tie rule
        docs = np.array([d for d, _ in best], dtype=np.int64)
        return self.row_of_doc[docs].astype(np.int64), np.array([s for _, s in best], dtype=np.float32)


class Facts(NamedTuple):
    """What ``FactsReader.read`` reads of candidates: each field's BM25 and the mask terms' bits (bit t: the candidate
    holds mask term t), in the candidates' order; and, where the JVM read them and was given the terms' weights, the
    shares of the mask terms each candidate holds, plain and weighted (else None: ``features.coverage`` of the bits
    gives them)."""

    fields: dict[str, np.ndarray]
    masks: np.ndarray
    coverage: tuple[np.ndarray, np.ndarray] | None = None


class FactsReader:
    """``LuceneShard.candidate_facts`` of fixed shards of one version (a shard group's, or one shard's), read for a
    query's candidates in all of them at once. On the helper's path the shards are held in the JVM
    (``ShardSearch.Shards``) with their fields' document counts, and a query's call carries only its clauses, its
    mask terms and its candidates' doc numbers (as bytes), and its answer comes back as one byte array: what crosses
    through pyjnius costs by its elements."""

    def __init__(self, shards: Sequence[LuceneShard]):
        self.shards = list(shards)
        first = self.shards[0]
        self.weights = first.weights_of(dict.fromkeys(first.fields, 1.0))  # every field, in the order scored
        self.names = list(self.weights)
        self.field_at = {f: i for i, f in enumerate(self.names)}
        self.java = None
        if all(s.fast for s in self.shards):
            self.java = first.j.Shards(
                [s.searcher for s in self.shards], self.names,
                [int(s.fields[f].doc_count) for s in self.shards for f in self.names],
                [int(first.fields[f].stats.corpus.doc_count) for f in self.names], CONTENTS_FIELD)

    def read(self, rows: Sequence[np.ndarray], terms: list[str], mask_terms: Sequence[str],
             mask_weights: Sequence[float] | None = None, fields: Sequence[str] | None = None) -> Facts:
        """The BM25 of each of ``fields`` (None: every field) and the ``mask_terms`` masks (at most 64 terms) of each
        shard's chunk-table ``rows``, as columns over those rows one shard after another; with ``mask_weights`` (one a
        mask term), their coverage too where the JVM reads them. A field not asked for costs nothing: its terms are
        not looked up."""
        rows = [np.asarray(r, dtype=np.int64) for r in rows]
        mask_terms = list(mask_terms)[:64]
        names = self.names if fields is None else [f for f in self.names if f in fields]
        if self.java is None:
            parts = [s._facts_apart(terms, r, mask_terms, names) for s, r in zip(self.shards, rows, strict=True)]
            return Facts({f: np.concatenate([got[f] for got, _ in parts]) for f in names},
                         np.concatenate([masks for _, masks in parts]))
        first = self.shards[0]
        clauses = first.clauses(terms, self.weights if fields is None else {f: self.weights[f] for f in names})
        docs = np.concatenate([s.doc_of_row[r] for s, r in zip(self.shards, rows, strict=True)]).astype("<i4")
        weights = [float(w) for w in mask_weights][:64] if mask_weights is not None else [0.0] * len(mask_terms)
        packed = self.java.facts(
            [self.field_at[f] for f, _, _ in clauses], "\n".join(t for _, t, _ in clauses),
            [float(factor) for *_, factor in clauses], [int(first.fields[f].stats.df.get(t, 0)) for f, t, _ in clauses],
            MAX_QUERY_CLAUSES, "\n".join(mask_terms), weights, [len(r) for r in rows], docs.tobytes()).tostring()
        n, fields = len(docs), len(self.names)
        floats = np.frombuffer(packed, dtype="<f4", count=(fields + 2) * n)
        scores, plain, weighted = floats[:fields * n].reshape(fields, n), floats[fields * n:-n], floats[-n:]
        masks = np.frombuffer(packed, dtype="<u8", offset=4 * len(floats))
        return Facts({f: scores[self.field_at[f]] for f in names}, masks,
                     (plain, weighted) if mask_weights is not None else None)
