"""deploy/rayservice.yaml's serveConfigV2, run the way its head pod runs it, answers a search.

Nothing of this test's own process reaches the app: a subprocess in an empty folder, with only the environment the
manifest and the image give the head container (the Dockerfile's ENV, the container's env, the Secret's keys, here
those of the local S3 server), starts one Ray node offering what the worker groups offer together at their
minReplicas, and deploys serveConfigV2 as KubeRay does (the dashboard hands it to Serve's ``deploy_apps``). The
store holds what the manifest names: the index root s3://raysearch/indexes/docs and the reranker's folder under
s3://raysearch/models/, copied to the pod's /models by the manifest's own init container command.

Mapped, and only this: each mountPath of the pods to a folder of the test (one node stands for all pods); the GPU to
none (the reranker on CPU, ``num_gpus: 0``); the encoder to the tests' hashing encoder, through the index (the served
encoder is the one the index's manifest names); the reranker to the tests' tiny cross-encoder, under the
manifest's folder name; the image's installed project to PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path, PurePosixPath

import httpx
import pytest
import yaml

from index_build.build import build_index
from index_build.config import BuildConfig
from index_format.object_root import ObjectRoot
from tests.conftest import _free_port, make_corpus, write_jsonl
from tests.integration.conftest import ENCODER
from tests.kuberay import ROOT, app_args, container_env, dockerfile_env, groups, manifest, serve_config
from tests.waiting import wait_until

# What the head runs: KubeRay PUTs serveConfigV2 to the dashboard, which hands it to Serve's controller like this.
DRIVER = r"""
import json, sys
import ray
from ray import serve
from ray.serve.context import _get_global_client
from ray.serve.schema import ServeDeploySchema

config, offers, port = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
ray.init(address="local", num_cpus=offers.pop("CPU"), num_gpus=offers.pop("GPU"), resources=offers,
         include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False)
try:
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config))
    print("deployed", flush=True)
    sys.stdin.read()  # serve until the test closes stdin
finally:
    ray.shutdown()
"""


def mount_paths() -> list[str]:
    """Every mountPath of every pod's containers, longest first (so /a/b is mapped before /a)."""
    paths = {m["mountPath"] for g in groups() for kind in ("initContainers", "containers")
             for c in g.pod.get(kind, []) for m in c.get("volumeMounts", [])}
    return sorted(paths, key=len, reverse=True)


def mapped(text: str, pods: Path) -> str:
    """``text`` with each mountPath in it replaced by its folder under ``pods``."""
    for path in mount_paths():
        text = re.sub(rf"(?<![\w/]){re.escape(path)}(?=/|\b|')", str(pods) + path, text)
    return text


def pod_env(container: dict, pods: Path, home: Path) -> dict[str, str]:
    """What a container of the image sees: the Dockerfile's ENV, the container's env and Secret (the local S3
    server's variables stand for raysearch-s3's keys), the image's installed project (here PYTHONPATH)."""
    s3 = {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")}
    env = dockerfile_env() | container_env(container, {"raysearch-s3": s3})
    env = {k: mapped(v, pods) for k, v in env.items()}
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"  # the image's venv on PATH
    env["RAYSEARCH_CACHE"] = str(pods / env["RAYSEARCH_CACHE"].lstrip("/"))  # the image's baked cache, empty here
    return env | {"PYTHONPATH": str(ROOT), "HOME": str(home)}


@pytest.fixture(scope="module")
def store(ray_local, s3_server, tmp_path_factory, tiny_cross_encoder):
    """The bucket the manifest names, holding an index (active version v1) and the reranker's folder."""
    import boto3

    args = app_args()
    index = args["index"]
    bucket = index.removeprefix("s3://").split("/")[0]
    boto3.client("s3").create_bucket(Bucket=bucket)
    folder = tmp_path_factory.mktemp("published")
    docs = make_corpus(40)
    summary = build_index(BuildConfig(corpus=write_jsonl(folder / "corpus.jsonl", docs), out=folder / "index",
                                      encoder=ENCODER, shards=2, chunk_size=40, chunk_overlap=8, version="v1",
                                      progress=False))
    root = ObjectRoot(index, cache_dir=folder / "publisher-cache")
    root.upload_version(summary.version_dir, "v1")
    root.activate("v1")
    # The reranker's folder, where the init container copies it from: s3://<bucket>/models/<its name>.
    model = PurePosixPath(args["reranker"]["model"])
    for f in sorted(tiny_cross_encoder.rglob("*")):
        if f.is_file():
            key = f"models/{model.relative_to('/models')}/{f.relative_to(tiny_cross_encoder)}"
            boto3.client("s3").upload_file(str(f), bucket, key)
    return docs


def test_the_manifests_app_answers_from_what_the_head_pod_sees(store, tmp_path):
    pods, home, cwd = tmp_path / "pods", tmp_path / "home", tmp_path / "cwd"
    for folder in [home, cwd] + [pods / p.lstrip("/") for p in mount_paths()]:
        folder.mkdir(parents=True, exist_ok=True)
    (head,) = [g for g in groups() if g.name == "head"]

    # The head's init container, as the pod runs it: it fills /models from the store.
    for init in head.pod.get("initContainers", []):
        done = subprocess.run([mapped(word, pods) for word in init["command"]], cwd=cwd, capture_output=True,
                              text=True, env=pod_env(init, pods, home), timeout=120)
        assert done.returncode == 0, done.stderr
    model = Path(mapped(app_args()["reranker"]["model"], pods))
    assert (model / "config.json").is_file(), "the init container did not copy the reranker's folder"

    # serveConfigV2 with the mounts mapped and no GPU; one node offering what the groups offer at their least.
    config = yaml.safe_load(mapped(manifest()["spec"]["serveConfigV2"], pods))
    (app,) = config["applications"]
    app["args"]["reranker"].update(num_gpus=0, device="cpu")
    offers: dict[str, float] = {}
    for g in groups():
        for name, amount in g.offers.items():
            offers[name] = offers.get(name, 0) + amount * g.min_pods
    offers["GPU"] = 0
    assert serve_config()["applications"][0]["args"]["reranker"]["num_gpus"] == 1  # what was mapped away

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(config), json.dumps(offers), str(port)],
                            cwd=cwd, env=pod_env(head.ray_container, pods, home), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            def healthy() -> bool:
                assert proc.poll() is None, proc.stdout.read()
                try:
                    return client.get("/health").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(healthy, timeout_s=300, what="the manifest's app answering /health", every_s=1)
            def search() -> dict:
                r = client.post("/search", json={"query": "telescope galaxy orbit", "limit": 5, "rerank": True})
                assert r.status_code == 200, r.text
                return r.json()

            body = search()
            assert body["results"] and body["results"][0]["doc_id"] in {d["_id"] for d in store}
            # Reranked once the reranker's replica is warm (a first call past rerank_timeout_s answers in fused
            # order, with a warning, as it should).
            last = {}
            wait_until(lambda: last.update(search()) or last["reranked"], timeout_s=120,
                       what=lambda: f"a reranked answer; the last one warned {last.get('warnings')}", every_s=1)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    # The shards' files went to the node's cache volume (shards.cache_dir), not the home folder, and nothing was
    # written where the process started.
    cache = Path(mapped(app_args()["shards"]["cache_dir"], pods))
    assert any((cache / "blobs").iterdir())
    assert not any(cwd.iterdir())
