import math

import pyarrow as pa
import pytest

from index_format.bm25_stats import (
    CollectionStats,
    merge_shard_stats,
    merge_term_tables,
    read_stats,
    write_stats,
)


def test_shard_statistics_add_up():
    a = {"documents": 4, "non_empty_documents": 3, "total_terms": 30, "unique_terms": 9}
    b = {"documents": 2, "non_empty_documents": 2, "total_terms": 10, "unique_terms": 5}
    stats = merge_shard_stats([a, b], k1=0.9, b=0.4)
    assert (stats.doc_count, stats.total_terms, stats.documents) == (5, 40, 6)
    assert stats.avgdl == pytest.approx(40 / 5)


def test_term_tables_sum_by_term_and_sort():
    t1 = pa.table({"term": ["ray", "lucen"], "df": [2, 1], "cf": [3, 1]})
    t2 = pa.table({"term": ["lucen", "faiss"], "df": [4, 1], "cf": [5, 2]})
    merged = merge_term_tables([t1, t2, t1.slice(0, 0)])
    assert merged.to_pylist() == [
        {"term": "faiss", "df": 1, "cf": 2},
        {"term": "lucen", "df": 5, "cf": 6},
        {"term": "ray", "df": 2, "cf": 3},
    ]
    assert merge_term_tables([]).num_rows == 0


def test_idf_is_lucene_bm25():
    stats = CollectionStats(doc_count=10, total_terms=100, documents=10, unique_terms=0, k1=0.9, b=0.4)
    assert stats.idf(3) == pytest.approx(math.log(1 + (10 - 3 + 0.5) / (3 + 0.5)))


def test_round_trip(tmp_path):
    stats = CollectionStats(5, 40, 6, 0, 0.9, 0.4)
    terms = pa.table({"term": ["a", "b"], "df": [1, 2], "cf": [1, 3]})
    write_stats(tmp_path, stats, terms)
    back, back_terms = read_stats(tmp_path)
    assert back.doc_count == 5 and back.unique_terms == 2 and back_terms.equals(terms)
