"""Answer attribution and the extractive engine: every sentence checked against the sources (hand-computed
cases), and extractive answers whose every sentence is a cited source sentence."""

from __future__ import annotations

import random

import pytest

from deployments.config import SynthesisConfig
from deployments.search.attribution import attribute, content_words, split_sentences, support
from deployments.synthesis.core import Synthesizer
from deployments.synthesis.extractive import ExtractiveEngine, pick
from deployments.synthesis.service import SynthesisService
from deployments.synthesis.sources import Source

SOURCES = {
    1: "Gzip compresses files with the DEFLATE algorithm. It writes files ending in .gz.",
    2: "The tarfile module reads and writes tar archives, optionally compressed with gzip or bzip2.",
    3: "Bread is baked from flour, water and yeast.",
}


def test_sentences_keep_the_markers_written_after_them():
    assert split_sentences("One [1]. Two! [2] Three? Four is 3.5 [1, 2]. Five") == [
        "One [1].", "Two! [2]", "Three?", "Four is 3.5 [1, 2].", "Five"]


def test_support_is_the_share_of_content_words_the_source_holds():
    words = content_words("The archives are compressed with gzip")  # archive, compressed, gzip
    assert words == ["archive", "compressed", "gzip"]
    assert support(words, set(content_words(SOURCES[2]))) == 1.0
    assert support(words, set(content_words(SOURCES[1]))) == pytest.approx(1 / 3)  # gzip only
    assert support([], {"x"}) == 0.0


def test_supported_markers_stay_unsupported_ones_go_bare_sentences_get_one():
    a = attribute("Gzip compresses files with DEFLATE [2]. The tarfile module reads tar archives. "
                  "Bananas are yellow [1]. Bread is baked from flour [3][1].", SOURCES)
    assert [s.text for s in a.sentences] == [
        "Gzip compresses files with DEFLATE [1].",  # [2] does not say it, [1] does: swapped
        "The tarfile module reads tar archives [2].",  # bare: the best source added
        "Bananas are yellow.",  # nothing says it: kept, unsupported
        "Bread is baked from flour [3].",  # [1] dropped from the pair
    ]
    assert [s.supported for s in a.sentences] == [True, True, False, True]
    assert a.removed == [2, 1] and a.added == [1, 2] and a.cited == [1, 2, 3]
    assert a.text == " ".join(s.text for s in a.sentences)


def test_clause_markers_vouch_for_their_clause_and_stay_in_place():
    a = attribute("Gzip uses DEFLATE [1], tarfile reads tar archives [2] and bread needs yeast [3].", SOURCES)
    assert a.text == "Gzip uses DEFLATE [1], tarfile reads tar archives [2] and bread needs yeast [3]."
    assert a.sentences[0].citations == [1, 2, 3] and a.removed == []


def test_a_repeated_sentence_is_dropped():
    a = attribute("Gzip compresses files [1]. Gzip compresses files [1]. gzip compresses the files!", SOURCES)
    assert len(a.sentences) == 1 and a.repeats_dropped == 2


def test_an_engine_that_loops_gives_each_sentence_once():
    """What the demo's SmolLM2 did (one sentence six times): whatever the engine writes, the answer has it once."""

    class Looping:
        name = "looping"

        def generate(self, messages, max_new_tokens):
            return " ".join(["The tarfile module reads tar archives."] * 6), 10, 60

    answer = Synthesizer(Looping()).answer("tar", [Source(2, "b#0", "b", "Tar", SOURCES[2])])
    assert answer.text == "The tarfile module reads tar archives [2]." and len(answer.sentences) == 1


def test_code_blocks_are_kept_as_written_and_never_cited():
    text = "Use tarfile to read tar archives [2]. For example:\n```python\nimport tarfile [2]\nx = [1]\n```\nDone."
    a = attribute(text, SOURCES)
    assert [s.text for s in a.sentences][1:3] == ["For example:", "```python\nimport tarfile [2]\nx = [1]\n```"]
    assert not a.sentences[2].supported and a.sentences[2].citations == []
    assert "\n```python\nimport tarfile [2]\nx = [1]\n```\n" in a.text


def test_extractive_answers_pick_the_sentences_with_the_rarest_query_words_in_rank_order():
    sources = [Source(1, "a#0", "a", "Gzip", SOURCES[1]), Source(2, "b#0", "b", "Tar", SOURCES[2]),
               Source(3, "c#0", "c", "Bread", SOURCES[3])]
    chosen = pick("how do I read a tar archive", sources)
    assert [(c.n, c.position) for c in chosen] == [(2, 0)]  # the only sentence naming tar archives
    text = ExtractiveEngine().write("gzip DEFLATE tar archives", sources)
    assert text.startswith("Gzip compresses files with the DEFLATE algorithm. [1]")
    answer = Synthesizer(ExtractiveEngine()).answer("gzip DEFLATE tar archives", sources)
    assert all(s["supported"] and s["support"] == 1.0 for s in answer.sentences)
    assert [c["n"] for c in answer.citations] == [1, 2] and answer.model == "extractive"
    assert answer.text == ("Gzip compresses files with the DEFLATE algorithm [1]. The tarfile module reads and "
                           "writes tar archives, optionally compressed with gzip or bzip2 [2].")


def test_every_extractive_sentence_is_supported_whatever_the_sources():
    rng = random.Random(4)
    vocab = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega", "rho"]
    for _ in range(200):
        sources = [Source(n, f"d{n}#0", f"d{n}", f"t{n}",
                          ". ".join(" ".join(rng.choices(vocab, k=rng.randint(2, 12))).capitalize()
                                    for _ in range(rng.randint(1, 5))) + ".")
                   for n in range(1, rng.randint(2, 6))]
        answer = Synthesizer(ExtractiveEngine()).answer(" ".join(rng.choices(vocab, k=3)), sources)
        for s in answer.sentences:
            assert s["supported"] or answer.text.startswith("None of the results"), (answer.text, s)


def test_extractive_is_the_engine_without_a_model_and_has_no_llm_rerank():
    service = SynthesisService(SynthesisConfig())
    assert service.info()["engine"] == "ExtractiveEngine"
    events = list(service.stream("gzip", [{"chunk_id": "a#0", "doc_id": "a", "title": "Gzip", "content": SOURCES[1]}]))
    assert events[-1]["type"] == "answer" and events[-1]["citations"][0]["n"] == 1
    assert "".join(e["text"] for e in events[:-1]).startswith("Gzip compresses")
    with pytest.raises(RuntimeError, match="generative"):
        Synthesizer(ExtractiveEngine()).relevance("q", ["p"])
