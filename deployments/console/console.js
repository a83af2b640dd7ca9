/* raysearch search console: one page over the service's own API (GET /health, POST /search,
 * POST /feedback). No framework and no build step.
 *
 * Everything a response holds is put on the page as text (textContent, text nodes), never parsed as
 * HTML, so a document's text can never become markup or script. The API key lives in sessionStorage
 * only: it is gone when the tab closes and is never written into a share link.
 */
"use strict";

(() => {
  // The page is served at PREFIX/console; the API lives beside it (PREFIX/search, PREFIX/health).
  const BASE = window.location.pathname.replace(/\/console\/?$/, "");
  const KEY_STORAGE = "raysearch.apiKey";
  // The stages a result's score passes through, as SearchResponse names them in `scores`.
  const STAGES = [["keyword", "BM25"], ["dense", "dense"], ["fused", "fused"], ["reranked", "reranked"]];
  const LABELS = [[0, "not relevant"], [1, "relevant"], [2, "highly relevant"], [3, "perfectly relevant"]];
  const STOPWORDS = new Set(["the", "an", "of", "and", "or", "to", "in", "on", "for", "with", "is", "are",
    "what", "how", "why", "do", "does"]);
  // Form fields by share-link parameter name; checkboxes are "1" when on.
  const FIELDS = {
    q: "query", collection: "collection", method: "method", limit: "limit", filters: "filters",
    fusion: "fusion", rrf_k: "rrf-k", w_dense: "weight-dense", w_keyword: "weight-keyword",
    mmr: "mmr-lambda", rerank: "rerank",
  };
  const CHECKBOXES = { synth: "synthesize", spell: "spell-correct" };

  const $ = (id) => document.getElementById(id);
  const state = {
    retry: null,            // what to run again once a key has been given (after a 401)
    controller: null,       // aborts a search still running when a new one starts
    searchedQuery: null,    // the query of the results shown: what a judgment is about
    wantedCollection: null, // from a share link, selected once /health has listed the collections
  };

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  class FormError extends Error {}

  // ---------------------------------------------------------------- API key (sessionStorage only)

  function storedKey() {
    try {
      return window.sessionStorage.getItem(KEY_STORAGE) || "";
    } catch {
      return ""; // storage disabled: the page still works against a service without keys
    }
  }

  function storeKey(key) {
    try {
      if (key) window.sessionStorage.setItem(KEY_STORAGE, key);
      else window.sessionStorage.removeItem(KEY_STORAGE);
    } catch {
      showError("This browser does not allow sessionStorage here, so the key cannot be kept.");
    }
  }

  /** Open the key form; `refusal` is the 401's message (none when the person asked for the form). */
  function askForKey(refusal, retry) {
    state.retry = retry || null;
    const where = "It is kept for this tab only (sessionStorage).";
    $("key-message").textContent = !refusal ? `API key for this service. ${where}`
      : storedKey() ? `The service refused the key (${refusal}). Enter another API key.`
        : `This service needs an API key. ${where}`;
    $("key-panel").hidden = false;
    $("api-key").value = "";
    $("api-key").focus();
  }

  function onKeySubmit(event) {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) {
      $("key-message").textContent = "Enter a key first.";
      return;
    }
    storeKey(key);
    $("api-key").value = "";
    $("key-panel").hidden = true;
    showError("");
    const retry = state.retry;
    state.retry = null;
    if (retry) retry();
  }

  function forgetKey() {
    storeKey("");
    $("api-key").value = "";
    setStatus("The API key was forgotten.");
  }

  // ---------------------------------------------------------------- HTTP

  /** Call the API; resolves to the parsed body, or rejects with an ApiError saying what went wrong. */
  async function api(path, { method = "GET", body, signal, okStatuses = [] } = {}) {
    const headers = { Accept: "application/json" };
    const key = storedKey();
    if (key) headers.Authorization = `Bearer ${key}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let response, payload;
    try {
      response = await fetch(BASE + path, {
        method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
      });
      payload = await readBody(response);
    } catch (err) {
      if (err.name === "AbortError") throw err;
      throw new ApiError(0, `network error: the service could not be reached (${err.message})`);
    }
    if (response.ok || okStatuses.includes(response.status)) return payload;
    throw new ApiError(response.status, describeFailure(response, payload));
  }

  async function readBody(response) {
    const text = await response.text();
    try {
      return JSON.parse(text);
    } catch {
      return text; // a proxy's HTML or plain-text error page
    }
  }

  /** "422 Unprocessable Entity: invalid request (limit: ...)" from the service's {error, detail}. */
  function describeFailure(response, payload) {
    const head = `${response.status} ${response.statusText}`.trim();
    let message = "";
    if (payload && typeof payload === "object") {
      const detail = payload.detail;
      const details = Array.isArray(detail)
        ? detail.map((d) => (d && d.field !== undefined ? `${d.field}: ${d.error}` : d.msg || JSON.stringify(d)))
        : detail ? [typeof detail === "string" ? detail : JSON.stringify(detail)] : [];
      message = [payload.error, details.join("; ")].filter(Boolean).join(": ");
    } else if (typeof payload === "string") {
      message = payload.replace(/<[^>]*>/g, " ").replace(/\s+/g, " ").trim().slice(0, 300);
    }
    return message ? `${head}: ${message}` : head;
  }

  // ---------------------------------------------------------------- messages

  function showError(message) {
    $("error").textContent = message;
    $("error").hidden = !message;
  }

  function setStatus(message) {
    $("status").textContent = message;
  }

  /** Show a failed call; a 401 also asks for a key and remembers what to run again with it. */
  function reportFailure(context, err, retry) {
    if (err.name === "AbortError") return;
    showError(`${context}: ${err.message}`);
    if (err.status === 401) askForKey(err.message, retry);
  }

  // ---------------------------------------------------------------- the form and share links

  function readForm() {
    const form = {};
    for (const [name, id] of Object.entries(FIELDS)) form[name] = $(id).value;
    for (const [name, id] of Object.entries(CHECKBOXES)) form[name] = $(id).checked;
    return form;
  }

  function writeForm(params) {
    for (const [name, id] of Object.entries(FIELDS)) {
      if (params.has(name)) $(id).value = params.get(name);
    }
    for (const [name, id] of Object.entries(CHECKBOXES)) {
      if (params.has(name)) $(id).checked = params.get(name) === "1";
    }
    // The collection options come from /health, which has not answered yet.
    state.wantedCollection = params.get("collection");
    syncFusionFields();
  }

  /** The form as share-link parameters: only what is set, never the key. */
  function formToParams(form) {
    const params = new URLSearchParams();
    for (const name of Object.keys(FIELDS)) {
      const value = form[name].trim();
      const unused = form.fusion === "weighted" ? name === "rrf_k" : name === "w_dense" || name === "w_keyword";
      if (value && !unused) params.set(name, value);
    }
    for (const name of Object.keys(CHECKBOXES)) if (form[name]) params.set(name, "1");
    return params;
  }

  function shareUrl() {
    const url = new URL(window.location.href);
    url.search = formToParams(readForm()).toString();
    url.hash = "";
    return url.toString();
  }

  function onShare() {
    const url = shareUrl();
    window.history.replaceState(null, "", url);
    const field = $("share-url");
    field.value = url;
    field.hidden = false;
    field.select();
    // The clipboard API exists only in secure contexts (https or localhost); the field is there anyway.
    if (navigator.clipboard) {
      navigator.clipboard.writeText(url).then(() => setStatus("Link copied."), () => setStatus("Link ready to copy."));
    }
  }

  /** Weights apply to weighted fusion only, rrf_k to RRF only: grey out the ones that do not. */
  function syncFusionFields() {
    const weighted = $("fusion").value === "weighted";
    $("weight-dense").disabled = !weighted;
    $("weight-keyword").disabled = !weighted;
    $("rrf-k").disabled = weighted;
  }

  function parseNumber(text, field) {
    const value = Number(text);
    if (text.trim() === "" || !Number.isFinite(value)) throw new FormError(`${field} must be a number.`);
    return value;
  }

  function parseFilters(text) {
    if (!text.trim()) return null;
    let filters;
    try {
      filters = JSON.parse(text);
    } catch (err) {
      throw new FormError(`Filters are not valid JSON (${err.message}). Nothing was sent.`);
    }
    if (filters === null || typeof filters !== "object" || Array.isArray(filters)) {
      throw new FormError('Filters must be a JSON object, e.g. {"topic": "astronomy"}. Nothing was sent.');
    }
    return filters;
  }

  /** The SearchRequest body for the form; options left empty are left to the service's defaults. */
  function buildRequest(form) {
    const query = form.q.trim();
    if (!query) throw new FormError("Type something to search for.");
    // The service marks the query's terms as BM25 matched them (its analyzer's stems): the page only draws them.
    const request = { query, method: form.method, highlights: true };
    if (form.limit.trim()) request.limit = parseNumber(form.limit, "Limit");
    if (form.collection) request.collections = [form.collection];
    const filters = parseFilters(form.filters);
    if (filters) request.filters = filters;
    if (form.fusion) request.fusion = form.fusion;
    if (form.fusion === "weighted") {
      request.weights = { dense: parseNumber(form.w_dense, "Dense weight"),
        keyword: parseNumber(form.w_keyword, "Keyword weight") };
    } else if (form.rrf_k.trim()) {
      request.rrf_k = parseNumber(form.rrf_k, "rrf_k");
    }
    if (form.mmr.trim()) request.mmr_lambda = parseNumber(form.mmr, "MMR λ");
    if (form.rerank) request.rerank = form.rerank === "on";
    if (form.synth) request.synthesize = true;
    if (form.spell) request.spell_correct = true;
    return request;
  }

  // ---------------------------------------------------------------- health and collections

  async function loadHealth() {
    try {
      // 503 still lists the shards (none answering): show it rather than fail.
      const health = await api("/health", { okStatuses: [503] });
      fillCollections(health);
      renderHealth(health);
    } catch (err) {
      $("health").textContent = "Service health unknown.";
      reportFailure("Health check failed", err, loadHealth);
    }
  }

  function fillCollections(health) {
    const select = $("collection");
    select.replaceChildren();
    for (const [name, version] of Object.entries(health.collections)) {
      select.append(new Option(`${name} (${version})`, name, false, name === health.default_collection));
    }
    const wanted = state.wantedCollection;
    if (wanted && !(wanted in health.collections)) {
      // Kept as asked, so the search reports the unknown collection instead of silently using another.
      select.append(new Option(`${wanted} (not listed)`, wanted));
    }
    if (wanted) select.value = wanted;
  }

  function renderHealth(health) {
    const parts = Object.entries(health.collections).map(([name, version]) => {
      const shards = health.shards.filter((s) => s.collection === name);
      const up = shards.filter((s) => s.ok);
      const chunks = up.reduce((sum, s) => sum + (s.chunks || 0), 0);
      const down = shards.filter((s) => !s.ok).map((s) => `${s.shard}: ${s.error || "down"}`);
      return `${name} ${version}: ${up.length}/${shards.length} shards up, ${chunks} chunks`
        + (down.length ? ` (${down.join(", ")})` : "");
    });
    const stages = Object.entries(health.stages || {}).map(([stage, s]) => `${stage} ${s}`);
    const el = $("health");
    el.textContent = [`Service ${health.status}`, ...parts, ...stages].join(" · ");
    el.dataset.status = health.status;
  }

  // ---------------------------------------------------------------- searching

  async function runSearch() {
    let request;
    try {
      request = buildRequest(readForm());
    } catch (err) {
      if (!(err instanceof FormError)) throw err;
      showError(err.message);
      setSearchState("invalid");
      return;
    }
    // The address bar always holds the search on screen, so it can be copied as it is.
    window.history.replaceState(null, "", shareUrl());
    if (state.controller) state.controller.abort();
    const controller = (state.controller = new AbortController());
    showError("");
    setStatus("Searching…");
    setSearchState("searching");
    $("search-button").disabled = true;
    try {
      const response = await api("/search", { method: "POST", body: request, signal: controller.signal });
      renderResponse(response);
      setSearchState("done");
    } catch (err) {
      if (err.name === "AbortError") return;
      clearResponse(); // results left on screen would look like this query's
      setStatus("");
      setSearchState("failed");
      reportFailure("Search failed", err, runSearch);
    } finally {
      if (state.controller === controller) {
        state.controller = null;
        $("search-button").disabled = false;
      }
    }
  }

  /** idle, invalid, searching, done or failed: lets a person's tools (and the browser test) see where a
   * search is without guessing from the text. */
  function setSearchState(phase) {
    $("results").dataset.state = phase;
  }

  function clearResponse() {
    $("results").replaceChildren();
    $("summary").hidden = true;
    $("answer").hidden = true;
  }

  function renderResponse(response) {
    state.searchedQuery = response.query;
    const pattern = termPattern(queryTerms(response.query, response.corrected_query));
    renderSummary(response);
    renderAnswer(response.answer, new Set(response.results.map((r) => r.rank)));
    renderResults(response.results, pattern);
    const n = response.results.length;
    setStatus(`${n} result${n === 1 ? "" : "s"} (${response.method}${response.cached ? ", from the cache" : ""}`
      + `${response.reranked ? ", reranked" : ""}) in ${formatMs(response.timings_ms.total)}.`);
  }

  function renderSummary(response) {
    $("summary").hidden = false;

    const corrected = $("corrected-query");
    corrected.hidden = !response.corrected_query;
    if (response.corrected_query) {
      const strong = document.createElement("strong");
      strong.textContent = response.corrected_query;
      corrected.replaceChildren("Showing results for ", strong, ` (you typed “${response.query}”).`);
    }

    const warnings = $("warnings");
    warnings.replaceChildren(...(response.warnings || []).map((w) => element("li", w)));
    warnings.hidden = !warnings.children.length;

    const c = response.coverage;
    const coverage = $("coverage");
    coverage.textContent = `Coverage: ${c.shards_answered}/${c.shards_asked} shards answered`
      + (c.degraded ? " — degraded, results may be incomplete" : "")
      + (c.failed && c.failed.length ? ` (failed: ${c.failed.join(", ")})` : "")
      + ` · index ${Object.entries(response.index_version).map(([k, v]) => `${k} ${v}`).join(", ")}`;
    coverage.classList.toggle("degraded", Boolean(c.degraded));

    $("timings").textContent = "Timings: " + Object.entries(response.timings_ms)
      .map(([stage, ms]) => `${stage} ${formatMs(ms)}`).join(" · ");
  }

  /** The synthesized answer; each [n] whose result is on the page links to that result. */
  function renderAnswer(answer, ranks) {
    const section = $("answer");
    section.hidden = !answer;
    if (!answer) return;
    const text = $("answer-text");
    text.replaceChildren();
    let last = 0;
    for (const match of answer.text.matchAll(/\[(\d+)\]/g)) {
      text.append(answer.text.slice(last, match.index));
      const n = Number(match[1]);
      text.append(ranks.has(n) ? resultLink(n, match[0]) : match[0]);
      last = match.index + match[0].length;
    }
    text.append(answer.text.slice(last));

    const list = $("answer-citations");
    list.replaceChildren(...answer.citations.map((c) => {
      const item = element("li");
      item.append(ranks.has(c.n) ? resultLink(c.n, `[${c.n}]`) : `[${c.n}]`, ` ${c.title} — ${c.doc_id}`);
      return item;
    }));
    if (answer.removed_citations && answer.removed_citations.length) {
      list.append(element("li", `Removed: ${answer.removed_citations.map((n) => `[${n}]`).join(" ")} `
        + "(the model cited sources it was not given)."));
    }
    list.append(element("li", `${answer.model} · ${answer.completion_tokens} tokens · ${formatMs(answer.ms)}`));
  }

  function resultLink(n, text) {
    const link = element("a", text);
    link.href = `#result-${n}`;
    link.className = "cite";
    link.dataset.testid = "citation-link";
    return link;
  }

  // ---------------------------------------------------------------- results

  function renderResults(results, pattern) {
    const maxima = stageMaxima(results);
    $("results").replaceChildren(...results.map((r) => resultItem(r, pattern, maxima)));
  }

  function resultItem(result, pattern, maxima) {
    const item = element("li");
    item.className = "result";
    item.id = `result-${result.rank}`;
    Object.assign(item.dataset, { testid: "result", rank: result.rank, chunkId: result.chunk_id,
      docId: result.doc_id, collection: result.collection });

    const head = element("div");
    head.className = "result-head";
    head.append(element("span", `${result.rank}.`, "rank"), element("strong", result.title || result.doc_id, "title"),
      element("span", `doc ${result.doc_id} · chunk ${result.chunk_id} · ${result.collection}`, "ids"),
      element("span", `score ${formatScore(result.score)}`, "score"));

    const content = element("p", null, "content");
    content.dataset.testid = "content";
    if (Array.isArray(result.highlights)) appendSpans(content, result.content, result.highlights);
    else appendHighlighted(content, result.content, pattern); // a service that sent no spans

    item.append(head, content, metadataList(result.metadata), stageBars(result.scores, maxima), judgeControl(result),
      documentControl(result));
    return item;
  }

  /** "Show document": the whole document the chunk came from (GET /collections/{c}/documents/{id}), in place. */
  function documentControl(result) {
    const box = element("div", null, "document");
    box.dataset.testid = "document";
    const button = element("button", "Show document");
    button.type = "button";
    const body = element("div", null, "document-body");
    body.hidden = true;
    button.addEventListener("click", async () => {
      if (!body.hidden) {
        body.hidden = true;
        button.textContent = "Show document";
        return;
      }
      button.disabled = true;
      try {
        const path = `/collections/${encodeURIComponent(result.collection)}/documents/${encodeURIComponent(result.doc_id)}`;
        const doc = await api(path);
        const origin = doc.source === "api" ? `written through the API (write ${doc.seq})` : "from the index version";
        body.replaceChildren(element("p", `${doc.title || doc.id} — ${origin}`, "document-origin"),
          element("p", doc.text, "document-text"),
          element("p", `${doc.chunk_ids.length} chunks: ${doc.chunk_ids.join(", ")}`, "document-chunks"));
        button.textContent = "Hide document";
      } catch (err) {
        body.replaceChildren(element("p", err.message, "document-error"));
      } finally {
        body.hidden = false;
        button.disabled = false;
      }
    });
    box.append(button, body);
    return box;
  }

  function metadataList(metadata) {
    const list = element("dl", null, "metadata");
    list.dataset.testid = "metadata";
    for (const [field, value] of Object.entries(metadata || {})) {
      const dd = element("dd", typeof value === "string" ? value : JSON.stringify(value));
      dd.dataset.field = field;
      list.append(element("dt", field), dd);
    }
    return list;
  }

  /** The largest score of each stage among the shown results: each stage's bars are scaled to it. */
  function stageMaxima(results) {
    const maxima = {};
    for (const [stage] of STAGES) {
      const values = results.map((r) => r.scores[stage]).filter((v) => typeof v === "number");
      maxima[stage] = values.length ? Math.max(...values) : null;
    }
    return maxima;
  }

  function stageBars(scores, maxima) {
    const box = element("div", null, "stages");
    box.dataset.testid = "stages";
    for (const [stage, label] of STAGES) {
      const value = scores[stage];
      const present = typeof value === "number";
      const max = maxima[stage];
      // A bar is the share of the best score of its stage on this page; negative scores show no bar.
      const share = present && max > 0 ? Math.max(0, value / max) : 0;
      const fill = element("span", null, "fill");
      fill.style.width = `${(share * 100).toFixed(1)}%`;
      const bar = element("span", null, "bar");
      bar.append(fill);
      const number = element("span", present ? formatScore(value) : "—", "stage-value");
      number.dataset.testid = "stage-value";
      const row = element("div", null, present ? "stage" : "stage absent");
      Object.assign(row.dataset, { stage, share: share.toFixed(4), testid: `stage-${stage}` });
      row.append(element("span", label, "stage-name"), bar, number);
      box.append(row);
    }
    return box;
  }

  // ---------------------------------------------------------------- judgments

  function judgeControl(result) {
    const box = element("div", null, "judge");
    box.dataset.testid = "judge";
    const status = element("span", "", "judge-status");
    status.dataset.testid = "judge-status";
    status.setAttribute("aria-live", "polite");
    box.append(element("span", "Judge:", "judge-label"));
    for (const [label, meaning] of LABELS) {
      const button = element("button", String(label));
      button.type = "button";
      button.title = `${label}: ${meaning}`;
      button.dataset.label = label;
      button.dataset.testid = `judge-${label}`;
      button.setAttribute("aria-pressed", "false");
      button.addEventListener("click", () => judge(result, label, box, status));
      box.append(button);
    }
    box.append(status);
    return box;
  }

  async function judge(result, label, box, status) {
    status.textContent = "saving…";
    status.className = "judge-status";
    try {
      await api("/feedback", { method: "POST", body: { query: state.searchedQuery, chunk_id: result.chunk_id, label,
        collection: result.collection } });
      for (const button of box.querySelectorAll("button")) {
        button.setAttribute("aria-pressed", String(Number(button.dataset.label) === label));
      }
      status.textContent = `saved (${label})`;
      status.classList.add("saved");
    } catch (err) {
      status.textContent = `not saved: ${err.message}`;
      status.classList.add("failed");
      reportFailure("Judgment not saved", err, () => judge(result, label, box, status));
    }
  }

  // ---------------------------------------------------------------- highlighting

  /** The words of the query worth marking, longest first (so the longer of two overlapping terms wins). */
  function queryTerms(...queries) {
    const terms = new Set();
    for (const query of queries) {
      for (const word of (query || "").toLowerCase().match(/[\p{L}\p{N}]+/gu) || []) {
        if (word.length > 1 && !STOPWORDS.has(word)) terms.add(word);
      }
    }
    return [...terms].sort((a, b) => b.length - a.length);
  }

  /** Whole words with an optional plural ending: "star" marks "Stars" but not "start". */
  function termPattern(terms) {
    if (!terms.length) return null;
    const alternatives = terms.map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|");
    return new RegExp(`(?<![\\p{L}\\p{N}])(?:${alternatives})(?:e?s)?(?![\\p{L}\\p{N}])`, "giu");
  }

  /** Append text to parent with the service's spans ({start, end}, in text order) in <mark>: text nodes only. */
  function appendSpans(parent, text, spans) {
    let last = 0;
    for (const { start, end } of spans) {
      if (start < last || end <= start || end > text.length) continue; // never a span out of order or bounds
      parent.append(text.slice(last, start), element("mark", text.slice(start, end)));
      last = end;
    }
    parent.append(text.slice(last));
  }

  /** Append text to parent with the matched terms in <mark>: text nodes only, so nothing is parsed. */
  function appendHighlighted(parent, text, pattern) {
    if (!pattern) {
      parent.append(text);
      return;
    }
    let last = 0;
    for (const match of text.matchAll(pattern)) {
      parent.append(text.slice(last, match.index), element("mark", match[0]));
      last = match.index + match[0].length;
    }
    parent.append(text.slice(last));
  }

  // ---------------------------------------------------------------- small helpers

  function element(tag, text, className) {
    const el = document.createElement(tag);
    if (text !== null && text !== undefined) el.textContent = text;
    if (className) el.className = className;
    return el;
  }

  function formatScore(value) {
    return Math.abs(value) >= 1000 ? value.toFixed(0) : value.toFixed(4);
  }

  function formatMs(ms) {
    return typeof ms === "number" ? `${ms.toFixed(1)} ms` : "—";
  }

  // ---------------------------------------------------------------- start

  function start() {
    // A bug in this page must still say something, never leave a silent or blank page.
    window.addEventListener("error", (e) => showError(`The console failed: ${e.message}`));
    window.addEventListener("unhandledrejection", (e) =>
      showError(`The console failed: ${(e.reason && e.reason.message) || e.reason}`));

    $("search-form").addEventListener("submit", (event) => {
      event.preventDefault();
      runSearch();
    });
    $("share-button").addEventListener("click", onShare);
    $("fusion").addEventListener("change", syncFusionFields);
    $("key-panel").addEventListener("submit", onKeySubmit);
    $("key-forget").addEventListener("click", forgetKey);
    $("key-button").addEventListener("click", () => askForKey(null, null));

    const params = new URLSearchParams(window.location.search);
    writeForm(params);
    // A share link runs its search once the collections are known.
    loadHealth().then(() => {
      if (params.get("q")) runSearch();
    });
  }

  start();
})();
