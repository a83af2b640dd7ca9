"""Inputs named by a URL: which objects a URL names (one key, a prefix as a folder, a glob), in name order."""

from __future__ import annotations

import pytest

from index_build.corpus import CorpusError
from index_build.inputs import locate
from index_format.store import open_store


@pytest.fixture
def bucket(s3_root) -> str:
    """``s3://<bucket>/data/`` holding a BEIR folder and a folder of part files."""
    bucket = s3_root.removesuffix("/idx")
    store = open_store(bucket)
    for key in ("beir/corpus.jsonl", "beir/queries.jsonl", "parts/part-2.parquet", "parts/part-10.jsonl",
                "parts/notes.txt", "parts/old/part-1.jsonl"):
        store.put(f"data/{key}", key.encode())
    return f"{bucket}/data"


@pytest.mark.parametrize("name, keys", [
    ("beir/corpus.jsonl", ["corpus.jsonl"]),  # one object
    ("beir", ["corpus.jsonl"]),  # a BEIR folder: its corpus file, not its queries
    ("parts/", ["part-10.jsonl", "part-2.parquet"]),  # a folder of parts: name order, not nested, corpus files only
    ("parts/part-1*", ["part-10.jsonl"]),  # a glob in the last segment
])
def test_a_url_names_what_a_local_path_would(bucket, name, keys):
    assert locate(f"{bucket}/{name}")[1] == keys


@pytest.mark.parametrize("name, message", [
    ("missing.jsonl", "nothing to read at"),
    ("parts/notes*", "unsupported corpus file"),
])
def test_a_url_that_names_no_corpus_is_refused_with_the_forms_that_work(bucket, name, message):
    with pytest.raises(CorpusError, match=message):
        locate(f"{bucket}/{name}")
