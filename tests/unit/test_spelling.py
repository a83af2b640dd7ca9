"""Spell correction core: typos fixed by edit distance and frequency, known words never touched."""

from __future__ import annotations

import random
import string

from rapidfuzz import process
from rapidfuzz.distance import Levenshtein

from deployments.search.spelling import Speller, allowed_edits
from deployments.shard.vocabulary import document_frequencies

TEXTS = ["the galaxy telescope orbit", "galaxy nebula", "galaxy comet", "gallery art", "cart part", "carts"]


def test_typos_are_fixed_by_the_closest_then_most_frequent_word():
    speller = Speller(document_frequencies(TEXTS))
    fixed, corrections, unchecked = speller.correct("Galaxi telescop, orbt!")
    assert unchecked == 0
    assert fixed == "galaxy telescope, orbit!"  # punctuation and spacing kept
    assert [(c.original, c.corrected, c.edits) for c in corrections] == [
        ("Galaxi", "galaxy", 1), ("telescop", "telescope", 1), ("orbt", "orbit", 1)]
    # "dart" is one edit from art, cart and part (df 1 each): the tie goes to the alphabetically first.
    assert speller.suggest("dart").corrected == "art"
    # Frequency decides between equally close words: "galaxz" -> galaxy (df 3), not some rarer word.
    assert speller.suggest("galaxz").df == 3


def test_known_words_short_words_and_numbers_are_never_changed():
    speller = Speller(document_frequencies(TEXTS))
    assert speller.correct("galaxy telescope") == ("galaxy telescope", [], 0)
    assert speller.correct("galaxy of 2010 and x9 ok") == ("galaxy of 2010 and x9 ok", [], 0)
    assert speller.correct("zzzzzzzz") == ("zzzzzzzz", [], 0)  # nothing within two edits


def test_allowed_edits_grow_with_word_length():
    assert [allowed_edits(w) for w in ("ab", "abc", "abcde", "abcdef")] == [0, 1, 1, 2]
    speller = Speller({"telescope": 1, "cat": 1})
    assert speller.suggest("tlscope").corrected == "telescope"  # 2 edits, 7 letters
    assert speller.suggest("cxx") is None  # 2 edits away, but 3 letters allow 1


def test_suggestions_equal_a_search_of_the_whole_vocabulary():
    """Looking only at words of nearby lengths loses nothing: the oracle scans every word."""
    rng = random.Random(3)
    vocab = {"".join(rng.choices("abcde", k=rng.randint(2, 9))): rng.randint(1, 5) for _ in range(3000)}
    speller = Speller(vocab)
    for _ in range(300):
        w = "".join(rng.choices("abcde", k=rng.randint(3, 9)))
        limit = allowed_edits(w)
        found = process.extract(w, list(vocab), scorer=Levenshtein.distance, score_cutoff=limit, limit=None)
        want = None if w in vocab or not found else min(found, key=lambda m: (m[1], -vocab[m[0]], m[0]))[0]
        got = speller.suggest(w)
        assert (got.corrected if got else None) == want, w


def test_a_long_query_of_non_words_is_corrected_only_up_to_the_cap():
    speller = Speller(document_frequencies(TEXTS))
    query = " ".join("".join(random.Random(i).choices(string.ascii_lowercase, k=8)) for i in range(40))
    fixed, corrections, unchecked = speller.correct(query, max_words=8)
    assert len(corrections) <= 8 and unchecked == 32
    assert speller.correct("galaxi " + query, max_words=1)[1][0].corrected == "galaxy"  # the first ones are looked up
