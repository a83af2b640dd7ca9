"""A delta build (``--changes``, ``--deletes``) on a large base, with each code checkout in one run.

For each checkout (``--code NAME=DIR``, git worktrees): the corpus built whole as the base version, then the delta
applied to it, timed around the command, with the driver's and workers' peak RSS (``bench.build_scale.Sampler``). The
delta (written under ``--work``) edits ``--changed`` of the documents (a sentence appended), adds ``--added`` new
ones and deletes ``--deleted``, picked with a fixed seed. The delta versions of every checkout are checked to hold
the same documents, chunks and vectors (their shards' checksums).

    python -m bench.delta_build --corpus /work/out/scifact-200k --code before=/work/before --code after=/work/after \
        --work /work/out/delta --out bench/results/delta_build.json
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import time
from pathlib import Path

from bench.build_scale import run_sampled
from bench.common import machine, write_record

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("documents.parquet", "chunks.parquet", "embeddings.npy")


def make_delta(corpus: Path, work: Path, changed: float, added: float, deleted: float, seed: int = 7) -> dict:
    """The changes and deletes files for ``corpus``'s JSONL, picked with ``seed``."""
    rng = random.Random(seed)
    ids = []
    with open(corpus / "corpus.jsonl" if corpus.is_dir() else corpus) as f:
        for line in f:
            ids.append(json.loads(line)["_id"])
    n = len(ids)
    chosen = rng.sample(range(n), int(n * changed) + int(n * deleted))
    edit, gone = set(chosen[:int(n * changed)]), [ids[i] for i in chosen[int(n * changed):]]
    donors = rng.sample(range(n), int(n * added))
    work.mkdir(parents=True, exist_ok=True)
    with open(corpus / "corpus.jsonl" if corpus.is_dir() else corpus) as f, open(work / "changes.jsonl", "w") as out:
        for i, line in enumerate(f):
            if i in edit:
                doc = json.loads(line)
                out.write(json.dumps(doc | {"text": doc["text"] + " A sentence appended by the delta."}) + "\n")
    with open(corpus / "corpus.jsonl" if corpus.is_dir() else corpus) as f, open(work / "changes.jsonl", "a") as out:
        wanted = set(donors)
        for i, line in enumerate(f):
            if i in wanted:
                doc = json.loads(line)
                out.write(json.dumps(doc | {"_id": f"new-{i}", "text": doc["text"] + " A new document."}) + "\n")
    (work / "deletes.txt").write_text("".join(f"{d}\n" for d in gone))
    return {"documents": n, "changed": len(edit), "added": len(donors), "deleted": len(gone)}


def _checksums(version: Path) -> dict:
    out = {}
    for shard in sorted((version / "shards").iterdir()):
        sums = json.loads((shard / "manifest.json").read_text())["checksums"]
        out[shard.name] = {k: sums[k] for k in TABLES}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.delta_build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a JSONL corpus (or a BEIR folder)")
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR", help="a checkout (repeat)")
    ap.add_argument("--encoder", default="hashing:384")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--changed", type=float, default=0.01)
    ap.add_argument("--added", type=float, default=0.001)
    ap.add_argument("--deleted", type=float, default=0.001)
    ap.add_argument("--work", type=Path, default=Path("bench/out/delta"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/delta_build.json"))
    args = ap.parse_args(argv)

    codes = [(v.split("=", 1)[0], Path(v.split("=", 1)[1]).resolve()) for v in args.code] or [("this", ROOT)]
    delta = make_delta(args.corpus, args.work / "delta", args.changed, args.added, args.deleted)
    print(f"delta: {delta}", flush=True)
    results, sums = [], {}
    for name, code in codes:
        root = args.work / name
        shutil.rmtree(root, ignore_errors=True)
        common = ["--out", str(root), "--shards", str(args.shards), "--encoder", args.encoder, "--no-progress",
                  "--faiss-index", "flat"]
        base_s, _, _ = run_sampled(code, ["--corpus", str(args.corpus), "--version", "base", *common])
        summary = args.work / f"{name}-delta.json"
        wall, memory, output = run_sampled(code, ["--changes", str(args.work / "delta" / "changes.jsonl"), "--deletes",
                                           str(args.work / "delta" / "deletes.txt"), "--base", "base", "--version",
                                           "delta", *common, "--summary-json", str(summary)])
        got = json.loads(summary.read_text())
        sums[name] = _checksums(root / "versions" / "delta")
        commit = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        results.append({"code": name, "commit": commit, "base_wall_s": round(base_s, 2), "delta_wall_s": round(wall, 2),
                        "documents": got["docs"], "delta": got["delta"], "seconds": got["seconds"],
                        "stages": got.get("stages", {}), "reuse": got.get("reuse", {}),
                        "driver_peak_mb": round(memory["by_kind"]["driver"]["max_peak_mb"], 1),
                        "largest_worker_mb": round(memory["by_kind"].get("worker", {}).get("max_peak_mb", 0), 1),
                        "summary": output.strip().splitlines()[-14:]})
        print(f"  {name} ({commit}): base {base_s:.1f} s, delta {wall:.1f} s ({json.dumps(got['seconds'])})",
              flush=True)
        shutil.rmtree(root, ignore_errors=True)
    same = len({json.dumps(s, sort_keys=True) for s in sums.values()}) == 1
    body = {"machine": machine(), "encoder": args.encoder, "shards": args.shards, "delta": delta,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "same_tables": same, "results": results}
    write_record(args.out, body)
    print(f"\nthe delta versions hold the same tables and vectors: {same}")
    print("| code | delta s | documents | driver peak MB | largest worker MB |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['code']} ({r['commit']}) | {r['delta_wall_s']} | {r['documents']:,} | {r['driver_peak_mb']} | "
              f"{r['largest_worker_mb']} |")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
