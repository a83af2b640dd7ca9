"""Corpus-wide BM25 statistics from per-shard Lucene statistics.

Lucene's BM25 (``BM25Similarity``) scores a term with
``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` and a length norm over ``avgdl = sumTotalTermFreq / N``,
where N is the field's ``docCount`` (documents that have at least one term). A shard alone knows only
its own N, df and avgdl, so its scores differ from one unsharded index. Every document lives in exactly
one shard, so the corpus values are plain sums: N = sum of the shards' non-empty documents,
sumTotalTermFreq = sum of their total terms, df(t) = sum of their df(t). Query time uses these to score
every shard as if it were the whole corpus.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True)
class CollectionStats:
    doc_count: int  # Lucene docCount of the contents field
    total_terms: int  # sumTotalTermFreq of the contents field
    documents: int  # all indexed documents, empty ones included
    unique_terms: int
    k1: float
    b: float

    @property
    def avgdl(self) -> float:
        return self.total_terms / self.doc_count if self.doc_count else 0.0

    def idf(self, df: int) -> float:
        """Lucene 9 BM25 idf of a term over this corpus (``lucene_idf``)."""
        return lucene_idf(self.doc_count, df)


# Lucene 9's BM25, as ``org.apache.lucene.search.similarities.BM25Similarity`` computes it (Robertson and
# Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009, with Lucene's +1 inside the idf's
# logarithm, so a term in more than half the documents still scores above 0). A term's score in a document is
# ``boost * idf(df, N) * tf / (tf + length_norm(dl))``; Lucene drops the (k1 + 1) factor of the paper, which
# changes no ranking.


def lucene_idf(doc_count: int, df: int) -> float:
    """``ln(1 + (N - df + 0.5) / (df + 0.5))``: N documents with the field, df of them holding the term."""
    return math.log(1 + (doc_count - df + 0.5) / (df + 0.5))


def length_norm(k1: float, b: float, doc_length, avgdl: float):
    """``k1 * (1 - b + b * dl / avgdl)``: the tf saturation's denominator term (a float, or an array of lengths)."""
    return k1 * (1 - b + b * doc_length / avgdl)


def term_score(tf, norm, idf: float, boost: float = 1.0):
    """``boost * idf * tf / (tf + norm)``, with ``norm`` from ``length_norm`` (floats, or arrays alike)."""
    return boost * idf * tf / (tf + norm)


def merge_shard_stats(shard_stats: list[dict], k1: float, b: float) -> CollectionStats:
    """Sum Pyserini ``IndexReader.stats()`` dicts of disjoint shards (unique_terms filled in later)."""
    return CollectionStats(
        doc_count=sum(s["non_empty_documents"] for s in shard_stats),
        total_terms=sum(s["total_terms"] for s in shard_stats),
        documents=sum(s["documents"] for s in shard_stats),
        unique_terms=0,
        k1=k1,
        b=b,
    )


def merge_term_tables(tables: list[pa.Table]) -> pa.Table:
    """One (term, df, cf) row per term, summed over shards, sorted by term for binary search."""
    schema = pa.schema([("term", pa.string()), ("df", pa.int64()), ("cf", pa.int64())])
    tables = [t.select(["term", "df", "cf"]).cast(schema) for t in tables if t.num_rows]
    if not tables:
        return schema.empty_table()
    merged = pa.concat_tables(tables).group_by("term").aggregate([("df", "sum"), ("cf", "sum")])
    merged = merged.select(["term", "df_sum", "cf_sum"]).rename_columns(["term", "df", "cf"])
    return merged.sort_by("term")


def write_stats(folder: Path, stats: CollectionStats, terms: pa.Table) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(terms, folder / "terms.parquet")
    body = asdict(stats) | {"unique_terms": terms.num_rows, "avgdl": stats.avgdl}
    (folder / "stats.json").write_text(json.dumps(body, indent=2, sort_keys=True))


def read_collection_stats(folder: Path) -> CollectionStats:
    """The corpus-wide statistics alone (``stats.json``), without the term table."""
    body = json.loads((folder / "stats.json").read_text())
    body.pop("avgdl", None)
    return CollectionStats(**body)


def read_stats(folder: Path) -> tuple[CollectionStats, pa.Table]:
    return read_collection_stats(folder), pq.read_table(folder / "terms.parquet")


# Fields beside ``contents`` (a title): each has statistics of its own, since Lucene scores a field with that
# field's N (documents holding a term in it), average length and df. ``contents`` keeps the top of ``bm25/``, as
# in every version built before fields, which therefore reads as one with ``contents`` alone.
FIELDS_DIR = "fields"


def field_folder(bm25_dir: Path, field: str) -> Path:
    """Where one field's corpus statistics live under a version's ``bm25/`` folder."""
    from index_format.lucene import CONTENTS_FIELD

    return bm25_dir if field == CONTENTS_FIELD else bm25_dir / FIELDS_DIR / field


def extra_fields(bm25_dir: Path) -> list[str]:
    """The fields beside ``contents`` a version has statistics for (none in a version built before fields)."""
    folder = bm25_dir / FIELDS_DIR
    return sorted(p.name for p in folder.iterdir() if (p / "stats.json").is_file()) if folder.is_dir() else []


def read_field_stats(bm25_dir: Path) -> dict[str, tuple[CollectionStats, pa.Table]]:
    """Each field's (corpus statistics, term table) beside ``contents``."""
    return {name: read_stats(field_folder(bm25_dir, name)) for name in extra_fields(bm25_dir)}
