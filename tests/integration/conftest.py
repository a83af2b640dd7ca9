"""Builds shared by the integration tests: one corpus with bad lines, built with 1 and 3 shards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from index_build.build import build_index
from index_build.config import BuildConfig
from index_build.corpus import Document
from index_format.chunking import chunk_document
from tests.conftest import make_corpus, write_jsonl

ENCODER = "hashing:64"
BAD_LINES = ["{broken json", json.dumps({"title": "no id", "text": "x"}), json.dumps({"_id": "d000", "text": "dup"})]


def oracle_chunks(docs: list[dict], cfg: BuildConfig):
    """Chunks computed straight from the records, independently of the build's tables."""
    out = []
    for d in docs:
        doc = Document(d["_id"], d["title"], d["text"], d.get("metadata", {}))
        out.extend(chunk_document(doc, cfg.chunk_size, cfg.chunk_overlap))
    return out


def run_killed(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    """Run a build that kills itself (``CRASH_ENV``) as a whole job dies: its Ray processes go with it.

    The driver's ``os._exit`` alone leaves its local Ray processes behind, some for good; the rerun must find
    only what the kill left on disk, and the machine must not keep the dead job's workers."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    out, err = proc.communicate()
    deadline = time.monotonic() + 30
    while _live_in_group(proc.pid):
        if time.monotonic() > deadline:
            raise AssertionError("the killed build's processes outlived it by 30 s")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.1)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _live_in_group(pgid: int) -> bool:
    """Whether a process of the group is still running (a zombie waiting for its reaper is not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def tenant_docs() -> list[dict]:
    """30 documents split among tenants by their ``acl`` metadata field: d000 t1's, d001 t2's, d002 public, ...;
    every 7th has none (nobody's). The corpus of the tenant and MCP tests, whose oracle is ``visible_by_principal``."""
    docs = make_corpus(30, seed=11)
    for i, d in enumerate(docs):
        if i % 7 != 6:
            d["metadata"]["acl"] = ["t1", "t2", "public"][i % 3]
    return docs


def visible_by_principal(version_dir: Path, principals: tuple[str, ...] = ("t1", "t2")) -> dict[str, set[str]]:
    """principal -> the doc ids it may see (``acl`` equal to it or ``public``): the oracle of the tenant tests,
    read from the stored chunk tables, never through the service."""
    import pyarrow.parquet as pq

    seen: dict[str, set[str]] = {who: set() for who in principals}
    for shard in (Path(version_dir) / "shards").iterdir():
        t = pq.read_table(shard / "chunks.parquet")
        for doc, meta in zip(t["doc_id"].to_pylist(), t["metadata_json"].to_pylist(), strict=True):
            acl = json.loads(meta).get("acl")
            for who in seen:
                if acl in (who, "public"):
                    seen[who].add(doc)
    return seen


def unsharded_oracle(summary, folder: Path, fields: tuple[str, ...] = ()):
    """(Pyserini LuceneSearcher at BM25(0.9, 0.4), chunks, index folder): one unsharded index of every chunk of a
    build's shards, contents as the build indexes them (title + text), each of ``fields`` beside it: the oracle the
    sharded BM25 is compared with."""
    import pyarrow.parquet as pq
    from pyserini.search.lucene import LuceneSearcher

    from index_format.lucene import build_lucene_index, write_collection

    rows = []
    for shard in shard_dirs(summary):
        t = pq.read_table(shard / "chunks.parquet")
        for c, title, text in zip(t["chunk_id"].to_pylist(), t["title"].to_pylist(), t["text"].to_pylist(),
                                  strict=True):
            contents = f"{title}\n{text}" if text else title
            rows.append((c, contents, {"title": title}) if fields else (c, contents))
    write_collection(rows, folder / "coll")
    build_lucene_index(folder / "coll", folder / "index", **({"fields": list(fields)} if fields else {}))
    searcher = LuceneSearcher(str(folder / "index"))
    searcher.set_bm25(0.9, 0.4)
    return searcher, len(rows), folder / "index"


def shard_dirs(summary) -> list[Path]:
    return sorted((summary.version_dir / "shards").iterdir())


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> tuple[Path, list[dict]]:
    docs = make_corpus(60)
    lines = [json.dumps(d) for d in docs]
    lines[10:10] = BAD_LINES[:2]
    lines.append(BAD_LINES[2])
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", lines), docs


@pytest.fixture(scope="session")
def built(corpus, ray_local, tmp_path_factory):
    path, docs = corpus
    out = {}
    for shards in (1, 3):
        cfg = BuildConfig(corpus=path, out=tmp_path_factory.mktemp(f"idx{shards}"), shards=shards, encoder=ENCODER,
                          chunk_size=40, chunk_overlap=8, progress=False)
        out[shards] = (cfg, build_index(cfg))
    return out




def as_sent(response) -> str:
    """A search response as the router sends it, less what differs between two runs of the same search: its timings,
    and the time its next cursor's first page was ranked."""
    import base64
    import re

    from deployments.edge.schemas import response_json

    sent = re.sub(r'"timings_ms":\{[^}]*\},', "", response_json(response))
    if response.next_cursor is not None:
        cursor = response.next_cursor
        body = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        sent = sent.replace(cursor, json.dumps({k: v for k, v in body.items() if k != "t"}, sort_keys=True))
    return sent


LOOPBACK = ("127.0.0.1", "::1", "localhost")


@pytest.fixture
def loopback_only(monkeypatch):
    """Every connection a test's process opens to another machine is refused and recorded (a framework's background
    thread may swallow the refusal: the record fails the test)."""
    left: list = []
    connect = socket.socket.connect

    def guarded(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOOPBACK:
            left.append(address)
            raise ConnectionRefusedError(f"no connection beyond this machine: {address}")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield
    assert left == [], f"connections beyond this machine: {left}"
