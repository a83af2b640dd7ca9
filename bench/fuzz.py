"""Hostile requests: thousands generated from the service's own OpenAPI spec, plus hand-written hostile
bodies, against an app with keys, document ACLs and a route prefix. Target: 0 responses >= 500.

One Ray Serve cluster runs the same app twice, at ``/`` and under ``/api`` (``route_prefix``), with a
key that has principals (a tenant), an admin key, and ``security.acl_field``. The index is built here
from the first ``--docs`` documents of a BEIR corpus, each given an ``acl`` (a tenant, ``public``, or
none), with the hashing encoder (what is fuzzed is request handling, not ranking). Every operation of
the spec is generated valid and schema-breaking (schemathesis), each request sent with one of: the
tenant's key (45%), the admin key (35%), a wrong key or no key (10% each); and every hand-written hostile body is sent to both
mounts with each key. Statuses are counted by operation.

    python -m bench.fuzz --data ../shared/data --dataset scifact
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.common import machine, write_record

PORT = 18390


def hostile_bodies() -> list[tuple[str, str, bytes | str, dict]]:
    """(method, path, raw body, extra headers): what a hand-written attack sends."""
    deep = '{"query": "x", "filters": {"a": ' + "[" * 500 + "1" + "]" * 500 + "}}"
    nested_obj = '{"query": "x", "filters": ' + '{"a": ' * 300 + "1" + "}" * 300 + "}"
    out = [
        ("POST", "/search", '{"query": "\\ud800"}', {}),
        ("POST", "/search", '{"query": "\\udfff tail", "limit": 3}', {}),
        ("POST", "/search", '{"query": "x", "min_relevance_score": NaN}', {}),
        ("POST", "/search", '{"query": "x", "min_relevance_score": Infinity}', {}),
        ("POST", "/search", '{"query": "x", "limit": 1e308}', {}),
        ("POST", "/search", '{"query": "x", "limit": 99999999999999999999999999}', {}),
        ("POST", "/search", '{"query": "x", "candidates": -1}', {}),
        ("POST", "/search", '{"query": "x", "filters": {"year": {"gte": 1e400}}}', {}),
        ("POST", "/search", deep, {}),
        ("POST", "/search", nested_obj, {}),
        ("POST", "/search", '{"query": "x", "unknown_field": 1}', {}),
        ("POST", "/search", '{"query": ' + '"' + "a" * 60_000 + '"}', {}),
        ("POST", "/search", '{"query": "x" "y"}', {}),
        ("POST", "/search", "", {}),
        ("POST", "/search", "null", {}),
        ("POST", "/search", "[]", {}),
        ("POST", "/search", '"just a string"', {}),
        ("POST", "/search", b"\xff\xfe\x00garbage", {}),
        ("POST", "/search", '{"query": "x"}', {"content-type": "text/plain"}),
        ("POST", "/search", '{"query": "x", "collections": ["../../etc/passwd"]}', {}),
        ("POST", "/search", '{"query": "x", "filters": {"acl": ["t2"]}}', {}),
        ("POST", "/search", '{"query": "x", "spell_correct": true, "query2": "' + "zq" * 500 + '"}', {}),
        ("POST", "/search", '{"query": "' + " ".join(["qzxv"] * 300) + '", "spell_correct": true}', {}),
        ("POST", "/search", '{"query": "x", "conversation_history": [' + ",".join(['{"content": "y"}'] * 200) + "]}",
         {}),
        ("POST", "/search", '{"query": "x", "stream": true, "synthesize": true}', {}),
        ("POST", "/search", '{"query": "x", "rerank": true}', {}),
        ("POST", "/feedback", '{"query": "x", "doc_id": "d\\tq9\\t3", "label": 1}', {}),
        ("POST", "/feedback", '{"query": "x", "doc_id": "\\ud800", "label": 1}', {}),
        ("POST", "/feedback", '{"query": "x", "chunk_id": "nope#0", "label": 1, "tenant": "t2"}', {}),
        ("POST", "/feedback", '{"query": "x", "doc_id": "x", "label": 1e9}', {}),
        ("GET", "/feedback/qrels?collection=%00", "", {}),
        ("GET", "/feedback/qrels?collection=" + "a" * 5000, "", {}),
        ("POST", "/admin/collections/default/activate", '{"version": "../../x"}', {}),
        ("POST", "/admin/collections/%2e%2e/activate", '{"version": "v1"}', {}),
        ("POST", "/admin/collections/default/rollback", "", {}),
        ("GET", "/admin/versions", "", {}),
        ("GET", "/health", "", {}),
        ("GET", "/nope", "", {}),
        ("DELETE", "/search", "", {}),
    ]
    return out


def build_acl_index(data: Path, dataset: str, docs: int, out: Path, encoder: str) -> Path:
    from index_build.build import build_index
    from index_build.config import BuildConfig

    rng = random.Random(0)
    lines = (data / dataset / "corpus.jsonl").read_text().splitlines()[:docs]
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus.jsonl"
    with open(corpus, "w") as f:
        for line in lines:
            d = json.loads(line)
            roll = rng.random()
            if roll < 0.9:
                d.setdefault("metadata", {})["acl"] = rng.choice(["t1", "t2", "public", ["t1", "staff"]])
            f.write(json.dumps(d) + "\n")
    return build_index(BuildConfig(corpus=corpus, out=out / "index", shards=2, encoder=encoder,
                                   progress=False)).version_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="folder holding BEIR datasets")
    ap.add_argument("--dataset", default="scifact")
    ap.add_argument("--docs", type=int, default=2000, help="documents of the corpus indexed")
    ap.add_argument("--encoder", default="hashing:64")
    ap.add_argument("--requests", type=int, default=6000, help="generated requests (hostile bodies come on top)")
    ap.add_argument("--work", type=Path, default=Path("bench/out/fuzz"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/fuzz.json"))
    args = ap.parse_args(argv)

    import ray
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from ray import serve
    from schemathesis import GenerationMode

    from deployments.edge.guard import new_key
    from deployments.serve.app import build_app

    version = build_acl_index(args.data, args.dataset, args.docs, args.work, args.encoder)
    tenant_key, tenant_digest = new_key()
    admin_key, admin_digest = new_key()
    keys = {"tenant": {"Authorization": f"Bearer {tenant_key}"}, "admin": {"X-API-Key": admin_key},
            "wrong": {"Authorization": "Bearer rsk_not_a_key"}, "none": {}}
    config = {"index": str(version), "router": {"cache_size": 64},
              "security": {"key_principals": {tenant_digest: ["t1"]}, "admin_key_digests": [admin_digest],
                           "acl_field": "acl", "max_inflight": 64}}
    if not ray.is_initialized():  # the build above may have started it
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(build_app(config), name="plain", route_prefix="/", blocking=False)
    serve.run(build_app(config), name="prefixed", route_prefix="/api", blocking=False)
    mounts = {"/": f"http://127.0.0.1:{PORT}", "/api": f"http://127.0.0.1:{PORT}/api"}
    for base in mounts.values():
        for _ in range(300):
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)

    statuses: dict[str, Counter] = {}
    server_errors: list[dict] = []
    rng = random.Random(1)

    def record(label: str, status: int, body, text: str) -> None:
        statuses.setdefault(label, Counter())[status] += 1
        if status >= 500:
            server_errors.append({"request": label, "status": status, "body": str(body)[:300], "answer": text[:300]})

    t0 = time.time()
    schema = schemathesis.openapi.from_url(f"{mounts['/']}/openapi.json")
    operations = [(op.path, op.method.upper()) for op in (r.ok() for r in schema.get_all_operations())]
    weights = {"/search": 0.6}
    per_op = {op: max(20, int(args.requests * weights.get(op[0], 0.4 / max(1, len(operations) - 1))))
              for op in operations}
    def fuzz(path: str, method: str, mode, examples: int) -> None:
        op = schema[path][method]

        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case):
            mount = rng.choice(list(mounts))
            # Mostly keys that get past the front door, so the generated bodies reach the handlers.
            who = rng.choices(list(keys), weights=[0.45, 0.35, 0.1, 0.1])[0]
            try:
                r = case.call(base_url=mounts[mount], headers=keys[who], timeout=60)
            except Exception as exc:  # a request the client library cannot even send
                statuses.setdefault("unsendable", Counter())[type(exc).__name__] += 1
                return
            record(f"{method} {path} ({mode.value})", r.status_code, case.body, r.text)

        with contextlib.suppress(Unsatisfiable):  # nothing to break (no body, no parameters): valid requests only
            run()

    for (path, method), examples in per_op.items():
        for mode, share in ((GenerationMode.POSITIVE, 0.6), (GenerationMode.NEGATIVE, 0.4)):
            fuzz(path, method, mode, max(10, int(examples * share)))
    generated = sum(sum(c.values()) for c in statuses.values())
    with httpx.Client(timeout=60) as client:
        for method, path, body, headers in hostile_bodies():
            for base in mounts.values():
                for auth in keys.values():
                    raw = body.encode() if isinstance(body, str) else body
                    h = {"content-type": "application/json", **auth, **headers}
                    r = client.request(method, base + path, content=raw or None, headers=h)
                    record(f"hostile {method} {path.split('?')[0][:40]}", r.status_code, body[:80], r.text)
    seconds = time.time() - t0
    total = sum(sum(c.values()) for k, c in statuses.items() if k != "unsendable")
    by_status: Counter = Counter()
    for k, c in statuses.items():
        if k != "unsendable":
            by_status.update(c)
    record_ = {"machine": machine(), "index": str(version), "docs": args.docs, "encoder": args.encoder,
               "requests": total, "generated": generated, "hostile": total - generated,
               "seconds": round(seconds, 1), "by_status": {str(k): v for k, v in sorted(by_status.items())},
               "server_errors": server_errors,
               "by_request": {k: {str(s): n for s, n in sorted(c.items())} for k, c in sorted(statuses.items())}}
    write_record(args.out, record_)
    print(json.dumps({k: record_[k] for k in ("requests", "generated", "hostile", "seconds", "by_status")}, indent=1))
    print(f"responses >= 500: {len(server_errors)}")
    for e in server_errors[:10]:
        print(e)
    serve.shutdown()
    return 1 if server_errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
