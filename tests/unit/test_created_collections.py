"""Creating a collection through the API, Ray-free (``deployments.api.created``): the name claimed once in the
collections root's store, the documents uploaded where the build job reads them, the job's options, and the refusals;
a name whose first build failed is free again, one whose build runs or that has a version is not. The job's starter
is a stand-in (the served path is tests/integration/test_created_collections.py)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from deployments.api.created import REGISTRY, CreatedCollections, registered
from deployments.builds import write_record
from deployments.edge.guard import Caller
from deployments.edge.schemas import CreateCollectionRequest
from deployments.errors import Conflict, InvalidField
from index_format.prompts import EncoderSpec
from index_format.versions import activate
from tests.conftest import fake_version

ADMIN = Caller(key_id="admin-1", admin=True, writer=True)
DOCS = [{"id": "n1", "text": "the okapi lives in the forest", "metadata": {"kind": "animal"}}]


def creator(root: Path | None, started: list, served: tuple[str, ...] = ("default",)) -> CreatedCollections:
    async def start_job(index, kind, options, by, collection):
        started.append((index, kind, options, by, collection))
        return {"id": f"build-20260101T000000Z-00000{len(started)}", "kind": kind, "collection": collection,
                "root": index, "state": "running", "started": "2026-01-01T00:00:00Z", "options": options, "by": by}

    return CreatedCollections(str(root) if root else None, lambda: served, EncoderSpec("hashing:32", "q: ", "d: "),
                              None, start_job)


def create(created: CreatedCollections, name: str, documents=DOCS, **options):
    return asyncio.run(created.create(CreateCollectionRequest(name=name, documents=documents, **options), ADMIN))


def test_a_creation_claims_the_name_uploads_the_documents_and_starts_their_build(tmp_path):
    started: list = []
    answer = create(creator(tmp_path, started), "notes", shards=2)
    root = tmp_path / "notes"
    assert (answer.collection, answer.root, answer.build.state) == ("notes", str(root), "running")
    (index, kind, options, by, collection), = started
    assert (index, kind, by, collection) == (str(root), "build", "admin-1", "notes")
    assert options == {"corpus": options["corpus"], "activate": True, "encoder": "hashing:32", "query_prompt": "q: ",
                       "document_prompt": "d: ", "shards": 2}  # the default collection's encoder and prompts
    uploaded = [json.loads(line) for line in Path(options["corpus"]).read_text().splitlines()]
    assert uploaded == [{"id": "n1", "title": "", "text": DOCS[0]["text"], "metadata": {"kind": "animal"}}]
    assert Path(options["corpus"]).parent == root / "uploads"
    assert registered(str(tmp_path)) == {"notes": str(root)}
    assert create(creator(tmp_path, []), "other", encoder="other-model").build.options["encoder"] == "other-model"


def test_a_name_is_refused_while_taken_and_free_again_after_a_failed_first_build(tmp_path):
    started: list = []
    created = creator(tmp_path, started)
    answer = create(created, "notes")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record = answer.build.model_dump() | {"alive": now}
    write_record(record, tmp_path / "notes")  # what the build runner writes: the job is running (seen just now)
    with pytest.raises(Conflict, match="created already"):
        create(created, "notes")
    write_record(record | {"state": "failed"}, tmp_path / "notes")  # it failed: no version, nothing running
    assert create(created, "notes").collection == "notes" and len(started) == 2
    write_record(record | {"state": "succeeded"}, tmp_path / "notes")
    fake_version(tmp_path / "notes" / "versions" / "v1", "v1", encoder="hashing:32", dimension=32)
    activate(tmp_path / "notes", "v1", verify=False)  # its build published a version: the name stays taken
    with pytest.raises(Conflict, match="created already"):
        create(created, "notes")


def test_what_is_refused_before_anything_is_written(tmp_path):
    started: list = []
    with pytest.raises(Conflict, match="exists"):
        create(creator(tmp_path, started, served=("default", "notes")), "notes")
    with pytest.raises(InvalidField, match="documents\\[1\\]"):
        create(creator(tmp_path, started), "bad", documents=[*DOCS, {"id": "x", "text": 3}])
    with pytest.raises(Conflict, match="collections_root"):
        create(creator(None, started), "notes")
    assert started == [] and not (tmp_path / REGISTRY).exists() and not (tmp_path / "bad").exists()
