"""Configuration of the served application: one typed model for the app builder, the CLI and YAML.

``AppConfig`` is what ``serve_config.yaml`` passes as ``args`` (validated before anything starts);
``RouterSettings`` is the part that can change at run time through the router's ``user_config``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RouterSettings(BaseModel):
    """Request defaults and knobs the router applies; reconfigurable without a redeploy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fusion: str = Field("rrf", pattern="^(rrf|weighted)$", description="Default fusion for hybrid search.")
    rrf_k: int = Field(60, ge=1, description="RRF constant (Cormack et al. 2009 use 60).")
    dense_weight: float = Field(0.7, ge=0, le=1, description="Default dense weight of weighted fusion.")
    keyword_weight: float = Field(0.3, ge=0, le=1, description="Default keyword weight of weighted fusion.")
    candidate_base: int = Field(50, ge=1, description="Candidates asked of each leg and shard, at least.")
    candidate_factor: int = Field(4, ge=1, description="... or this many times the requested limit.")
    candidate_cap: int = Field(1000, ge=1, description="... but never more than this.")
    deepen_when_flat: bool = Field(True, description="Ask for twice the candidates once when top scores are flat.")
    mmr_pool_factor: int = Field(4, ge=1, description="MMR picks from limit * this many fused candidates.")
    rows_with_answers: int = Field(
        20, ge=0, description="Shards send the texts of each leg's best min(limit, this) hits with their "
        "answer, sparing a fetch round trip; 0 always fetches afterwards.")
    shard_timeout_s: float = Field(2.0, gt=0, description="Per-shard deadline; late shards count as not answered.")
    token_budget: int = Field(2000, ge=16, description="Default token budget of the assembled context.")
    history_turns: int = Field(2, ge=0, description="Recent user turns added to the query.")
    synonyms: dict[str, list[str]] = Field(default_factory=dict, description="term -> synonyms for expansion.")
    cache_size: int = Field(1024, ge=0, description="Identical requests answered from memory (0 turns it off).")
    redact_queries: bool = Field(True, description="Log a hash and length instead of the query text.")


class CollectionConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    index: Path = Field(description="Index root written by index_build (its ACTIVE version is served) or a version folder.")
    version: str | None = Field(None, description="Serve this version instead of the active one.")


class AppConfig(BaseModel):
    """Everything the app builder needs; ``index`` is shorthand for one collection named ``default``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: Path | None = Field(None, description="Shorthand: serve this index as the 'default' collection.")
    collections: dict[str, CollectionConfig] = Field(default_factory=dict, description="name -> index.")
    default_collection: str = Field("default", description="Collection used when a request names none.")
    shard_replicas: int = Field(1, ge=1, description="Replicas of each shard retriever.")
    shard_num_cpus: float = Field(0.25, gt=0, description="CPUs reserved per shard replica.")
    shard_max_ongoing_requests: int = Field(32, ge=1)
    encoder_replicas: int = Field(1, ge=1)
    encoder_num_cpus: float = Field(0.5, gt=0, description="CPUs reserved per query-encoder replica.")
    encoder_num_gpus: float = Field(0, ge=0, description="GPUs per query-encoder replica (0 on CPU machines).")
    encoder_max_batch_size: int = Field(32, ge=1, description="Queries embedded in one forward pass.")
    encoder_batch_wait_s: float = Field(0.003, ge=0, description="How long a batch waits to fill.")
    router_replicas: int = Field(1, ge=1)
    router_num_cpus: float = Field(0.25, gt=0)
    verify_checksums: bool = Field(True, description="Check every shard file against its manifest at start.")
    lucene_heap: str = Field("512m", pattern=r"^\d+[mMgG]$", description="JVM heap per shard replica.")
    router: RouterSettings = Field(default_factory=RouterSettings)

    @model_validator(mode="after")
    def _one_way_to_name_indexes(self) -> AppConfig:
        if self.index is not None and self.collections:
            raise ValueError("give either 'index' (one default collection) or 'collections', not both")
        if self.index is None and not self.collections:
            raise ValueError("no index to serve: set 'index' or 'collections'")
        if self.collections and self.default_collection not in self.collections:
            raise ValueError(
                f"default_collection {self.default_collection!r} is not one of {sorted(self.collections)}"
            )
        return self

    def resolved_collections(self) -> dict[str, CollectionConfig]:
        if self.index is not None:
            return {self.default_collection: CollectionConfig(index=self.index)}
        return dict(self.collections)
