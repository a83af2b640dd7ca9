"""The HTTP contract: request and response models with their limits.

Limits live here, at the edge, so a bad request is answered with a 422 naming the field and the rule
before any work is done; the cores behind trust what passes.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from deployments.config import MAX_QUERY_CHARS, AnnParams, FieldWeights, Fusion
from deployments.judgments import has_control_character

MAX_TURN_CHARS = 2000  # a turn of conversation_history
MAX_HISTORY_TURNS = 20
MAX_NESTING = 16  # levels of objects and lists in a request body (a filter's field needs 4, each $and/$or 2 more)
MAX_ABS_NUMBER = 1e15  # larger numbers are no metadata value or option anyone means


def _body_problem(value: Any, path: str, depth: int = 0) -> str | None:
    """Why a decoded JSON body cannot be served (a lone surrogate, too deep, a non-finite or huge number),
    with the field's path, or None. Checked before any field, so no later stage meets such a value."""
    if depth > MAX_NESTING:
        return f"{path or 'body'}: nested more than {MAX_NESTING} levels deep"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{path or 'body'}: not valid Unicode text (a lone surrogate such as \\ud800)"
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if value != value or abs(value) == float("inf"):
            return f"{path or 'body'}: NaN and Infinity are not numbers this service accepts"
        if abs(value) > MAX_ABS_NUMBER:
            return f"{path or 'body'}: {value!r} is larger than {MAX_ABS_NUMBER:g} in magnitude"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            shown = str(key).encode("utf-8", "backslashreplace").decode()  # a message must be valid text too
            where = f"{path}.{shown}" if path else shown
            problem = _body_problem(str(key), where, depth + 1) or _body_problem(item, where, depth + 1)
            if problem:
                return problem
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            problem = _body_problem(item, f"{path}[{i}]", depth + 1)
            if problem:
                return problem
    return None


class RequestBody(BaseModel):
    """A request body: unknown fields refused, and the whole body checked once for what no field may hold."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _servable(cls, data: Any) -> Any:
        problem = _body_problem(data, "")
        if problem:
            raise ValueError(problem)
        return data


class Method(StrEnum):
    vector = "vector"
    keyword = "keyword"
    hybrid = "hybrid"


class Weights(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dense: float = Field(0.5, ge=0, le=1, description="Weight of the dense (vector) leg in weighted fusion.")
    keyword: float = Field(0.5, ge=0, le=1, description="Weight of the BM25 leg in weighted fusion.")

    @model_validator(mode="after")
    def _not_both_zero(self) -> Weights:
        if self.dense == 0 and self.keyword == 0:
            raise ValueError("weights.dense and weights.keyword cannot both be 0")
        return self


class RerankWith(StrEnum):
    cross_encoder = "cross_encoder"
    llm = "llm"


class RelevanceScale(StrEnum):
    """What ``relevance_score`` is measured against: the hit's own evidence (``absolute``), or the other hits of
    its ranking (``minmax``)."""

    absolute = "absolute"
    minmax = "minmax"


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field("user", max_length=32)
    content: str = Field(max_length=MAX_TURN_CHARS)


class SearchRequest(RequestBody):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(description="Free text, up to the service's router.max_query_chars (10,000 characters by "
                       "default). Lucene syntax characters are searched as text.")
    method: Method = Field(Method.hybrid, description="vector, keyword or hybrid (both, fused).")
    limit: int = Field(10, ge=1, le=100, description="Results to return.")
    offset: int = Field(0, ge=0, le=999, description="Ranked results to skip: a page inside the candidate window "
                        "(offset + limit at most router.candidate_cap, 200 by default). Not with MMR.")
    cursor: str | None = Field(None, max_length=512, description="next_cursor of the previous page: the next page of "
                               "the same search, from the same index versions (409 once they changed).")
    collections: list[str] | None = Field(
        None, min_length=1, max_length=8, description="Collections to search (fused across them); default: the default one."
    )
    filters: dict[str, Any] | None = Field(
        None, description='Metadata filter, e.g. {"year": {"gte": 2010}, "topic": ["a", "b"], "lang": "en"} (fields '
        'ANDed; operators eq ne in nin gt gte lt lte, and exists: true or false); "$and" and "$or" take a list of '
        'filters, "$not" one, e.g. {"$or": [{"year": {"lt": 2000}}, {"topic": "music"}]}. GET /collections lists the '
        'fields.'
    )
    min_relevance_score: float | None = Field(
        None, ge=0, le=1, description="Drop results whose relevance_score is below this, in [0, 1] (default: the "
        "service's setting for hybrid requests, none unless tuned; a tuned one is on the minmax scale).")
    relevance_scale: RelevanceScale | None = Field(
        None, description="absolute (default): each result's relevance_score from its own evidence, the same for "
        "every query (the reranker's probability; else the collection's calibrated probability of relevance, "
        "python -m relevance.calibrate; else the dense cosine; a keyword search of an uncalibrated collection: "
        "minmax). minmax: relative to the ranking (min-max over it, a weighted fusion's own score, a reranker's "
        "probability), the best result 1. relevance_scales in the response says which each collection got.")
    fusion: Fusion | None = Field(
        None, description="rrf or weighted (over min-max normalized scores); default: the service's setting "
        "(weighted unless changed).")
    rrf_k: int | None = Field(None, ge=1, le=10_000, description="RRF constant (default: the service's setting).")
    candidates: int | None = Field(
        None, ge=1, le=1000, description="Candidates each leg asks of each shard before fusion (at least `limit`); "
        "default: the service's rule (candidate_base, candidate_factor x limit).")
    weights: Weights | None = Field(
        None, description="Weighted fusion weights (default: the service's, 0.5 dense / 0.5 keyword unless changed).")
    ann: AnnParams | None = Field(
        None, description='Approximate dense search options for this request, e.g. {"ef_search": 256} or '
        '{"exact": true}; default: the collection\'s, else what the index was built with (its manifest).')
    field_weights: FieldWeights | None = Field(
        None, description='BM25 field weights of the keyword leg, e.g. {"contents": 1.0, "title": 0.5}: its score is '
        "the weighted sum of each field's corpus-exact BM25 (0 leaves a field out). Default: the collection's, else "
        "contents alone. A field the served index version does not index is refused (400, naming those it has).")
    encoder: str | None = Field(
        None, pattern=r"^[a-z][a-z0-9]{0,31}$", description="A named encoder the served index version holds "
        "(index_build.add_encoder): the dense leg embeds the query with it and searches its vectors. Default: the "
        "version's own encoder. An encoder the version does not hold is refused (400, naming those it has). Not "
        "with MMR.")
    mmr_lambda: float | None = Field(
        None, ge=0, le=1, description="Diversify with MMR; 1 = pure relevance. Null: the service's setting (off "
        "unless tuned).")
    include_context: bool = Field(False, description="Assemble a context (adjacent chunks merged, token budget).")
    include_citations: bool = Field(True, description="Return the citation list of the assembled context.")
    token_budget: int | None = Field(None, ge=16, le=32_000, description="Token budget of the assembled context.")
    expand_synonyms: bool = Field(False, description="Add synonyms from the configured list to the query.")
    spell_correct: bool = Field(
        False, description="Replace query words the searched collections have never seen by the closest known word "
        "(1 edit for words of 3-5 letters, 2 for longer ones; the most frequent among equally close words). Known "
        "words are never changed. The corrected query is returned as corrected_query.")
    conversation_history: list[Turn | str] | None = Field(
        None, max_length=MAX_HISTORY_TURNS, description="Earlier turns; recent user turns are added to the query."
    )
    rerank: bool | None = Field(
        None, description="Rescore the best fused candidates with the cross-encoder; default: the collection's "
        "setting (on when a reranker is deployed, unless the collection turns it off).")
    rerank_depth: int | None = Field(
        None, ge=1, le=200, description="Candidates to rescore (default 40); the best `limit` of them are returned.")
    rerank_with: RerankWith = Field(
        RerankWith.cross_encoder, description="cross_encoder, or llm (the synthesis model scores each candidate; "
        "only where the service allows it).")
    ranking_model: bool | None = Field(
        None, description="Order the best fused candidates by the collection's active ranking model (a learned "
        "ranker, trained by relevance.train_ranker); default: whenever the collection has one. false: the order "
        "without it. One collection only.")
    group_by: str | None = Field(
        None, min_length=1, max_length=128, description="Group the ranking: doc_id (one entry per document) or a "
        "metadata field (one per value; a chunk without it stands alone). Applied after fusion, reranking, the "
        "ranking model and min_relevance_score over the candidate window; a group sits at its best chunk's rank, "
        "offset, limit and cursors count groups, and each result carries its group (group). Not with MMR.")
    group_size: int = Field(
        1, ge=1, le=10, description="With group_by: chunks kept per group, best first (default 1: the best chunk "
        "alone); the result is the best, group.chunks the others.")
    dedupe_threshold: float | None = Field(
        None, gt=0, le=1, description="Drop a result whose vector is within this cosine similarity of a better-ranked "
        "result already kept (e.g. 0.95: near-copies; 1: exact copies only). Before grouping.")
    highlights: bool = Field(
        False, description="Return highlights: {start, end} character spans in each returned text (content, and "
        "group chunks') of the query's terms, as the keyword index analyzes them (stems match).")
    synthesize: bool = Field(False, description="Write an answer with citations [n] to results (rank n).")
    stream: bool = Field(
        False, description="With synthesize: answer as NDJSON lines (results, then tokens, then the answer).")
    max_answer_tokens: int | None = Field(None, ge=1, le=1024, description="Cap on the answer's length in tokens.")
    debug: bool = Field(False, description="Return each stage's candidates and scores, drops and token counts.")

    @model_validator(mode="after")
    def _stream_needs_synthesis(self) -> SearchRequest:
        if self.stream and not self.synthesize:
            raise ValueError("stream: true streams the synthesized answer; set synthesize: true as well")
        if self.cursor is not None and self.offset:
            raise ValueError("send offset or cursor, not both: a cursor knows where its page starts")
        if self.group_size > 1 and self.group_by is None:
            raise ValueError(f"group_size {self.group_size} needs group_by (doc_id or a metadata field)")
        if self.encoder is not None and self.mmr_lambda is not None:
            raise ValueError("encoder and mmr_lambda cannot be used together: MMR compares the stored vectors of the "
                             "version's own encoder; drop one of them")
        if self.group_by is not None and self.mmr_lambda is not None:
            raise ValueError("group_by and mmr_lambda cannot be used together: MMR diversifies one page of chunks, "
                             "grouping pages over groups; drop one of them")
        return self

    @field_validator("query")
    @classmethod
    def _query_has_text(cls, v: str) -> str:
        if not v or not v.strip():
            raise ValueError("query is empty; send some text to search for")
        if len(v) > MAX_QUERY_CHARS:
            raise ValueError(f"query is {len(v):,} characters; no service takes more than {MAX_QUERY_CHARS:,}")
        return v

    @field_validator("collections")
    @classmethod
    def _distinct(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError("collections are listed more than once")
        return v


class StageScores(BaseModel):
    dense: float | None = None
    keyword: float | None = None
    fused: float | None = None
    reranked: float | None = None


class Result(BaseModel):
    rank: int
    chunk_id: str
    doc_id: str
    collection: str
    content: str
    source: str = Field(description="Where the document came from: its url or source field, else its doc_id.")
    title: str
    section: str
    metadata: dict[str, Any]
    relevance_score: float = Field(
        ge=0, le=1, description="The result's relevance on [0, 1] for every method (what min_relevance_score and a "
        "framework's score threshold apply to), on the scale relevance_scales names for its collection: "
        "probability (the reranker's), calibrated (the probability that it is relevant, fitted on the collection's "
        "judgments), cosine (the dense leg's similarity), or minmax/weighted (relative to the other results).")
    score: float = Field(description="The final score as the method gives it (cosine, BM25, fused, reranker).")
    scores: StageScores
    char_start: int
    char_end: int
    highlights: list[Highlight] | None = Field(
        None, description="With highlights: true, the character spans of the query's terms in content.")
    group: ResultGroup | None = Field(None, description="With group_by: the group this result is the best of.")


class Highlight(BaseModel):
    """A highlighted word: ``content[start:end]`` (Python string indices, end exclusive)."""

    start: int = Field(ge=0)
    end: int = Field(ge=0)


class GroupChunk(BaseModel):
    """Another kept chunk of a result's group (``group_size`` above 1), in rank order."""

    chunk_id: str
    content: str
    relevance_score: float = Field(ge=0, le=1)
    score: float
    char_start: int
    char_end: int
    highlights: list[Highlight] | None = None


class ResultGroup(BaseModel):
    key: Any = Field(description="The group's value: the document id (group_by: doc_id) or the metadata field's "
                     "value (null: the chunk has no such field and stands alone).")
    found: int = Field(description="Chunks of this group among the ranked candidates (kept or not).")
    chunks: list[GroupChunk] = Field(default_factory=list, description="The group's other kept chunks, best first "
                                     "(at most group_size - 1).")


Result.model_rebuild()  # its ``group`` and ``highlights`` name models defined after it


class Citation(BaseModel):
    n: int = Field(description="The marker [n] in the answer; result rank n.")
    chunk_id: str
    doc_id: str
    title: str


class AnswerSentence(BaseModel):
    text: str = Field(description="The sentence as it stands in the answer, with its checked markers.")
    citations: list[int] = Field(description="Results (rank n) that support it, best first.")
    supported: bool = Field(description="False: no returned result supports it (it carries no citation).")
    support: float = Field(description="Share of its content words the best supporting result holds, in [0, 1].")


class Answer(BaseModel):
    text: str = Field(description="The answer; every [n] in it names a returned result (rank n) that supports the "
                      "sentence it ends.")
    citations: list[Citation]
    sentences: list[AnswerSentence] = Field(
        default_factory=list, description="Each sentence, its citations and whether a result supports it, as "
        "checked by the service (kept when supported, added when missing, removed when not supported).")
    added_citations: list[int] = Field(
        default_factory=list, description="Citations the service added to sentences the writer left bare.")
    removed_citations: list[int] = Field(
        default_factory=list, description="Markers the writer gave that name no result, or a result that does not "
        "support the sentence: removed.")
    model: str
    prompt_tokens: int
    completion_tokens: int
    ms: float


class Coverage(BaseModel):
    shards_asked: int
    shards_answered: int
    ratio: float
    degraded: bool
    failed: list[str] = Field(default_factory=list)


class SearchResponse(BaseModel):
    query: str
    corrected_query: str | None = Field(None, description="The query as searched, when spell_correct changed it.")
    method: Method
    method_used: Method = Field(description="The method that answered: the one asked for, or keyword when a "
                                "hybrid request's query encoder failed.")
    results: list[Result]
    total: int = Field(description="Candidates at or above min_relevance_score, before the limit (groups, with "
                       "group_by; after dedupe_threshold).")
    total_results: int = Field(description="The number of results returned.")
    offset: int = Field(0, description="Ranked results before this page (a result's rank is offset + its place).")
    next_cursor: str | None = Field(None, description="Send it as cursor for the next page; null on the last page "
                                    "(and under MMR, which diversifies one page).")
    citations: list[str] | None = Field(
        None, description="The results' sources in rank order (citations[n-1] is result n's, the [n] of an "
        "answer); null when include_citations is false.")
    passage_citations: list[dict[str, Any]] | None = Field(
        None, description="The assembled context's passages (adjacent chunks merged), numbered as in context.")
    synthesis: str | None = Field(None, description="The answer's text (answer.text); null when none was written.")
    context: list[dict[str, Any]] | None = None
    index_version: dict[str, str]
    timings_ms: dict[str, float]
    coverage: Coverage
    cached: bool = False
    reranked: bool = Field(False, description="True when the order is the reranker's; false when not asked or "
                           "when the reranker failed or was too slow (then the fused order is returned).")
    relevance_scales: dict[str, str] = Field(
        default_factory=dict, description="Per collection searched, the scale of its results' relevance_score: "
        "probability, calibrated, cosine, minmax or weighted (request field relevance_scale).")
    ranking_model: str | None = Field(
        None, description="The ranking model that ordered the results (then `reranked` is false: a cross-encoder's "
        "scores, when asked for, were among its features); null when none did.")
    answer: Answer | None = None
    warnings: list[str] = Field(default_factory=list, description="What was skipped and why (never an error).")
    debug: dict[str, Any] | None = None
    # The results already written as JSON (``SearchPipeline.search(rendered=True)``), ``results`` left empty.
    _results_json: str | None = PrivateAttr(None)
    # (start, end, [search.stages.Span]) in perf_counter seconds: the spans of a trace.
    _stages: tuple | None = PrivateAttr(None)


def response_json(response: SearchResponse) -> str:
    """A search response as sent: fields that are None left out, except ``synthesis``, which the seed's
    contract always sends (null when no answer was written). The one place responses are serialized."""
    body = response.model_dump_json(exclude_none=True)
    if response._results_json is not None:
        # The first match is the field: only strings come before it, and a quote inside a string is escaped.
        body = body.replace('"results":[]', f'"results":{response._results_json}', 1)
    return body if response.synthesis is not None else body[:-1] + ',"synthesis":null}'


def response_dict(response: SearchResponse) -> dict[str, Any]:
    """``response_json`` as a JSON-ready dict (the first event of a streamed answer)."""
    body = response.model_dump(mode="json", exclude_none=True) | {"synthesis": response.synthesis}
    if response._results_json is not None:
        body["results"] = json.loads(response._results_json)
    return body


class ShardHealth(BaseModel):
    collection: str
    shard: str
    ok: bool
    chunks: int | None = None
    error: str | None = None


class HealthResponse(BaseModel):
    status: str  # ok | degraded | down
    collections: dict[str, str]  # name -> index version
    default_collection: str
    shards: list[ShardHealth]
    stages: dict[str, str] = Field(
        default_factory=dict, description="Optional stages (reranker, synthesis): ok, off, or why not.")


MAX_BATCH_SEARCHES = 64


class BatchSearchRequest(RequestBody):
    """Up to 64 searches answered in one call; each is checked and answered on its own."""

    searches: list[dict[str, Any]] = Field(
        min_length=1, max_length=MAX_BATCH_SEARCHES,
        description="Search request bodies (as POST /search takes them); one that is invalid gets its own error.")


class BatchItem(BaseModel):
    status: int = Field(description="The status this search alone would have been answered with.")
    response: SearchResponse | None = None
    error: str | None = None
    detail: Any = None


class BatchSearchResponse(BaseModel):
    responses: list[BatchItem] = Field(description="One a search, in the order sent.")
    request_id: str | None = None


class ErrorResponse(BaseModel):
    error: str
    detail: Any = None
    request_id: str | None = Field(None, description="The request's X-Request-Id: every log line written for "
                                   "the request carries it")


class ActivateRequest(RequestBody):
    model_config = ConfigDict(extra="forbid")

    version: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$",
                         description="A published version's name (python -m index_build.versions list ROOT).")


class ActivationResponse(BaseModel):
    collection: str
    version: str = Field(description="The version served now (by this router replica; others follow within "
                         "version_poll_s).")
    previous: str
    warm_ms: float = Field(description="Time the shards took to load the version.")


class CollectionVersions(BaseModel):
    serving: str = Field(description="The version this router replica answers from.")
    follows_active: bool = Field(description="False when the configuration pins a version or a version folder.")
    active: str | None = None
    previous: str | None = Field(None, description="Where a rollback goes.")
    published: list[str] = Field(default_factory=list)
    error: str | None = Field(None, description="Why the active version is not the one served, if it is not.")


class VersionsResponse(BaseModel):
    collections: dict[str, CollectionVersions]


class FilterField(BaseModel):
    name: str
    kind: str = Field(description="number, date, string, bool, list (of scalars) or mixed: decided from the values "
                      "the field holds; it sets the operators a filter may use on it.")
    operators: list[str] = Field(description="The operators a filter may use on the field (eq ne in nin exists; gt "
                                 "gte lt lte too on numbers and dates).")


class CollectionInfo(BaseModel):
    name: str
    default: bool = Field(description="Searched when a request names no collection.")
    version: str = Field(description="The index version this router replica answers from.")
    documents: int = Field(description="Documents in that version (writes since then not counted).")
    chunks: int = Field(description="Chunks in that version.")
    fields: list[FilterField] = Field(description="The metadata fields a filter (or group_by) may name, with the "
                                      "documents written since the version; sorted by name.")


class CollectionsResponse(BaseModel):
    collections: list[CollectionInfo]


class FeedbackRequest(RequestBody):
    """One relevance judgment: this result was (or was not) relevant to this query."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    chunk_id: str | None = Field(None, min_length=1, max_length=512, description="The judged result's chunk_id.")
    doc_id: str | None = Field(None, min_length=1, max_length=512,
                               description="The judged document (default: the chunk's document).")
    label: int = Field(ge=0, le=3, description="0 not relevant, 1 relevant; 2-3 for graded judgments.")
    collection: str | None = Field(None, description="Default: the default collection.")
    user: str | None = Field(None, max_length=128, description="Who judged; a user's latest label counts.")
    tenant: str | None = Field(None, max_length=128)

    @field_validator("chunk_id", "doc_id", "user", "tenant")
    @classmethod
    def _no_control_characters(cls, v: str | None, info) -> str | None:
        # These go into TSV rows and logs: a tab or a line break would forge a row.
        if v is not None and has_control_character(v):
            raise ValueError(f"{info.field_name} holds a control character (tab, line break, ...); ids may not")
        return v

    @model_validator(mode="after")
    def _names_a_result(self) -> FeedbackRequest:
        if self.chunk_id is None and self.doc_id is None:
            raise ValueError("give chunk_id or doc_id: the judged result")
        return self


class FeedbackResponse(BaseModel):
    collection: str
    query_id: str = Field(description="Digest of the normalized query: the qrels query id.")
    doc_id: str
    label: int


MAX_WRITE_RECORDS = 1000  # records (or ids) one document write may carry


class UpsertDocumentsRequest(RequestBody):
    """Documents to add or replace, as the build reads its corpus: each record an id, a text (or a title), and any
    metadata (a ``metadata`` object, or other top-level fields), the ACL field among them. The batch is atomic:
    one bad record refuses all of it (422, naming the record and the field)."""

    documents: list[dict[str, Any]] = Field(
        min_length=1, max_length=MAX_WRITE_RECORDS,
        description="Records in the build's record format, e.g. {\"id\": \"doc-1\", \"title\": \"...\", \"text\": "
        "\"...\", \"metadata\": {\"year\": 2024, \"acl\": [\"tenant-a\"]}}.")


class DeleteDocumentsRequest(RequestBody):
    """Documents to delete by id, as one atomic write."""

    ids: list[str] = Field(min_length=1, max_length=MAX_WRITE_RECORDS, description="Document ids.")


class WriteResponse(BaseModel):
    collection: str
    seq: int = Field(description="The write's sequence number in the collection's change log: writes are applied in "
                     "this order, and a document's GET shows the sequence number of the write that made it.")
    upserted: int = 0
    deleted: int = 0
    searchable: bool = Field(description="Whether the write is searchable on the replica that answered (false: stored "
                             "durably, searchable as soon as the query encoder answers again).")


class DocumentResponse(BaseModel):
    collection: str
    id: str
    title: str
    text: str = Field(description="The document's text (from the index version: put back together from its chunks).")
    metadata: dict[str, Any]
    chunk_ids: list[str] = Field(description="Its chunks, in order: the chunk ids search results name.")
    source: Literal["api", "index"] = Field(description="api: written through this API (not yet folded into a version); "
                                            "index: from the index version served.")
    seq: int | None = Field(None, description="The sequence number of the write that made it (source api).")


class ListDocumentsRequest(RequestBody):
    """A page of a collection's documents without a query, in id order: those a filter lets through (and the caller
    may see), optionally among given ids. Page on with ``after``: the previous page's ``next_after``."""

    filters: dict[str, Any] | None = Field(
        None, description="Metadata filter, as a search's (operators eq ne in nin gt gte lt lte exists, $and $or "
        "$not); "
        "GET /collections lists the fields.")
    ids: list[str] | None = Field(None, max_length=MAX_WRITE_RECORDS,
                                  description="Only these document ids (those that exist and pass the filter).")
    limit: int = Field(100, ge=0, le=MAX_WRITE_RECORDS, description="Documents in the page; 0: the count alone.")
    after: str | None = Field(None, max_length=1024, description="List the ids after this one (the previous page's "
                              "next_after).")


class DocumentsPage(BaseModel):
    collection: str
    documents: list[DocumentResponse] = Field(description="The page, in id order (Python's string order, by code point).")
    total: int = Field(description="Documents that match, in all pages.")
    next_after: str | None = Field(None, description="The last id of this page, to ask for the next one (as after); "
                                   "null when this page is the last. A document written meanwhile with a later id "
                                   "is listed; one deleted meanwhile is not.")


class BuildRequest(RequestBody):
    """A build or a fold of a collection's index root, run as a job beside the service (``python -m index_build``
    or ``python -m index_build.fold``); the fields are that command's flags of the same names."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["build", "fold"] = Field(
        "build", description="build: a version from a corpus, or a delta on a version (changes, deletes); fold: the "
        "documents written through the API (the change log) into the active version.")
    collection: str | None = Field(None, max_length=128, description="Whose index root (default: the default "
                                   "collection). Collections serving a pinned version cannot be built.")
    corpus: str | None = Field(None, max_length=4096, description="A corpus path on the service's machines (BEIR "
                               "folder, JSONL or Parquet file, folder or glob).")
    changes: str | None = Field(None, max_length=4096, description="A delta: records to upsert (a file path).")
    deletes: str | None = Field(None, max_length=4096, description="A delta: ids to delete (a file path).")
    base: str | None = Field(None, max_length=128, pattern=r"^[A-Za-z0-9._-]+$",
                             description="The version a delta or fold applies to (default: the active one).")
    version: str | None = Field(None, max_length=128, pattern=r"^[A-Za-z0-9._-]+$",
                                description="The new version's name (default: a timestamp).")
    activate: bool | None = Field(None, description="Activate the new version when it is complete (default: yes).")
    shards: int | None = Field(None, ge=1, le=1024, description="Number of shards (a build from a corpus).")
    encoder: str | None = Field(None, max_length=512, description="Encoder model (a build from a corpus).")
    query_prompt: str | None = Field(None, max_length=1000, description="Text put before every query (default: the "
                                     "encoder's own prompt, else none); recorded in the version's manifest.")
    document_prompt: str | None = Field(None, max_length=1000, description="Text put before every chunk embedded "
                                        "(default: the encoder's own prompt, else none).")
    faiss_index: str | None = Field(None, max_length=32, pattern=r"^[a-z0-9_]+$",
                                    description="FAISS index type: auto, flat, hnsw, ... (a build from a corpus).")
    chunk_size: int | None = Field(None, ge=8, le=4096)
    chunk_overlap: int | None = Field(None, ge=0)
    reuse: bool | None = Field(None, description="Reuse vectors and shards of earlier versions (default: yes).")


class CreateCollectionRequest(RequestBody):
    """A new collection, built from these documents by a build job into an index root under the service's
    ``collections_root``; every router replica serves it once the build activated its version, without a redeploy."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,48}$", description="The collection's name: 1-48 letters, digits, "
                      "'-' or '_'; also its folder (or prefix) under collections_root.")
    documents: list[dict[str, Any]] = Field(
        min_length=1, max_length=MAX_WRITE_RECORDS, description="Its first documents, in the build's record format "
        "(as PUT .../documents takes them); add more through the documents API once it is served.")
    encoder: str | None = Field(None, max_length=512, description="Encoder model (default: the default collection's, "
                                "with its prompts, so its query encoder is shared).")
    shards: int | None = Field(None, ge=1, le=64, description="Number of shards (default: 1).")
    chunk_size: int | None = Field(None, ge=8, le=4096)
    chunk_overlap: int | None = Field(None, ge=0)


class BuildJob(BaseModel):
    """A build or fold job: what it runs, how far it is, and its summary once it ended."""

    id: str
    kind: str
    collection: str | None = None
    root: str
    state: Literal["running", "succeeded", "failed"]
    started: str
    finished: str | None = None
    alive: str | None = Field(None, description="When the job's supervisor last saw it (renewed every 10 s while it "
                              "runs; a running job not seen for a minute is reported failed).")
    progress: dict[str, Any] | None = Field(None, description="The stage running and how far it is (its progress "
                                            "bar: done of total).")
    summary: dict[str, Any] | None = Field(None, description="The build's or fold's summary, once it succeeded.")
    error: str | None = Field(None, description="The end of the job's output, when it failed.")
    options: dict[str, Any] = Field(default_factory=dict)
    command: list[str] = Field(default_factory=list)
    pid: int | None = None
    returncode: int | None = None
    by: str | None = None


class CollectionCreated(BaseModel):
    collection: str
    root: str = Field(description="The collection's index root (its versions, change log, judgments, build records).")
    build: BuildJob = Field(description="The build job making its first version: follow it at GET /admin/builds/{id}; "
                            "once it succeeded, GET /collections lists the collection (within router.version_poll_s).")


class BuildJobs(BaseModel):
    builds: list[BuildJob]
