"""README.md as a test: its two commands exist, its example request runs against a served demo-style index
and answers with every field its example response shows, and its claims about defaults match the code.
A stale sentence or example fails here, not in a new user's terminal."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from demo.corpus import iter_demo_documents
from deployments.config import RouterSettings
from deployments.edge.schemas import SearchRequest
from index_build.build import build_index
from index_build.config import BuildConfig
from tests.conftest import write_jsonl
from tests.serving import SERVE_PORT, start_serve, stop_serving

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
PORT = SERVE_PORT


def test_the_two_commands_at_the_top_are_make_targets():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    for command in commands:  # a dry run: the target exists and its recipe expands
        done = subprocess.run([*command.split(), "-n"], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci  # CI runs the same test command


def readme_request() -> dict:
    block = re.search(r"curl -s localhost:8000/search .*?-d '(.*?)'", README, re.S)
    return json.loads(block.group(1))


def readme_response_fields() -> set[str]:
    block = re.search(r"```json\n(.*?)```", README, re.S).group(1)
    return set(re.findall(r'"(\w+)":', block))


def keys_of(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys_of(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys_of(v)}
    return set()


@pytest.fixture(scope="module")
def demo_served(ray_local, tmp_path_factory):
    """The demo's own corpus writer, limited to a few modules so the build takes seconds (hashing encoder)."""

    from deployments.settings import deploy_app

    docs = [d for d in iter_demo_documents(()) if d["metadata"]["module"] in ("gzip", "tarfile", "zipfile", "bz2")]
    assert len(docs) > 50
    corpus = write_jsonl(tmp_path_factory.mktemp("demo") / "corpus.jsonl", docs)
    summary = build_index(BuildConfig(corpus=corpus, out=tmp_path_factory.mktemp("demo-index"), shards=2,
                                      encoder="hashing:64", progress=False))
    start_serve()
    # As `make demo` serves it (`--synthesis.enabled`, no model named): the extractive engine writes the answers.
    # Its index root (not the version folder), so the documents example can write to it.
    deploy_app({"index": str(summary.version_dir.parents[1]), "synthesis": {"enabled": True, "num_cpus": 0.1}}, "readme")
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as client:
        yield client
    stop_serving()


def test_the_example_request_answers_with_every_field_the_readme_shows(demo_served):
    r = demo_served.post("/search", json=readme_request())
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["results"]) == readme_request()["limit"]
    assert all(x["metadata"]["kind"] == "function" for x in body["results"])  # the example's filter held
    missing = readme_response_fields() - keys_of(body)
    assert not missing, f"README's example response shows fields the service does not send: {missing}"


def test_the_demo_answers_with_sentences_of_its_results_each_cited_over_http(demo_served):
    r = demo_served.post("/search", json={"query": "compress a file with gzip", "limit": 5, "synthesize": True})
    assert r.status_code == 200, r.text
    body = r.json()
    answer, results = body["answer"], {x["rank"]: x for x in body["results"]}
    assert answer["model"] == "extractive" and answer["sentences"] and body["synthesis"] == answer["text"]
    for sentence in answer["sentences"]:
        assert sentence["supported"] and sentence["citations"]
        for n in sentence["citations"]:  # the sentence, its markers taken off, is a sentence of result n
            bare = re.sub(r"\s*\[\d+\]", "", sentence["text"]).strip()
            assert bare in results[n]["content"] or bare in results[n]["title"], (bare, n)
    cited = {n for s in answer["sentences"] for n in s["citations"]}
    assert {c["n"] for c in answer["citations"]} == cited
    assert all(c["chunk_id"] == results[c["n"]]["chunk_id"] and c["doc_id"] == results[c["n"]]["doc_id"]
               for c in answer["citations"])


def _literal(text: str):
    text = text.strip().strip("`")
    if text in ("on", "off"):
        return text == "on"
    if text == "none":
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"[a-z_]+", text):
        return text
    raise ValueError(text)


def test_the_request_table_states_the_code_defaults():
    table = README.split("`POST /search` takes:", 1)[1].split("\n\n", 2)[1]
    checked = 0
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        fields = re.findall(r"`(\w+)`", cells[0])
        if len(fields) != 1:
            continue  # several fields in a row: their defaults are the service's settings, checked below
        field = SearchRequest.model_fields[fields[0]]
        stated = cells[1]
        if stated == "required":
            assert field.is_required(), fields[0]
        elif (setting := re.search(r"\(`router\.(\w+)`\)", stated)) is not None:
            assert _literal(stated.split(" (")[0]) == getattr(RouterSettings(), setting.group(1)), fields[0]
        else:
            try:
                value = _literal(stated)
            except ValueError:
                continue  # a rule in words ("the router's rule"), not a value
            default = field.default.value if hasattr(field.default, "value") else field.default
            if value is False and field.annotation is not bool:
                value = None  # "off" for a setting that is not a switch: none given
            assert default == value, (fields[0], stated, default)
        checked += 1
    assert checked >= 10


def test_every_router_setting_default_the_readme_quotes_is_the_code_default():
    quoted = re.findall(r"`router\.(\w+)`(?:,| \() ?([\d.]+)( ?s\b)?", README)
    assert len(quoted) >= 4
    defaults = RouterSettings()
    for name, number, _ in quoted:
        assert float(number) == float(getattr(defaults, name)), (name, number, getattr(defaults, name))


def test_the_python_client_example_runs_as_written(demo_served):
    """README's client example, executed against a served demo-style index (only its address changed)."""
    block = re.search(r"```python\n(from raysearch_client import .*?)```", README, re.S).group(1)
    code = block.replace("http://127.0.0.1:8000", str(demo_served.base_url).rstrip("/"))
    namespace: dict = {}
    exec(compile(code, "README.md (client example)", "exec"), namespace)  # noqa: S102 - the README's own code
    assert namespace["page"].results and all(not isinstance(a, Exception) for a in namespace["answers"])
    assert namespace["event"].type == "answer" and namespace["event"].text  # the stream's last event: the answer


def test_the_mcp_example_runs_as_written(demo_served):
    """README's MCP example, with the SDK's client, against the served demo-style index (keys off: every tool)."""
    block = re.search(r"```python\n(import asyncio\n\nimport httpx2\n.*?)```", README, re.S).group(1)
    code = block.replace("http://127.0.0.1:8000", str(demo_served.base_url).rstrip("/"))
    namespace: dict = {"__name__": "readme_mcp"}
    exec(compile(code, "README.md (MCP example)", "exec"), namespace)  # noqa: S102 - the README's own code
    found = namespace["found"]
    assert not found.is_error and found.structured_content["results"]
    http = demo_served.post("/search", json={"query": "compress a file", "limit": 3}).json()
    assert [r["chunk_id"] for r in found.structured_content["results"]] == [r["chunk_id"] for r in http["results"]]


def _readme_documents_calls() -> list[tuple[str, str, dict | None, dict]]:
    """README's documents example: each curl (method, path, body) with the answer shown below it."""
    block = README.split("### Documents: write, read and delete by id", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    calls, lines = [], block.replace("\\\n", " ").splitlines()
    for command, answer in zip(lines[::2], lines[1::2], strict=True):
        method = re.search(r"-X (\w+)", command)
        path = re.search(r"localhost:8000(\S+)", command).group(1)
        body = re.search(r"-d '(.*)'", command)
        shown = answer.lstrip("# ").replace(",...", "")
        calls.append((method.group(1) if method else "GET", path, json.loads(body.group(1)) if body else None, shown))
    return calls


def test_the_documents_example_runs_as_shown(demo_served):
    """README's documents example against the served demo-style index: every field each answer shows, with
    the values it shows (sequence numbers counted from this collection's first write)."""
    first_seq = None
    for method, path, body, shown in _readme_documents_calls():
        r = demo_served.request(method, path, json=body)
        assert r.status_code == 200, (path, r.text)
        got = r.json()
        expected = json.loads(shown if shown.endswith("}") else shown + "}")
        for key, value in expected.items():
            if key == "seq":
                first_seq = got["seq"] if first_seq is None else first_seq
                value = value - 1 + first_seq
            assert got[key] == value, (path, key, got[key], value)
    assert demo_served.get("/collections/default/documents/notes-1").status_code == 404  # deleted, as shown
