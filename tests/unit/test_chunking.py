import re

import pytest

from index_build.corpus import Document
from index_format.chunking import chunk_document


def doc(text: str, title: str = "T", **meta) -> Document:
    return Document(doc_id="d1", title=title, text=text, metadata=meta, source="f.jsonl:3")


def test_short_document_stays_whole():
    chunks = chunk_document(doc("one two three"), chunk_size=5, chunk_overlap=2)
    assert len(chunks) == 1
    c = chunks[0]
    assert (c.chunk_id, c.chunk_index, c.char_start, c.char_end, c.text) == ("d1#0", 0, 0, 13, "one two three")
    assert c.source == "f.jsonl:3"


def test_windows_overlap_and_cover_every_word():
    words = [f"w{i}" for i in range(23)]
    text = "  ".join(words) + "\n"
    chunks = chunk_document(doc(text), chunk_size=10, chunk_overlap=3)
    # starts advance by 10 - 3 = 7 words: 0, 7, 14 (the third reaches the end, so no fourth)
    assert [c.text.split()[0] for c in chunks] == ["w0", "w7", "w14"]
    assert [len(c.text.split()) for c in chunks] == [10, 10, 9]
    for c in chunks:
        assert c.text == text[c.char_start:c.char_end]
    covered = {w for c in chunks for w in c.text.split()}
    assert covered == set(words)
    assert chunks[0].text.split()[-3:] == chunks[1].text.split()[:3]


def test_exact_multiple_does_not_emit_an_overlap_only_tail():
    text = " ".join(f"w{i}" for i in range(20))
    chunks = chunk_document(doc(text), chunk_size=10, chunk_overlap=0)
    assert [c.text.split()[0] for c in chunks] == ["w0", "w10"]


def test_metadata_and_section_hint_travel_with_each_chunk():
    text = "# Intro\n" + " ".join(["alpha"] * 12) + "\n## Usage\n" + " ".join(["beta"] * 12)
    chunks = chunk_document(doc(text, title="Guide", lang="en"), chunk_size=8, chunk_overlap=0)
    assert all(c.metadata == {"lang": "en"} and c.title == "Guide" for c in chunks)
    sections = {c.section for c in chunks if re.search(r"beta beta beta", c.text)}
    assert sections == {"Usage"}
    assert chunks[0].section == "Intro"


def test_contents_prepends_title_only_when_asked():
    (c,) = chunk_document(doc("body text", title="Head"), 10, 2)
    assert c.contents(True) == "Head\nbody text"
    assert c.contents(False) == "body text"


def test_overlap_must_be_below_size():
    with pytest.raises(ValueError):
        chunk_document(doc("a b c"), chunk_size=3, chunk_overlap=3)
