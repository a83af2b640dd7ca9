"""Two router replicas writing one collection's change log at once: the log stays whole and in order, each replica
takes writes, a write taken by either is found by searches answered by both within a second, and one replica's
writes by searches the other answers."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from index_build.build import build_index
from index_build.config import BuildConfig
from index_format.change_log import CHANGES_DIR, ChangeLog
from tests.conftest import make_corpus, write_jsonl
from tests.serving import SERVE_PORT, start_serve, stop_serving
from tests.waiting import wait_until

PORT = SERVE_PORT
RUN = uuid.uuid4().hex[:8]  # in this run's request ids: the session's logs hold other tests' lines too


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    from ray import serve

    from deployments.serve.app import build_app

    folder = tmp_path_factory.mktemp("replicas")
    corpus = write_jsonl(folder / "corpus.jsonl", make_corpus(20))
    build_index(BuildConfig(corpus=corpus, out=folder / "index", shards=2, encoder="hashing:64", chunk_size=40,
                            chunk_overlap=8, progress=False))
    start_serve()
    app = build_app({"index": str(folder / "index"), "router": {"num_replicas": 2, "num_cpus": 0.1, "cache_size": 0,
                                                               "shard_timeout_s": 10}})
    serve.run(app, name="replicas", route_prefix="/", blocking=False)
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as client:
        yield client, folder / "index"
    stop_serving()


def replicas_of(event: str, request_ids: set[str]) -> dict[str, str]:
    """Request id -> the replica whose ``event`` line (the router's "write" or "search") carries it, from the JSON
    lines Serve writes in this Ray session's logs/serve/ (one file a replica; each line names its replica)."""
    from ray.serve._private.logging_utils import get_serve_logs_dir  # where Serve itself writes them

    out = {}
    for path in Path(get_serve_logs_dir()).glob("replica_*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{") and f'"{event}"' in line:
                record = json.loads(line)
                if record.get("event") == event and record.get("request_id") in request_ids:
                    out[record["request_id"]] = record["replica"]
    return out


def test_writes_through_both_replicas_keep_the_log_whole_and_show_on_both(served):
    client, index = served
    acked: list[tuple[str, int, str]] = []  # (document, seq, request id)

    def write(t: int) -> None:  # through Serve's proxy, which spreads the writes over both replicas
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as c:
            for i in range(15):
                doc_id, request_id = f"r{t}-{i}", f"{RUN}-write-r{t}-{i}"
                r = c.put("/collections/default/documents", headers={"X-Request-Id": request_id},
                          json={"documents": [{"id": doc_id, "text": f"replica {token(doc_id)} written"}]})
                assert r.status_code == 200, r.text
                acked.append((doc_id, r.json()["seq"], request_id))

    threads = [threading.Thread(target=write, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    changes = ChangeLog(index / CHANGES_DIR).read_new()
    assert [c.seq for c in changes] == list(range(1, 46))  # 45 writes from two processes: gapless, each once
    assert sorted(seq for _, seq, _ in acked) == list(range(1, 46))

    # Each replica acknowledged writes: every write's line in Serve's log names the replica that took it.
    writes = {request_id for *_, request_id in acked}

    def every_write_logged() -> dict[str, str] | None:
        found = replicas_of("write", writes)
        return found if found.keys() == writes else None

    took = wait_until(every_write_logged, 30, lambda: f"a 'write' log line for each of the 45 writes: "
                      f"{len(replicas_of('write', writes))} found")
    last_taken = {took[request_id]: doc_id for doc_id, _, request_id in sorted(acked, key=lambda a: a[1])}
    assert len(last_taken) == 2, f"every write was taken by replica {set(last_taken)}: both of two should take some"

    # Every search, whichever replica answers it, finds the last write within a second of its acknowledgement.
    doc_id, _, _ = max(acked, key=lambda a: a[1])
    deadline, found = time.monotonic() + 1.0, 0
    while found < 20:
        r = client.post("/search", json={"query": token(doc_id), "method": "keyword", "limit": 1})
        if r.json()["results"] and r.json()["results"][0]["doc_id"] == doc_id:
            found += 1
        else:
            found = 0
            assert time.monotonic() < deadline, f"{doc_id} not found by every replica within 1 s"

    # What one replica took, the other finds.
    for replica, doc_id in last_taken.items():
        wait_found_elsewhere(client, doc_id, replica)
    seqs = {client.get(f"/collections/default/documents/{d}").json()["seq"] for d, _, _ in acked}
    assert seqs == set(range(1, 46))


def wait_found_elsewhere(client, doc_id: str, taken_by: str) -> None:
    """Search for ``doc_id`` (each search must find it) until a replica other than ``taken_by`` has answered one:
    which replica answers is the proxy's choice, its "search" log line says which did."""
    searches: list[str] = []

    def answered_elsewhere() -> bool:
        request_id = f"{RUN}-search-{doc_id}-{len(searches)}"
        r = client.post("/search", json={"query": token(doc_id), "method": "keyword", "limit": 1},
                        headers={"X-Request-Id": request_id})
        assert [x["doc_id"] for x in r.json()["results"]] == [doc_id], r.text
        searches.append(request_id)
        return any(replica != taken_by for replica in replicas_of("search", set(searches)).values())

    wait_until(answered_elsewhere, 30, lambda: f"a search for {doc_id} answered by a replica other than {taken_by}, "
               f"which took the write: {len(searches)} searches, none", every_s=0.1)


def token(doc_id: str) -> str:
    """The one word only ``doc_id``'s text holds: r1-7 -> token1x7."""
    return "token" + doc_id[1:].replace("-", "x")
