"""Prompts: where a build's come from, what they change in a vector, and what a build key makes of them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from index_build.cli import parse_args
from index_build.config import BuildConfig
from index_format.encoders import HashingEncoder, encode_queries
from index_format.manifest import VersionManifest
from index_format.prompts import EncoderSpec, resolve_prompts


def _model_folder(tmp_path, prompts: dict) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    return str(folder)


def test_a_prompt_changes_the_vector_as_the_text_prepended_by_hand():
    model = HashingEncoder(64)
    texts = ["tumour suppressor genes", "p53"]
    by_hand = model.encode(["query: " + t for t in texts])
    np.testing.assert_array_equal(model.encode(texts, prompt="query: "), by_hand)
    np.testing.assert_array_equal(encode_queries(model, texts, "query: "), by_hand)
    assert np.abs(by_hand - model.encode(texts)).max() > 0.1


def test_given_prompts_win_then_the_models_own_then_none(tmp_path):
    folder = _model_folder(tmp_path, {"query": "search_query: ", "document": "search_document: ", "other": "x"})
    assert resolve_prompts(folder) == EncoderSpec(folder, "search_query: ", "search_document: ")
    assert resolve_prompts(folder, "q: ") == EncoderSpec(folder, "q: ", "search_document: ")
    assert resolve_prompts(folder, "", "") == EncoderSpec(folder, "", "")  # "" is a choice: no prompt
    assert resolve_prompts("hashing:64") == EncoderSpec("hashing:64")


@pytest.mark.parametrize(("prompts", "want"), [
    ({"query": "query: ", "passage": "passage: "}, ("query: ", "passage: ")),  # e5
    ({"search_query": "a: ", "search_document": "b: "}, ("a: ", "b: ")),  # nomic
    ({"query": "Represent this sentence: "}, ("Represent this sentence: ", "")),  # bge, gte: queries only
    ({}, ("", "")),
])
def test_a_model_folders_own_prompts_are_read_under_their_usual_names(tmp_path, prompts, want):
    folder = _model_folder(tmp_path, prompts)
    spec = resolve_prompts(folder)
    assert (spec.query_prompt, spec.document_prompt) == want


def test_the_cli_and_the_config_name_the_prompts_as_the_manifest_does(tmp_path):
    cfg, _ = parse_args(["--corpus", "c.jsonl", "--out", str(tmp_path), "--encoder", "hashing:64",
                         "--query-prompt", "query: ", "--document-prompt", "passage: "])
    assert (cfg.query_prompt, cfg.document_prompt) == ("query: ", "passage: ")
    assert set(VersionManifest.model_fields) >= {"query_prompt", "document_prompt"}
    unset, _ = parse_args(["--corpus", "c.jsonl", "--out", str(tmp_path), "--encoder", "hashing:64"])
    assert (unset.query_prompt, unset.document_prompt) == ("", "")  # resolved: the model has none


def test_prompts_change_the_build_key_and_none_leaves_it_as_before(tmp_path):
    """A build without prompts keeps the key it had before prompts existed (its shards resume and are reused)."""
    plain = BuildConfig(corpus="c.jsonl", out=str(tmp_path), encoder="hashing:64").with_prompts()
    assert "query_prompt" not in plain.content_key() and "document_prompt" not in plain.content_key()
    prompted = plain.model_copy(update={"document_prompt": "passage: "})
    assert prompted.build_key("x") != plain.build_key("x")
