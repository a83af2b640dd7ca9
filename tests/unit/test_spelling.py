"""Spell correction core: typos fixed by edit distance and frequency, known words never touched."""

from __future__ import annotations

from deployments.search.spelling import Speller, allowed_edits, document_frequencies

TEXTS = ["the galaxy telescope orbit", "galaxy nebula", "galaxy comet", "gallery art", "cart part", "carts"]


def test_typos_are_fixed_by_the_closest_then_most_frequent_word():
    speller = Speller(document_frequencies(TEXTS))
    fixed, corrections = speller.correct("Galaxi telescop, orbt!")
    assert fixed == "galaxy telescope, orbit!"  # punctuation and spacing kept
    assert [(c.original, c.corrected, c.edits) for c in corrections] == [
        ("Galaxi", "galaxy", 1), ("telescop", "telescope", 1), ("orbt", "orbit", 1)]
    # "dart" is one edit from art, cart and part (df 1 each): the tie goes to the alphabetically first.
    assert speller.suggest("dart").corrected == "art"
    # Frequency decides between equally close words: "galaxz" -> galaxy (df 3), not some rarer word.
    assert speller.suggest("galaxz").df == 3


def test_known_words_short_words_and_numbers_are_never_changed():
    speller = Speller(document_frequencies(TEXTS))
    assert speller.correct("galaxy telescope") == ("galaxy telescope", [])
    assert speller.correct("galaxy of 2010 and x9 ok") == ("galaxy of 2010 and x9 ok", [])
    assert speller.correct("zzzzzzzz") == ("zzzzzzzz", [])  # nothing within two edits


def test_allowed_edits_grow_with_word_length():
    assert [allowed_edits(w) for w in ("ab", "abc", "abcde", "abcdef")] == [0, 1, 1, 2]
    speller = Speller({"telescope": 1, "cat": 1})
    assert speller.suggest("tlscope").corrected == "telescope"  # 2 edits, 7 letters
    assert speller.suggest("cxx") is None  # 2 edits away, but 3 letters allow 1
