"""Inputs named by a URL: which objects a URL names (one key, a prefix as a folder, a glob), downloaded in name
order under their own names, each mapped back to its URL."""

from __future__ import annotations

import pytest

from index_build.corpus import CorpusError, corpus_files
from index_build.inputs import download, locate
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


def test_download_keeps_the_names_and_maps_each_file_to_its_url(bucket, tmp_path):
    local, urls = download(f"{bucket}/parts", tmp_path / "scratch")
    files = corpus_files(local)
    assert [f.name for f in files] == ["part-10.jsonl", "part-2.parquet"]
    assert [urls[str(f)] for f in files] == [f"{bucket}/parts/part-10.jsonl", f"{bucket}/parts/part-2.parquet"]
    assert files[0].read_bytes() == b"parts/part-10.jsonl"
    one, urls = download(f"{bucket}/beir/corpus.jsonl", tmp_path / "scratch")
    assert one.is_file() and urls == {str(one): f"{bucket}/beir/corpus.jsonl"}
    assert not (tmp_path / "scratch" / "part-10.jsonl").exists()  # the scratch folder was emptied first


@pytest.mark.parametrize("name, message", [
    ("missing.jsonl", "nothing to read at"),
    ("parts/notes*", "unsupported corpus file"),
])
def test_a_url_that_names_no_corpus_is_refused_with_the_forms_that_work(bucket, name, message):
    with pytest.raises(CorpusError, match=message):
        locate(f"{bucket}/{name}")
