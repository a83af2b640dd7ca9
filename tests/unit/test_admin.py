"""The admin API's builds, Ray-free: a build request's options checked before a job starts, the index root a
collection builds into, and what is handed to the job's starter."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from deployments.api.admin import Builds, build_options
from deployments.edge.errors import status_of
from deployments.edge.schemas import BuildRequest
from deployments.errors import ServiceError

THERE = {Path("/data/corpus.jsonl"), Path("/data/parts"), Path("/data/changes.jsonl")}


def there(path: Path) -> bool:
    return path in THERE


@pytest.mark.parametrize(("body", "options"), [
    ({"corpus": "/data/corpus.jsonl", "shards": 4}, {"corpus": "/data/corpus.jsonl", "shards": 4}),
    ({"corpus": "/data/parts/*.jsonl"}, {"corpus": "/data/parts/*.jsonl"}),  # a glob: its folder exists
    ({"changes": "/data/changes.jsonl", "base": "v1"}, {"changes": "/data/changes.jsonl", "base": "v1"}),  # a delta
    ({"kind": "fold"}, {}),
    ({"kind": "fold", "base": "v1", "version": "v2"}, {"base": "v1", "version": "v2"}),
    ({"kind": "fold", "activate": False}, {"no_activate": True}),  # the command's flag
    ({"kind": "fold", "activate": True}, {"no_activate": None}),
])
def test_the_options_a_job_is_started_with(body, options):
    assert build_options(BuildRequest(**body), exists=there) == options


@pytest.mark.parametrize(("body", "message"), [
    ({"corpus": "/data/elsewhere.jsonl"}, "corpus: '/data/elsewhere.jsonl' does not exist on the service's machines"),
    ({"corpus": "/nowhere/*.jsonl"}, "corpus: '/nowhere/\\*.jsonl' does not exist"),
    ({"deletes": "/data/deletes.txt"}, "deletes: '/data/deletes.txt' does not exist"),
    ({}, "corpus: a build needs a corpus, or changes or deletes for a delta"),
    ({"shards": 2}, "corpus: a build needs a corpus"),
    ({"kind": "fold", "shards": 2, "base": "v1"}, "a fold takes only base, version and activate; got base, shards"),
])
def test_a_bad_option_is_a_422_naming_it(body, message):
    with pytest.raises(ServiceError, match=message) as e:
        build_options(BuildRequest(**body), exists=there)
    assert status_of(e.value) == 422


def _builds(started: list) -> Builds:
    async def start_job(root, kind, options, by, collection):
        started.append((root, kind, options, by, collection))
        return {"id": "b1", "kind": kind, "collection": collection, "root": root, "state": "running",
                "started": "2024-01-01T00:00:00Z", "options": options, "by": by}

    deployed = {"docs": SimpleNamespace(root=Path("/idx/docs")), "pinned": SimpleNamespace(root=None)}
    return Builds(deployed, "docs", start_job)


def test_a_job_starts_in_the_collections_root_and_refusals_come_first(tmp_path):
    started = []
    builds = _builds(started)
    job = asyncio.run(builds.start(BuildRequest(kind="fold"), "k1"))
    assert (job.id, job.root, job.collection, job.by) == ("b1", "/idx/docs", "docs", "k1")
    assert asyncio.run(builds.fold("docs"))["by"] == "auto"
    assert started == [("/idx/docs", "fold", {}, "k1", "docs"), ("/idx/docs", "fold", {}, "auto", "docs")]
    for name, status, message in (("nope", 404, "unknown collection 'nope'; known collections: docs, pinned"),
                                  ("pinned", 409, "serves a pinned index version")):
        with pytest.raises(ServiceError, match=message) as e:  # before the options are looked at (a bad one here)
            asyncio.run(builds.start(BuildRequest(collection=name, corpus=str(tmp_path / "missing")), None))
        assert status_of(e.value) == status
    assert len(started) == 2 and builds.roots() == [Path("/idx/docs")]


def test_prompts_given_to_the_builds_api_reach_the_build_as_given(tmp_path):
    from deployments.builds import command_for
    from index_build.cli import parse_args

    body = BuildRequest(corpus="/data/corpus.jsonl", encoder="hashing:64", query_prompt="query: ",
                        document_prompt="passage: ")
    command = command_for("build", tmp_path, build_options(body, exists=there), tmp_path / "summary.json")
    assert command[1:3] == ["-m", "index_build"]
    cfg, _ = parse_args(command[3:])
    assert (cfg.query_prompt, cfg.document_prompt) == ("query: ", "passage: ")
