"""A chunk's id made and read in one place, and the chunking a version records read back with its defaults."""

from __future__ import annotations

from index_build.config import BuildConfig
from index_format.chunk_ids import chunk_id, doc_of
from index_format.chunking import Chunking


def test_a_chunk_id_reads_back_its_document_even_when_the_document_id_holds_the_separator():
    assert chunk_id("doc-7", 2) == "doc-7#2" and doc_of("doc-7#2") == "doc-7"
    assert doc_of(chunk_id("a#b", 11)) == "a#b"


def test_the_chunking_of_a_build_config_and_the_builds_defaults_are_one():
    assert Chunking.of({}) == Chunking()
    config = BuildConfig(corpus="x.jsonl", out="out")
    assert Chunking.of(config.model_dump()) == Chunking()  # the build's defaults are the format's
    named = Chunking.of({"chunk_size": 64, "text_fields": ["body"], "unrelated": 1})
    assert (named.chunk_size, named.chunk_overlap, named.text_fields) == (64, 24, ("body",))
