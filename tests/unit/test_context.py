from dataclasses import asdict

import pytest

from deployments.search.context import assemble, citations, whitespace_token_count
from index_build.corpus import Document
from index_format.chunking import chunk_document

# 30 words with uneven spacing, so offsets (not word counts) decide what the merged text is.
LONG = Document("d1", "Long", "  ".join(f"w{i:02d}" + ("\n" if i % 7 == 6 else "") for i in range(30)))
SHORT = Document("d2", "Short", "alpha beta  gamma delta epsilon")
# chunk_size 10, overlap 3: windows of words [0, 10), [7, 17), [14, 24), [21, 30).
CHUNKS = {c.chunk_id: c for doc in (LONG, SHORT) for c in chunk_document(doc, chunk_size=10, chunk_overlap=3)}


def row(chunk_id, score):
    fields = asdict(CHUNKS[chunk_id])
    del fields["metadata"], fields["source"]
    return {**fields, "score": score}


RANKED = [row("d1#2", 0.9), row("d2#0", 0.8), row("d1#1", 0.7)]


def test_chunks_are_what_the_tests_assume():
    assert [CHUNKS[f"d1#{i}"].text.split()[0] for i in range(4)] == ["w00", "w07", "w14", "w21"]
    assert CHUNKS["d1#1"].char_end > CHUNKS["d1#2"].char_start  # neighbours overlap by three words


def test_adjacent_overlapping_chunks_merge_into_the_document_text():
    passages, info = assemble(RANKED)
    first, second = passages
    c1, c2 = CHUNKS["d1#1"], CHUNKS["d1#2"]
    assert first.text == LONG.text[c1.char_start:c2.char_end]
    assert first.text.split() == [f"w{i:02d}" for i in range(7, 24)]  # 7 + 10 words, the overlap once
    assert (first.doc_id, first.chunk_ids, first.char_start, first.char_end) == ("d1", ("d1#1", "d1#2"),
                                                                                 c1.char_start, c2.char_end)
    assert first.score == 0.9  # the best member's score, and its rank (d1#2 came first)
    assert (second.chunk_ids, second.text, second.citation) == (("d2#0",), SHORT.text, 2)
    assert info == {"tokens": 17 + 5, "budget": 2000, "dropped": [], "trimmed": []}


def test_a_chain_of_neighbours_is_one_passage():
    rows = [row(f"d1#{i}", 1.0 - i / 10) for i in (3, 0, 2, 1)]
    (passage,), _ = assemble(rows)
    assert passage.text == LONG.text.strip()
    assert passage.chunk_ids == ("d1#0", "d1#1", "d1#2", "d1#3")


def test_no_merge_when_asked_or_when_ranges_do_not_touch():
    passages, _ = assemble(RANKED, merge_adjacent=False)
    assert [p.chunk_ids for p in passages] == [("d1#2",), ("d2#0",), ("d1#1",)]
    assert [p.text for p in passages] == [CHUNKS[c].text for c in ("d1#2", "d2#0", "d1#1")]
    gap, _ = assemble([row("d1#0", 0.5), row("d1#2", 0.4)])  # words 0-9 and 14-23: a gap between
    assert [p.chunk_ids for p in gap] == [("d1#0",), ("d1#2",)]


def test_touching_ranges_merge_but_a_whitespace_gap_does_not():
    # chunk_overlap 0: windows [0, 10) and [10, 20) are separated by the spaces between w09 and w10.
    c0, c1 = chunk_document(LONG, chunk_size=10, chunk_overlap=0)[:2]
    assert c1.char_start - c0.char_end == 2
    apart, _ = assemble([{**asdict(c0), "score": 1.0}, {**asdict(c1), "score": 0.5}])
    assert [p.chunk_ids for p in apart] == [("d1#0",), ("d1#1",)]
    text = "abc def"
    left = {"doc_id": "x", "chunk_id": "x#0", "chunk_index": 0, "char_start": 0, "char_end": 4, "text": "abc ",
            "title": "", "section": "", "score": 0.2}
    right = {**left, "chunk_id": "x#1", "chunk_index": 1, "char_start": 4, "char_end": 7, "text": "def", "score": 0.3}
    (touching,), _ = assemble([right, left])
    assert (touching.text, touching.chunk_ids, touching.score) == (text, ("x#0", "x#1"), 0.3)


def test_text_not_matching_its_offsets_is_not_merged():
    odd = {**row("d1#2", 0.9), "text": "rewritten"}
    passages, _ = assemble([odd, row("d1#1", 0.7)])
    assert [p.text for p in passages] == ["rewritten", CHUNKS["d1#1"].text]


def test_title_and_section_come_from_the_first_chunk_in_the_document():
    rows = [{**row("d1#2", 0.9), "section": "Later"}, {**row("d1#1", 0.7), "section": "Earlier"}]
    (passage,), _ = assemble(rows)
    assert (passage.title, passage.section) == ("Long", "Earlier")


def test_crossing_passage_is_trimmed_on_a_word_and_later_ones_dropped():
    rows = RANKED + [row("d1#0", 0.1)]  # merges with d1#1 and d1#2: one 24-word passage
    passages, info = assemble([row("d2#0", 0.95)] + rows, token_budget=5 + 6)
    assert [p.citation for p in passages] == [1, 2]
    full, cut = passages
    assert (full.text, full.trimmed) == (SHORT.text, False)
    assert cut.trimmed and cut.text.split() == [f"w{i:02d}" for i in range(6)]
    assert cut.text == LONG.text[cut.char_start:cut.char_end]
    assert cut.chunk_ids == ("d1#0",)  # d1#1 starts at w07, beyond the cut
    assert info == {"tokens": 5 + 6, "budget": 11, "dropped": ["d1#2", "d1#1"], "trimmed": [2]}


def test_nothing_follows_a_trimmed_passage():
    empty = chunk_document(Document("d3", "Empty", ""), chunk_size=10, chunk_overlap=3)[0]
    passages, info = assemble([row("d2#0", 0.9), {**asdict(empty), "score": 0.1}], token_budget=2)
    assert [p.chunk_ids for p in passages] == [("d2#0",)]  # the empty passage would still "fit"
    assert info["dropped"] == ["d3#0"] and info["trimmed"] == [1]


def test_exact_fit_then_nothing_more():
    passages, info = assemble(RANKED, token_budget=17)
    assert [p.chunk_ids for p in passages] == [("d1#1", "d1#2")]
    assert not passages[0].trimmed
    assert info == {"tokens": 17, "budget": 17, "dropped": ["d2#0"], "trimmed": []}


def test_zero_budget_and_no_rows():
    passages, info = assemble(RANKED, token_budget=0)
    assert passages == [] and info["dropped"] == ["d1#2", "d2#0", "d1#1"] and info["tokens"] == 0
    assert assemble([]) == ([], {"tokens": 0, "budget": 2000, "dropped": [], "trimmed": []})
    with pytest.raises(ValueError):
        assemble(RANKED, token_budget=-1)


def test_custom_token_counter_trims_on_a_word():
    passages, info = assemble([row("d2#0", 1.0)], token_budget=len("alpha beta  gamma") + 2, count_tokens=len)
    assert passages[0].text == "alpha beta  gamma"
    assert info["tokens"] == len("alpha beta  gamma")


def test_duplicate_rows_count_once():
    passages, info = assemble([row("d2#0", 0.8), row("d2#0", 0.8)])
    assert len(passages) == 1 and info["tokens"] == 5


def test_citations():
    passages, _ = assemble(RANKED)
    c1, c2 = CHUNKS["d1#1"], CHUNKS["d1#2"]
    assert citations(passages) == [
        {"id": 1, "doc_id": "d1", "chunk_ids": ["d1#1", "d1#2"], "title": "Long", "section": "Long",
         "char_start": c1.char_start, "char_end": c2.char_end},
        {"id": 2, "doc_id": "d2", "chunk_ids": ["d2#0"], "title": "Short", "section": "Short",
         "char_start": 0, "char_end": len(SHORT.text)},
    ]
    assert citations([]) == []


def test_whitespace_token_count():
    assert whitespace_token_count(" a  b\nc\t") == 3
    assert whitespace_token_count("") == 0
