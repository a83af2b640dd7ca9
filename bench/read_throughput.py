"""Corpus read throughput: one process reading every record, against one Ray Data task per file.

The corpus (a BEIR folder's ``corpus.jsonl``, e.g. the 205k-document one of ``bench.scale_corpus``) is
split into ``--files`` Parquet files first. Then, each timed on its own: the single JSONL read by one
process (what a one-file corpus costs), the Parquet files read one after another by one process, and
the same files read by ``index_build.corpus.read_files_in_parallel`` (what ``python -m index_build
--corpus FOLDER`` runs; Ray started beforehand and its start timed apart). Reading here means parsing
every record into a document, checking ids, as the build does before chunking.

    python -m bench.scale_corpus --data ../shared/data/scifact --distractors 200000 --out bench/out/scifact-200k
    python -m bench.read_throughput --corpus bench/out/scifact-200k
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import machine, write_record
from index_build.corpus import Document, iter_documents, read_files_in_parallel


def split(corpus: Path, folder: Path, files: int) -> list[Path]:
    records = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
    folder.mkdir(parents=True, exist_ok=True)
    size = -(-len(records) // files)
    out = []
    for i in range(files):
        part = records[i * size:(i + 1) * size]
        for r in part:  # one type per column: metadata objects as JSON text
            if isinstance(r.get("metadata"), dict):
                r["metadata"] = json.dumps(r["metadata"])
        path = folder / f"part-{i:02d}.parquet"
        pq.write_table(pa.Table.from_pylist(part), path)
        out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.read_throughput", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a BEIR folder (its corpus.jsonl is read)")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--work", type=Path, default=Path("bench/out/read_throughput"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/read_throughput.json"))
    args = ap.parse_args(argv)
    ids, texts = ("_id", "id", "doc_id", "docid"), ("text", "contents", "body")
    files = split(args.corpus / "corpus.jsonl", args.work, args.files)
    record: dict = {"machine": machine(), "corpus": str(args.corpus), "files": len(files)}

    def timed(name, fn):
        t = time.perf_counter()
        items = fn()
        seconds = time.perf_counter() - t
        docs = sum(isinstance(i, Document) for i in items)
        record[name] = {"seconds": round(seconds, 2), "documents": docs, "docs_per_s": round(docs / seconds)}
        print(name, record[name], flush=True)

    timed("one process, one JSONL file", lambda: list(iter_documents(args.corpus / "corpus.jsonl", ids, texts)))
    timed(f"one process, {len(files)} Parquet files", lambda: [d for f in files for d in iter_documents(f, ids, texts)])
    t = time.perf_counter()
    from index_build.build import ensure_ray

    ensure_ray()
    record["ray_start_s"] = round(time.perf_counter() - t, 2)
    timed(f"Ray Data, {len(files)} Parquet files, one task each",
          lambda: read_files_in_parallel(files, ids, texts)[0])
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
