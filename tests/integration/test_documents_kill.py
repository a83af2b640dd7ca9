"""Nothing acknowledged is ever lost: ``python -m deployments`` taking a stream of document writes while its router
replica is killed (SIGKILL; Serve starts another) and then the whole service is (SIGKILL to every process), then
started again on the same index root: a folder, and a root in object storage (a local S3-compatible server), whose
change log is in the store itself (``index_format.store_log``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from index_build.build import build_index
from index_build.config import BuildConfig
from index_format.collection_log import open_change_log
from index_format.object_root import ObjectRoot
from tests.conftest import make_corpus, write_jsonl
from tests.waiting import wait_until

PORT = 8801
ROOT = Path(__file__).parents[2]


class Service:
    def __init__(self, index: Path | str, state: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deployments", "--index", str(index), "--port", str(PORT), "--router.cache-size", "0",
             "--metrics-port", str(PORT + 1), "--state-dir", str(state)], cwd=ROOT,
            env=os.environ | {"PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.wait_healthy(240)

    def wait_healthy(self, seconds: float) -> None:
        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(healthy, seconds, "python -m deployments answering /health", every_s=0.3)
        except AssertionError as e:
            self.kill()
            pytest.fail(str(e))

    def router_replica(self) -> psutil.Process:
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            if "router" in " ".join(p.cmdline()) and "ServeReplica" in " ".join(p.cmdline()):
                return p
        raise AssertionError("no router replica process")

    def kill(self) -> None:
        """SIGKILL to every process of the service: no stop, no drain, no flush."""
        everyone = [self.proc, *psutil.Process(self.proc.pid).children(recursive=True)]
        for p in everyone:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        self.proc.wait(30)


class Writers:
    """Threads writing batches of 3 new documents without pause; every batch kept with its answer (the seq it
    was acknowledged with, or None when no acknowledgement came)."""

    def __init__(self, threads: int = 2):
        self.batches: list[tuple[list[str], int | None]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(t,)) for t in range(threads)]

    def _run(self, t: int) -> None:
        i = 0
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=30) as client:
            while not self.stop.is_set():
                ids = [f"w{t}-{i}-{j}" for j in range(3)]
                records = [{"id": d, "text": f"kill test token{d.replace('-', 'x')} in a stream"} for d in ids]
                seq = None
                try:
                    r = client.put("/collections/default/documents", json={"documents": records})
                    if r.status_code == 200:
                        seq = r.json()["seq"]
                except httpx.HTTPError:
                    time.sleep(0.05)  # the service is down: try again shortly
                self.batches.append((ids, seq))
                i += 1

    def acknowledged(self) -> int:
        return sum(1 for _, seq in self.batches if seq is not None)

    def wait_for(self, more: int, seconds: float = 120) -> None:
        target = self.acknowledged() + more
        wait_until(lambda: self.acknowledged() >= target, seconds,
                   lambda: f"{more} more writes acknowledged: {target - self.acknowledged()} still missing")


# The s3 variant is `make test-slow`: the multi-node tests (test_cluster.py) kill a node under writes to a log in the
# store in the default run.
@pytest.fixture(scope="module", params=["folder", pytest.param("s3", marks=pytest.mark.slow)])
def index(ray_local, tmp_path_factory, request):
    """(the index root, the state folder the service is given)."""
    folder = tmp_path_factory.mktemp("kill")
    corpus = write_jsonl(folder / "corpus.jsonl", make_corpus(20))
    summary = build_index(BuildConfig(corpus=corpus, out=folder / "index", shards=2, encoder="hashing:64", chunk_size=40,
                                      chunk_overlap=8, progress=False))
    if request.param == "folder":
        return folder / "index", folder / "state"
    import boto3

    request.getfixturevalue("s3_server")
    boto3.client("s3").create_bucket(Bucket="kill-test")
    root = ObjectRoot("s3://kill-test/idx", cache_dir=folder / "cache")
    root.upload_version(summary.version_dir, summary.version)
    root.activate(summary.version)
    return root.url, folder / "state"


def test_every_acknowledged_write_survives_kills_once_and_no_batch_is_half_applied(index):
    index, state = index
    service = Service(index, state)
    writers = Writers()
    for t in writers.threads:
        t.start()
    try:
        writers.wait_for(20)
        service.router_replica().kill()  # Serve notices and starts another replica; writes fail meanwhile
        writers.wait_for(20, seconds=180)
        service.kill()  # everything at once, mid-stream
    finally:
        writers.stop.set()
        for t in writers.threads:
            t.join()
    service = Service(index, state)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=30) as client:
            acked = [(ids, seq) for ids, seq in writers.batches if seq is not None]
            print(f"batches: {len(acked)} acknowledged, {len(writers.batches) - len(acked)} not")
            assert len(acked) >= 40
            for ids, seq in acked:  # every acknowledged document is there, from the write that was acknowledged
                for doc_id in ids:
                    r = client.get(f"/collections/default/documents/{doc_id}")
                    assert r.status_code == 200 and r.json()["seq"] == seq, (doc_id, seq, r.text)
            for ids, seq in writers.batches:  # an unacknowledged batch: all of it (stored, answer lost) or none
                if seq is None:
                    found = {client.get(f"/collections/default/documents/{d}").status_code for d in ids}
                    assert found in ({200}, {404}), (ids, found)
            for ids, _ in acked[:: max(1, len(acked) // 15)]:  # and searchable
                token = "token" + ids[0].replace("-", "x")
                hits = client.post("/search", json={"query": token, "method": "keyword", "limit": 3}).json()
                assert hits["results"][0]["doc_id"] == ids[0], (token, hits["results"][:1])
    finally:
        service.kill()
    changes = open_change_log(index).read_new()
    assert changes
    assert [c.seq for c in changes] == list(range(1, len(changes) + 1))  # each write once, in order
    written = [d["id"] for c in changes for d in c.upserts]
    assert len(written) == len(set(written))  # no batch stored twice
