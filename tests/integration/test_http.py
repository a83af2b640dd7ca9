"""One real Ray Serve application over a 3-shard index, spoken to over HTTP on loopback."""

from __future__ import annotations

import httpx
import pytest

from deployments.search.inprocess import LocalIndex
from tests.serving import SERVE_PORT, start_serve, stop_serving

PORT = SERVE_PORT


@pytest.fixture(scope="module")
def served(built, ray_local):

    from deployments.settings import deploy_app

    _, summary = built[3]
    start_serve()
    # From a config, as python -m deployments and serve run do, so settings can be applied in place.
    deploy_app({"index": str(summary.version_dir), "router": {"shard_timeout_s": 10}}, "raysearch")
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as client:
        yield client, summary
    stop_serving()


def test_search_over_http_equals_the_cores(served):
    client, summary = served
    local = LocalIndex(summary.version_dir)
    r = client.post("/search", json={"query": "telescope galaxy", "method": "keyword", "limit": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["chunk_id"] for x in body["results"]] == [h.chunk_id for h in local.bm25("telescope galaxy", 5)]
    assert body["index_version"] == {"default": summary.version}
    assert body["coverage"] == {"shards_asked": 3, "shards_answered": 3, "ratio": 1.0, "degraded": False, "failed": []}
    assert {"embed", "retrieve", "fuse", "fetch", "assemble", "total"} >= set(body["timings_ms"]) >= {"retrieve", "total"}
    assert "embed" not in body["timings_ms"]  # a keyword search embeds nothing
    hybrid = client.post("/search", json={"query": "telescope galaxy", "limit": 3, "include_context": True}).json()
    assert hybrid["method"] == "hybrid" and len(hybrid["results"]) == 3 and hybrid["citations"]
    assert "embed" in hybrid["timings_ms"]


@pytest.mark.parametrize(
    "payload, status, needle",
    [
        ({"query": "   "}, 422, "query is empty"),
        ({"query": "x" * 10_001}, 422, "this service takes at most 10,000 (router.max_query_chars)"),
        ({"query": "x", "limit": 0}, 422, "greater than or equal to 1"),
        ({"query": "x", "limit": 101}, 422, "less than or equal to 100"),
        ({"query": "x", "method": "magic"}, 422, "vector"),
        ({"query": "x", "filters": {"colour": "red"}}, 422, "unknown filter field 'colour'"),
        ({"query": "x", "filters": {"year": {"gte": "soon"}}}, 422, "year"),
        ({"query": "x", "collections": ["elsewhere"]}, 404, "unknown collection 'elsewhere'"),
        ({"query": "x", "surprise": 1}, 422, "surprise"),
        ({"query": "x", "rerank": True}, 400, "deploys no reranker"),
        ({"query": "x", "synthesize": True}, 400, "synthesis is not enabled"),
        ({"query": "x", "stream": True}, 422, "set synthesize: true"),
        ({"query": "x", "rerank_depth": 0}, 422, "rerank_depth"),
        ({"query": "x", "ann": {"ef_search": 5000}}, 422, "less than or equal to 4096"),
        ({"query": "x", "ann": {"nprobe": 0}}, 422, "greater than or equal to 1"),
        ({"query": "x", "ann": {"efSearch": 64}}, 422, "efSearch"),
        ({"query": "x", "conversation_history": ["y" * 2000] * 40}, 413, "the limit is 65536"),
    ],
)
def test_bad_requests_get_a_4xx_with_the_reason(served, payload, status, needle):
    client, _ = served
    r = client.post("/search", json=payload)
    assert r.status_code == status, r.text
    assert needle in r.text


@pytest.mark.parametrize("raw, needle", [
    ('{"query": "\\ud800"}', "not valid Unicode"),
    ('{"query": "x", "filters": ' + '{"a": ' * 300 + '1' + '}' * 301, "nested more than"),
    ('{"query": "x", "min_relevance_score": NaN}', "NaN and Infinity"),
    ('{"query": "x", "filters": {"year": {"gte": 1e999}}}', "NaN and Infinity"),
    ('{"query": "x", "limit": 100000000000000000000000000000}', "larger than"),
])
def test_hostile_bodies_get_a_422_naming_the_field(served, raw, needle):
    client, _ = served
    r = client.post("/search", content=raw.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert needle in r.text
    assert client.post("/search", json={"query": "telescope"}).status_code == 200  # and it still serves


def test_every_error_status_is_documented_with_the_one_error_body(served):
    client, _ = served
    paths = client.get("/openapi.json").json()["paths"]
    for path, method, codes in (("/search", "post", ("400", "404", "422", "503")),
                                ("/feedback", "post", ("404", "422", "507")),
                                ("/admin/collections/{collection}/activate", "post", ("403", "404", "409"))):
        responses = paths[path][method]["responses"]
        for code in codes:
            schema = responses[code]["content"]["application/json"]["schema"]
            assert schema["$ref"].endswith("/ErrorResponse"), (path, code, schema)


def test_lucene_syntax_is_searched_as_text(served):
    client, _ = served
    for q in ['title:(anchor AND "mast', "a*b?c~2 ^3 [x TO y] \\ / !", "AND OR NOT"]:
        r = client.post("/search", json={"query": q, "method": "keyword"})
        assert r.status_code == 200, r.text


def test_health_openapi_and_docs(served):
    client, summary = served
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["collections"] == {"default": summary.version}
    assert sorted(s["shard"] for s in health["shards"]) == ["shard-000", "shard-001", "shard-002"]
    assert health["stages"] == {"reranker": "off", "synthesis": "off"}
    spec = client.get("/openapi.json").json()
    assert "/search" in spec["paths"] and "/health" in spec["paths"]
    assert client.get("/docs").status_code == 200


def test_fuzzed_requests_from_the_openapi_spec_never_get_a_5xx(served):
    """1,000+ requests generated from the service's own OpenAPI spec (schemathesis): valid ones and ones
    that break the schema. Every answer must be a 2xx or a 4xx, never a 5xx."""
    from collections import Counter

    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode

    base = f"http://127.0.0.1:{PORT}"
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    statuses: Counter = Counter()
    server_errors = []

    for operation, mode, examples in [(("/search", "POST"), GenerationMode.POSITIVE, 700),
                                      (("/search", "POST"), GenerationMode.NEGATIVE, 300),
                                      (("/health", "GET"), GenerationMode.POSITIVE, 20)]:
        op = schema[operation[0]][operation[1]]

        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case):
            r = case.call(base_url=base, timeout=60)
            statuses[r.status_code] += 1
            if r.status_code >= 500:
                server_errors.append((case.body, r.status_code, r.text[:200]))

        run()
    assert sum(statuses.values()) >= 1000, statuses
    assert not server_errors, server_errors[:3]
    assert statuses[200] > 100 and any(400 <= s < 500 for s in statuses), statuses


def test_feedback_is_stored_and_read_back_as_qrels(served):
    from deployments.judgments import JudgmentStore, query_id

    client, summary = served
    hit = client.post("/search", json={"query": "telescope galaxy", "limit": 1}).json()["results"][0]
    r = client.post("/feedback", json={"query": "telescope galaxy", "chunk_id": hit["chunk_id"], "label": 1,
                                       "user": "ann"})
    assert r.status_code == 201, r.text
    assert r.json() == {"collection": "default", "query_id": query_id("telescope galaxy"), "doc_id": hit["doc_id"],
                        "label": 1}
    answer = client.get("/feedback/qrels")
    assert answer.headers["X-Skipped-Lines"] == "0"
    qrels = answer.text.splitlines()
    assert qrels[0] == "query-id\tcorpus-id\tscore" and f"{query_id('telescope galaxy')}\t{hit['doc_id']}\t1" in qrels
    # Stored on disk beside the versions: a restarted service (a new store) reads the same judgment.
    stored = JudgmentStore(summary.version_dir.parent.parent / "judgments").records()
    assert any(s["chunk_id"] == hit["chunk_id"] and s["user"] == "ann" for s in stored)
    for body, status in (({"query": "x", "label": 1}, 422), ({"query": "x", "doc_id": "d1", "label": 7}, 422),
                         ({"query": "", "doc_id": "d1", "label": 1}, 422),
                         ({"query": "x", "doc_id": "d1", "label": 1, "collection": "nope"}, 404),
                         ({"query": "x", "doc_id": "d1\tq-forged\td9", "label": 3}, 422)):
        r = client.post("/feedback", json=body)
        assert r.status_code == status and "error" in r.json(), (body, r.text)
    assert client.get("/feedback/qrels", params={"collection": "nope"}).status_code == 404


def test_evaluate_command_over_the_running_service(served, tmp_path, capsys):
    import json

    from relevance.evaluate import main as evaluate_main

    client, _ = served
    top = client.post("/search", json={"query": "telescope galaxy", "limit": 100}).json()["results"]
    first_doc = top[0]["doc_id"]
    (tmp_path / "queries.jsonl").write_text(
        json.dumps({"_id": "found", "text": "telescope galaxy"}) + "\n" + json.dumps({"_id": "missed", "text": "piano"})
        + "\n" + json.dumps({"_id": "unjudged", "text": "boat"}) + "\n")
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text(
        f"query-id\tcorpus-id\tscore\nfound\t{first_doc}\t1\nmissed\tno-such-doc\t2\n")
    code = evaluate_main(["--url", str(client.base_url), "--data", str(tmp_path), "--no-progress",
                          "--out", str(tmp_path / "figures.json")])
    assert code == 0
    figures = json.loads((tmp_path / "figures.json").read_text())["figures"]
    # By construction: "found" has its one relevant document at rank 1, "missed" can never be found.
    assert figures["queries"] == 2 and figures["RR@10"] == 0.5 and figures["nDCG@10"] == 0.5
    assert figures["R@100"] == 0.5 and figures["context_recall@10"] == 0.5
    chunks_of_first = sum(hit["doc_id"] == first_doc for hit in top[:10])
    assert figures["context_precision@10"] == pytest.approx(chunks_of_first / min(10, len(top)) / 2)
    assert "nDCG@10" in capsys.readouterr().out


def test_tune_command_tunes_writes_and_applies_settings_in_place(served, corpus, tmp_path, capsys):
    """python -m relevance.tune end to end: judgments -> replay -> held-out check -> settings file ->
    applied through the router's user_config, with the router replicas kept (no restart)."""
    import json

    import yaml
    from ray.serve.context import _connect

    from deployments.settings import apply_router_settings, current_router_settings
    from relevance.tune import main as tune_main
    from tests.conftest import TOPICS
    from tests.waiting import wait_until

    client, _ = served
    _, docs = corpus
    queries, qrels = [], ["query-id\tcorpus-id\tscore"]
    for topic, words in sorted(TOPICS.items()):
        words = words.split()
        for i in range(4):
            qid = f"{topic}{i}"
            queries.append(json.dumps({"_id": qid, "text": f"{words[i]} {words[i + 4]}"}))
            qrels += [f"{qid}\t{d['_id']}\t1" for d in docs if d["metadata"]["topic"] == topic]
    (tmp_path / "q.jsonl").write_text("\n".join(queries) + "\n")
    (tmp_path / "qrels.tsv").write_text("\n".join(qrels) + "\n")

    def searched_with() -> tuple[str, int]:
        """(fusion, candidate depth) a search is answered with now."""
        debug = client.post("/search", json={"query": "telescope galaxy", "debug": True}).json()["debug"]
        return debug["fusion"]["method"], debug["candidate_depth"]

    def router_replicas():
        details = _connect().get_serve_details()["applications"]["raysearch"]["deployments"]["router"]
        return sorted(r["replica_id"] for r in details["replicas"])

    original = current_router_settings()
    replicas = router_replicas()
    out = tmp_path / "tuned.yaml"
    code = tune_main(["--url", str(client.base_url), "--queries", str(tmp_path / "q.jsonl"),
                      "--qrels", str(tmp_path / "qrels.tsv"), "--held-out-share", "0.4", "--candidates", "20", "40",
                      "--rrf-ks", "10", "60", "--dense-weights", "0.2", "0.8", "--mmr-lambdas", "0.8",
                      "--out", str(out), "--report", str(tmp_path / "report.json"), "--no-progress", "--apply"])
    try:
        assert code == 0
        tuned = yaml.safe_load(out.read_text())
        report = json.loads((tmp_path / "report.json").read_text())
        assert report["train_queries"] + report["held_out_queries"] == 20 and report["grid_size"] == 8
        assert report["held_out"]["low"] <= report["held_out"]["diff"] <= report["held_out"]["high"]
        # The chosen setting is the grid's best on the training queries (its label, the first of the ranking).
        top = report["grid_top"]
        assert top[0]["nDCG@10"] == max(row["nDCG@10"] for row in top)
        how = (f"rrf k={tuned['rrf_k']}" if tuned["fusion"] == "rrf" else f"weighted dense={tuned['dense_weight']:.2f}")
        assert top[0]["setting"].startswith(f"{how}, {tuned['candidate_base']} candidates")
        assert "held-out" in capsys.readouterr().out
        # Applied in place: the settings are live, the replicas are the same ones.
        wait_until(lambda: searched_with() == (tuned["fusion"], tuned["candidate_base"]), 60,
                   lambda: f"the tuned settings in effect: a search used {searched_with()}", every_s=0.5)
        assert {k: current_router_settings()[k] for k in tuned} == tuned
        assert router_replicas() == replicas
    finally:
        apply_router_settings(original)
        # Live again before the next test (Serve reconfigures replicas in the background).
        wait_until(lambda: searched_with() == (original["fusion"], original["candidate_base"]), 60,
                   lambda: f"the original settings in effect again: a search used {searched_with()}", every_s=0.5)
    with pytest.raises(ValueError, match="rrf_k"):
        apply_router_settings({"rrf_k": 0})  # refused before anything changes


def test_a_batch_over_http_answers_each_search_as_alone_with_its_own_errors(served):
    client, _ = served
    searches = [{"query": "telescope galaxy", "limit": 3}, {"query": "bread oven", "method": "keyword", "limit": 2},
                {"query": "sail", "limit": 1000}, {"query": "x", "collections": ["nope"]},
                {"query": "lucene replica", "method": "vector", "limit": 2, "offset": 2}]
    r = client.post("/search/batch", json={"searches": searches}, headers={"X-Request-Id": "batch-1"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "batch-1"
    body = r.json()
    assert body["request_id"] == "batch-1"
    assert [item["status"] for item in body["responses"]] == [200, 200, 422, 404, 200]
    for search, item in zip(searches, body["responses"], strict=True):
        alone = client.post("/search", json=search)
        assert alone.status_code == item["status"]
        if item["status"] == 200:
            assert [(x["rank"], x["chunk_id"]) for x in item["response"]["results"]] == \
                   [(x["rank"], x["chunk_id"]) for x in alone.json()["results"]]
        else:
            assert item["error"] == alone.json()["error"]
    assert body["responses"][2]["detail"][0]["field"] == "limit"
    assert body["responses"][4]["response"]["results"][0]["rank"] == 3
    too_many = client.post("/search/batch", json={"searches": [{"query": "x"}] * 65})
    assert too_many.status_code == 422 and too_many.json()["detail"][0]["field"] == "searches"


def test_the_typed_client_against_the_served_app(served):
    """raysearch_client, sync and async, on the real app: answers equal raw HTTP's, pages follow cursors to
    the end, a batch keeps each search's error in its place, errors carry status and request id."""
    import asyncio

    from raysearch_client import AsyncSearchClient, SearchClient, SearchServiceError

    raw, _ = served
    with SearchClient(str(raw.base_url)) as client:
        page = client.search("telescope galaxy", limit=3, method="keyword")
        assert [r.chunk_id for r in page.results] == \
               [r["chunk_id"] for r in raw.post("/search", json={"query": "telescope galaxy", "limit": 3,
                                                                  "method": "keyword"}).json()["results"]]
        pages = list(client.pages("telescope galaxy", limit=4, candidates=12))
        ranks = [r.rank for p in pages for r in p.results]
        assert len(pages) > 1 and ranks == list(range(1, len(ranks) + 1)) and pages[-1].next_cursor is None
        answers = client.search_batch(["telescope galaxy", {"query": "x", "collections": ["nope"]}])
        assert answers[0].results and isinstance(answers[1], SearchServiceError) and answers[1].status == 404
        with pytest.raises(SearchServiceError) as e:
            client.search("x", collections=["nope"])
        assert e.value.status == 404 and e.value.request_id and "unknown collection" in e.value.message
        assert client.health().status == "ok"
        stored = client.feedback("telescope galaxy", 1, chunk_id=page.results[0].chunk_id)
        assert stored.doc_id == page.results[0].doc_id and stored.label == 1
        # Documents and builds: this app serves a pinned version, so a write or a build is refused with 409, after
        # the route and the body were accepted; a document of the version is read back, and no build is listed.
        name = client.health().default_collection
        doc = client.get_document(name, page.results[0].doc_id)
        assert doc.source == "index" and page.results[0].chunk_id in doc.chunk_ids
        for refused in (lambda: client.upsert_documents(name, [{"id": "new", "text": "x"}]),
                        lambda: client.delete_documents(name, [doc.id]), lambda: client.start_build(kind="fold")):
            with pytest.raises(SearchServiceError) as e:
                refused()
            assert e.value.status == 409 and "pinned" in e.value.message
        assert client.builds() == []
        with pytest.raises(SearchServiceError) as e:
            client.build("no-such-build")
        assert e.value.status == 404
        with pytest.raises(SearchServiceError) as e:  # no synthesis deployed (the README's test streams one)
            list(client.stream_answer("telescope galaxy"))
        assert e.value.status == 400

    async def go():
        async with AsyncSearchClient(str(raw.base_url)) as client:
            one = await client.search("telescope galaxy", limit=2)
            pages = [p async for p in client.pages("telescope galaxy", limit=4, candidates=12)]
            return one, pages, await client.search_batch(["bread oven"] * 3)

    one, async_pages, batch = asyncio.run(go())
    assert len(one.results) == 2 and [r.chunk_id for p in async_pages for r in p.results] == \
           [r.chunk_id for p in pages for r in p.results]
    assert len(batch) == 3 and all(b.results for b in batch)
