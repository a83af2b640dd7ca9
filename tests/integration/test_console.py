"""The search console (GET /console) driven in headless Chromium against a real Serve application.

The application runs with API keys on, so the page's own key handling is exercised too: the page and its
files load without a key, a search answered 401 opens the key form, and the key then travels with every
call. Chromium is Debian's (`make browser` installs it); Playwright drives it, never downloads one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from deployments.edge.guard import new_key
from tests.serving import SERVE_PORT, start_serve, stop_serving

PORT = SERVE_PORT
BASE = f"http://127.0.0.1:{PORT}"
KEY, DIGEST = new_key()
AUTH = {"Authorization": f"Bearer {KEY}"}
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = Path(__file__).resolve().parents[1] / "output" / "console.png"  # git-ignored, kept for people


def _unavailable(reason: str) -> None:
    """CI must run this test (fail loudly there); a workstation without a browser skips it."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason}; CI must run the console test (`make browser` installs Chromium as root)")
    pytest.skip(reason)


@pytest.fixture(scope="module", autouse=True)
def _browser_available():
    # Checked before the application starts, so a missing browser costs nothing.
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is missing: run `make browser` (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("the playwright package is missing: pip install playwright==1.63.0")


@pytest.fixture(scope="module")
def served(built, ray_local, tmp_path_factory):
    """The 1-shard index, copied so the judgments this module stores touch no other test's index."""
    from ray import serve

    from deployments.serve.app import build_app

    _, summary = built[1]
    root = tmp_path_factory.mktemp("console") / "index"
    shutil.copytree(summary.version_dir.parent.parent, root)
    start_serve()
    app = build_app({"index": str(root), "router": {"shard_timeout_s": 10, "cache_size": 0},
                     "security": {"api_key_digests": [DIGEST]}})
    serve.run(app, name="console", route_prefix="/", blocking=False)
    with httpx.Client(base_url=BASE, timeout=60, headers=AUTH) as client:
        yield client
    stop_serving()


@pytest.fixture(scope="module")
def browser(served):
    # Started after the application: Playwright's sync API keeps an event loop in this thread.
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=60_000)  # a shared CI machine can take more than the 5 s default
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Console:
    """One tab on the console, recording the API calls it makes and any script error on the page."""

    def __init__(self, browser, key: str | None):
        self.context = browser.new_context(viewport={"width": 1280, "height": 1000})
        if key is not None:  # as if the key had been entered earlier in this tab
            self.context.add_init_script(f"sessionStorage.setItem('raysearch.apiKey', {json.dumps(key)})")
        self.page = self.context.new_page()
        self.page.set_default_timeout(60_000)
        self.calls: list[tuple[str, str, str | None]] = []  # method, path, Authorization
        self.script_errors: list[str] = []
        self.page.on("request", lambda r: self.calls.append(
            (r.method, urlparse(r.url).path, r.headers.get("authorization"))))
        self.page.on("pageerror", lambda e: self.script_errors.append(str(e)))

    def by(self, test_id: str):
        return self.page.get_by_test_id(test_id)

    def open(self, query_string: str = ""):
        from playwright.sync_api import expect

        self.page.goto(f"{BASE}/console{query_string}")
        expect(self.by("health")).to_contain_text("Service ok")  # /health is open: no key needed

    def search(self, query: str, expect_state: str = "done", **fields: str):
        """Fill the form (fields by element id) and submit; wait until the page has the outcome."""
        from playwright.sync_api import expect

        self.page.fill("#query", query)
        for element_id, value in fields.items():
            if self.page.eval_on_selector(f"#{element_id}", "e => e.tagName") == "SELECT":
                self.page.select_option(f"#{element_id}", value)
            else:
                self.page.fill(f"#{element_id}", value)
        self.by("search-button").click()
        expect(self.by("results")).to_have_attribute("data-state", expect_state)

    def results(self) -> list[dict]:
        """What each shown result says: ids, text, metadata, and per stage its number and bar share."""
        return self.page.eval_on_selector_all("[data-testid=result]", """items => items.map(item => ({
            chunk_id: item.dataset.chunkId, doc_id: item.dataset.docId,
            content: item.querySelector('.content').textContent,
            marks: [...item.querySelectorAll('.content mark')].map(m => m.textContent),
            metadata: Object.fromEntries([...item.querySelectorAll('.metadata dd')].map(d => [d.dataset.field,
                                                                                            d.textContent])),
            stages: Object.fromEntries([...item.querySelectorAll('.stage')].map(s => [s.dataset.stage, {
                value: s.querySelector('.stage-value').textContent, share: Number(s.dataset.share),
                drawn: s.querySelector('.fill').getBoundingClientRect().width
                       / s.querySelector('.bar').getBoundingClientRect().width}])),
        }))""")

    def searches_sent(self) -> int:
        return sum(1 for method, path, _ in self.calls if (method, path) == ("POST", "/search"))


@pytest.fixture
def console(browser):
    tab = Console(browser, key=KEY)
    yield tab
    tab.context.close()
    assert not tab.script_errors, tab.script_errors


def _number(text: str) -> float | None:
    return None if text == "—" else float(text)


def test_asks_for_a_key_then_shows_results_with_their_stage_scores(browser, served):
    from playwright.sync_api import expect

    tab = Console(browser, key=None)
    try:
        tab.open()
        expect(tab.by("collection")).to_have_value("default")
        tab.search("telescope galaxy", expect_state="failed")
        expect(tab.by("error")).to_contain_text("401")
        expect(tab.by("key-panel")).to_be_visible()
        tab.by("api-key").fill(KEY)
        tab.by("key-save").click()  # and the refused search runs again, now with the key
        expect(tab.by("results")).to_have_attribute("data-state", "done")
        expect(tab.by("error")).to_be_hidden()

        assert tab.page.evaluate("sessionStorage.getItem('raysearch.apiKey')") == KEY
        assert tab.page.evaluate("localStorage.length") == 0 and KEY not in tab.page.url
        api_calls = [(m, p, a) for m, p, a in tab.calls if p in ("/search", "/health")]
        assert api_calls[-1] == ("POST", "/search", f"Bearer {KEY}")

        # The page asked what the form says, and shows what the service answered, in its order.
        expected = served.post("/search", json={"query": "telescope galaxy", "method": "hybrid", "limit": 10,
                                                "collections": ["default"]}).json()
        shown = tab.results()
        assert [r["chunk_id"] for r in shown] == [r["chunk_id"] for r in expected["results"]]
        assert len(shown) == 10
        # The marks are the service's spans (the query's terms as BM25 analyzed them), drawn as they came.
        spans = served.post("/search", json={"query": "telescope galaxy", "method": "hybrid", "limit": 10,
                                             "collections": ["default"], "highlights": True}).json()
        assert [r["marks"] for r in shown] == [[x["content"][s["start"]:s["end"]] for s in x["highlights"]]
                                               for x in spans["results"]]
        for r, want in zip(shown, expected["results"], strict=True):
            assert r["content"] == want["content"]  # text exactly, whatever the marks
            assert {m.lower() for m in r["marks"]} <= {"telescope", "telescopes", "galaxy"}
            if want["scores"].get("keyword") is not None:  # BM25 found a query word in it: it is marked
                assert r["marks"], r
            assert r["metadata"]["topic"] == want["metadata"]["topic"]
            for stage in ("keyword", "dense", "fused", "reranked"):
                value = want["scores"].get(stage)
                assert _number(r["stages"][stage]["value"]) == (None if value is None else pytest.approx(value,
                                                                                                         abs=1e-4))
        # Each stage's bars are scaled to that stage's best score on the page, and drawn so.
        for stage in ("keyword", "dense", "fused"):
            values = [want["scores"].get(stage) for want in expected["results"]]
            top = max(v for v in values if v is not None)
            for r, v in zip(shown, values, strict=True):
                share = max(0.0, v / top) if v is not None and top > 0 else 0.0
                assert r["stages"][stage]["share"] == pytest.approx(share, abs=1e-3)
                assert r["stages"][stage]["drawn"] == pytest.approx(share, abs=0.02)
            assert max(r["stages"][stage]["share"] for r in shown) == 1.0
        assert all(r["stages"]["reranked"]["value"] == "—" for r in shown)  # no reranker deployed

        expect(tab.by("coverage")).to_contain_text("1/1 shards answered")
        expect(tab.by("timings")).to_contain_text("total")
        assert not tab.script_errors, tab.script_errors
    finally:
        tab.context.close()


def test_a_filter_narrows_every_result_and_a_share_link_restores_the_search(console):
    from playwright.sync_api import expect

    console.open()
    console.search("star bread boat piano", method="keyword", limit="30")
    assert len({r["metadata"]["topic"] for r in console.results()}) > 1  # unfiltered: several topics

    console.search("star bread boat piano", filters='{"topic": "astronomy"}')
    filtered = console.results()
    assert filtered and all(r["metadata"]["topic"] == "astronomy" for r in filtered)

    console.by("share-button").click()
    link = console.by("share-url").input_value()
    assert "filters=" in link and KEY not in link
    other = Console(console.page.context.browser, key=KEY)
    try:
        other.page.goto(link)  # the form comes back, and the search runs by itself
        expect(other.by("results")).to_have_attribute("data-state", "done")
        expect(other.by("query")).to_have_value("star bread boat piano")
        expect(other.by("method")).to_have_value("keyword")
        expect(other.by("limit")).to_have_value("30")
        assert json.loads(other.by("filters").input_value()) == {"topic": "astronomy"}
        assert [r["chunk_id"] for r in other.results()] == [r["chunk_id"] for r in filtered]
        assert not other.script_errors, other.script_errors
    finally:
        other.context.close()


def test_a_judgment_is_stored_and_read_back_as_qrels(console, served, tmp_path):
    from playwright.sync_api import expect

    from deployments.judgments import query_id

    console.open()
    console.search("comet nebula telescope", limit="5")
    first = console.page.locator("[data-testid=result]").first
    doc_id = first.get_attribute("data-doc-id")
    first.get_by_test_id("judge-2").click()
    expect(first.get_by_test_id("judge-status")).to_have_text("saved (2)")
    expect(first.get_by_test_id("judge-2")).to_have_attribute("aria-pressed", "true")
    feedback = [c for c in console.calls if c[:2] == ("POST", "/feedback")]
    assert feedback == [("POST", "/feedback", f"Bearer {KEY}")]

    qrels = served.get("/feedback/qrels").text.splitlines()
    assert f"{query_id('comet nebula telescope')}\t{doc_id}\t2" in qrels

    console.page.screenshot(path=str(tmp_path / "console.png"), full_page=True)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tmp_path / "console.png", SCREENSHOT)


def test_errors_are_shown_clearly(console):
    from playwright.sync_api import expect

    console.open()
    # Bad JSON: a clear message, and nothing is sent.
    console.search("star", expect_state="invalid", filters='{"topic": astronomy')
    expect(console.by("error")).to_contain_text("Filters are not valid JSON")
    console.search("star", expect_state="invalid", filters='["astronomy"]')
    expect(console.by("error")).to_contain_text("must be a JSON object")
    assert console.searches_sent() == 0

    # The service's 4xx, with its reason; the results of an earlier search are not left on screen.
    console.search("star", filters="")
    console.search("star", expect_state="failed", filters='{"colour": "red"}')
    expect(console.by("error")).to_contain_text("422")
    expect(console.by("error")).to_contain_text("unknown filter field 'colour'")
    assert console.results() == []
    console.search("star", expect_state="failed", filters="", fusion="weighted", **{"weight-dense": "0",
                                                                                   "weight-keyword": "0"})
    expect(console.by("error")).to_contain_text("cannot both be 0")

    # A network failure.
    console.page.route("**/search", lambda route: route.abort())
    console.search("star", expect_state="failed", fusion="")
    expect(console.by("error")).to_contain_text("network error")
    console.page.unroute("**/search")

    # A key the service does not know: the key form opens again and says so.
    console.page.evaluate("sessionStorage.setItem('raysearch.apiKey', 'rsk_not-a-key')")
    console.search("star", expect_state="failed")
    expect(console.by("error")).to_contain_text("this API key is not valid")
    expect(console.by("key-panel")).to_contain_text("refused")


def test_answer_correction_warnings_and_coverage_are_shown(console, served):
    """Spell correction for real; an answer and a degraded, partial response through a canned reply (this
    app deploys no synthesis model, and its shards do not fail on request)."""
    from playwright.sync_api import expect

    console.open()
    console.page.check("#spell-correct")
    console.search("telescpe galaxy", method="keyword")
    corrected = served.post("/search", json={"query": "telescpe galaxy", "method": "keyword",
                                             "spell_correct": True}).json()["corrected_query"]
    assert corrected
    expect(console.by("corrected-query")).to_contain_text(f"Showing results for {corrected}")
    console.page.uncheck("#spell-correct")

    hostile = '<img src=x onerror="window.pwned=1"> Stars & <b>orbits</b> </p><script>window.pwned=2</script>'
    canned = {
        "query": "star orbit", "method": "hybrid", "total": 2, "cached": False, "reranked": True,
        "index_version": {"default": "v1"}, "timings_ms": {"retrieve": 3.2, "rerank": 40.0, "total": 51.5},
        "coverage": {"shards_asked": 2, "shards_answered": 1, "ratio": 0.5, "degraded": True,
                     "failed": ["shard-001"]},
        "warnings": ["shard shard-001 timed out"],
        "answer": {"text": "Stars are orbited [1], see also [2] and [7].", "model": "smollm2",
                   "citations": [{"n": 1, "chunk_id": "d1#0", "doc_id": "d1", "title": "one"},
                                 {"n": 2, "chunk_id": "d2#0", "doc_id": "d2", "title": "two"}],
                   "removed_citations": [7], "prompt_tokens": 10, "completion_tokens": 9, "ms": 120.0},
        "results": [
            {"rank": n, "chunk_id": f"d{n}#0", "doc_id": f"d{n}", "collection": "default", "title": "t",
             "section": "", "content": hostile if n == 1 else "a star orbited", "metadata": {"topic": "astronomy"},
             "score": 1.0 / n, "char_start": 0, "char_end": 5,
             "scores": {"dense": -0.2 * n, "keyword": None, "fused": 1.0 / n, "reranked": 0.9 / n},
             # the service's spans (its analyzer stems "orbited" to "orbit"); the first result has none
             **({"highlights": [{"start": 2, "end": 6}, {"start": 7, "end": 14}]} if n == 2 else {})}
            for n in (1, 2)
        ],
    }
    sent = []

    def reply(route):
        sent.append(route.request.post_data_json)
        route.fulfill(status=200, content_type="application/json", body=json.dumps(canned))

    console.page.route("**/search", reply)
    console.page.check("#synthesize")
    console.search("star orbit")
    assert sent[-1]["synthesize"] is True and sent[-1]["highlights"] is True

    links = console.by("answer-text").get_by_test_id("citation-link")
    expect(links).to_have_count(2)
    assert [links.nth(i).get_attribute("href") for i in range(2)] == ["#result-1", "#result-2"]
    expect(console.by("answer-text")).to_have_text("Stars are orbited [1], see also [2] and [7].")
    expect(console.by("answer-citations")).to_contain_text("Removed: [7]")
    links.nth(1).click()
    assert console.page.url.endswith("#result-2")

    expect(console.by("warnings")).to_contain_text("shard shard-001 timed out")
    expect(console.by("coverage")).to_contain_text("1/2 shards answered — degraded")
    expect(console.by("coverage")).to_contain_text("shard-001")

    # The hostile text is shown as text: nothing in it became an element or ran.
    first, second = console.results()
    assert first["content"] == hostile and first["marks"] == ["Stars", "orbits"]  # no spans: marked by the page
    assert second["content"] == "a star orbited" and second["marks"] == ["star", "orbited"]  # the spans, drawn
    assert console.page.locator("#results img, #results script, #results b").count() == 0
    assert console.page.evaluate("window.pwned") is None
    # Negative dense scores draw no bar but show their number; a stage nobody has shows a dash.
    assert second["stages"]["dense"] == {"value": "-0.4000", "share": 0, "drawn": 0}
    assert first["stages"]["keyword"]["value"] == "—"
    assert first["stages"]["reranked"]["share"] == 1.0 and second["stages"]["reranked"]["share"] == 0.5


def test_the_page_and_its_files_need_no_key_but_nothing_else_opens(served):
    with httpx.Client(base_url=BASE, timeout=30) as anonymous:
        page = anonymous.get("/console")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert anonymous.get("/console/console.js").headers["content-type"].startswith("text/javascript")
        assert anonymous.get("/console/console.css").headers["content-type"].startswith("text/css")
        home = anonymous.get("/")
        assert home.status_code == 307 and home.headers["location"] == "/console"
        assert anonymous.get("/console/", follow_redirects=True).url.path == "/console"
        assert anonymous.get("/console/router.py").status_code == 401
        assert anonymous.post("/search", json={"query": "star"}).status_code == 401
        assert "/console" not in anonymous.get("/openapi.json").json()["paths"]
    for name in ("router.py", "..%2Frouter.py", "__init__.py", "index.html"):
        assert served.get(f"/console/{name}").status_code == 404, name


def test_a_result_shows_its_whole_document(console):
    """The document behind a result, read by id (GET /collections/{c}/documents/{id}): its whole text, where it
    comes from and its chunks."""
    from playwright.sync_api import expect

    console.open()
    console.search("star bread boat piano", method="keyword", limit="5")
    first = console.results()[0]
    item = console.page.locator("[data-testid=result]").first
    item.locator("[data-testid=document] button").click()
    body = item.locator(".document-body")
    expect(body).to_be_visible()
    expect(body.locator(".document-origin")).to_contain_text("from the index version")
    expect(body.locator(".document-chunks")).to_contain_text(first["chunk_id"])
    text = body.locator(".document-text").text_content()
    assert first["content"] in text  # the chunk is a part of its document's text
    item.locator("[data-testid=document] button").click()
    expect(body).to_be_hidden()
