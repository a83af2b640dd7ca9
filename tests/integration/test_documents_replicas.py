"""Two router replicas writing one collection's change log at once: the log stays whole and in order, and a write
taken by either replica is found by searches answered by both within a second."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from index_build.build import build_index
from index_build.config import BuildConfig
from index_format.change_log import CHANGES_DIR, ChangeLog
from tests.conftest import make_corpus, write_jsonl

PORT = 18249


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    from ray import serve

    from deployments.serve.app import build_app

    folder = tmp_path_factory.mktemp("replicas")
    corpus = write_jsonl(folder / "corpus.jsonl", make_corpus(20))
    build_index(BuildConfig(corpus=corpus, out=folder / "index", shards=2, encoder="hashing:64", chunk_size=40,
                            chunk_overlap=8, progress=False))
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    app = build_app({"index": str(folder / "index"), "router": {"num_replicas": 2, "num_cpus": 0.1, "cache_size": 0,
                                                               "shard_timeout_s": 10}})
    serve.run(app, name="replicas", route_prefix="/", blocking=False)
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as client:
        yield client, folder / "index"
    serve.delete("replicas")
    serve.shutdown()


def test_writes_through_both_replicas_keep_the_log_whole_and_show_on_both(served):
    client, index = served
    acked: list[tuple[str, int]] = []

    def write(t: int) -> None:  # through Serve's proxy, which spreads the writes over both replicas
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as c:
            for i in range(15):
                doc_id = f"r{t}-{i}"
                r = c.put("/collections/default/documents",
                          json={"documents": [{"id": doc_id, "text": f"replica token{t}x{i} written"}]})
                assert r.status_code == 200, r.text
                acked.append((doc_id, r.json()["seq"]))

    threads = [threading.Thread(target=write, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    changes = ChangeLog(index / CHANGES_DIR).read_new()
    assert [c.seq for c in changes] == list(range(1, 46))  # 45 writes from two processes: gapless, each once
    assert sorted(seq for _, seq in acked) == list(range(1, 46))
    # Every search, whichever replica answers it, finds the last write within a second of its acknowledgement.
    doc_id, _ = max(acked, key=lambda a: a[1])
    token = "token" + doc_id[1:].replace("-", "x")
    deadline, found = time.monotonic() + 1.0, 0
    while found < 20:
        r = client.post("/search", json={"query": token, "method": "keyword", "limit": 1})
        if r.json()["results"] and r.json()["results"][0]["doc_id"] == doc_id:
            found += 1
        else:
            found = 0
            assert time.monotonic() < deadline, f"{doc_id} not found by every replica within 1 s"
    replicas = {client.get(f"/collections/default/documents/{d}").json()["seq"] for d, _ in acked}
    assert replicas == set(range(1, 46))
