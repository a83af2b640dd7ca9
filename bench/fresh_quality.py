"""Quality with documents living in the fresh segment: nDCG@10 over HTTP of the served index as built, then after
``--share`` of its documents (those the judged queries find relevant first, so the measure sees them) were written
again through the documents API with the same content, in one run on one served copy of the index.

A written document is searched in the fresh segment (its BM25 from the version's statistics plus the segment's
own counts) and masks its copy in the version, so the difference is what the fresh segment costs ranking.

    python -m bench.fresh_quality --data ../shared/data/scifact --index bench/out/indexes/scifact-3 \\
        --out bench/results/fresh_quality.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import load_beir, machine, served, write_record
from bench.live_writes import copy_root
from bench.serving import quality


def corpus_records(folder: Path) -> dict[str, dict]:
    out = {}
    with open(folder / "corpus.jsonl") as f:
        for line in f:
            record = json.loads(line)
            out[str(record["_id"])] = record
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fresh_quality", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="the BEIR folder the index was built from")
    ap.add_argument("--index", type=Path, required=True, help="its index root (copied by hard links, never written)")
    ap.add_argument("--share", type=float, default=0.01, help="share of the corpus written through the API")
    ap.add_argument("--port", type=int, default=8670)
    ap.add_argument("--out", type=Path, default=Path("bench/results/fresh_quality.json"))
    args = ap.parse_args(argv)
    queries, qrels = load_beir(args.data)
    records = corpus_records(args.data)
    # The documents judged relevant first (each query's), then the rest in corpus order, up to the share.
    relevant = list(dict.fromkeys(d for q in qrels.values() for d in q if d in records))
    wanted = max(1, int(round(args.share * len(records))))
    chosen = (relevant + [d for d in records if d not in set(relevant)])[:wanted]
    record: dict = {"machine": machine(), "index": str(args.index), "documents": len(records), "written": len(chosen),
                    "share": len(chosen) / len(records), "relevant_written": sum(d in set(relevant) for d in chosen)}
    body = {"limit": 100, "method": "hybrid"}
    with tempfile.TemporaryDirectory() as tmp, served(copy_root(args.index, Path(tmp)), args.port,
                                                      ["--router.cache-size", "0", "--metrics-port", str(args.port + 1)],
                                                      startup_s=1200) as base:
        record["as_built"] = quality(base, queries, qrels, body)
        t0 = time.perf_counter()
        with httpx.Client(base_url=base, timeout=300) as client:
            for i in range(0, len(chosen), 100):
                batch = [records[d] for d in chosen[i:i + 100]]
                r = client.put("/collections/default/documents", json={"documents": batch})
                r.raise_for_status()
        record["write_s"] = round(time.perf_counter() - t0, 2)
        record["with_fresh"] = quality(base, queries, qrels, body)
    record["ndcg10_difference"] = record["with_fresh"]["nDCG@10"] - record["as_built"]["nDCG@10"]
    write_record(args.out, record)
    print(f"{len(chosen)} of {len(records)} documents written ({record['relevant_written']} judged relevant) in "
          f"{record['write_s']} s; nDCG@10 as built {record['as_built']['nDCG@10']:.4f}, with them in the fresh "
          f"segment {record['with_fresh']['nDCG@10']:.4f} ({record['ndcg10_difference']:+.4f})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
