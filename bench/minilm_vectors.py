"""MiniLM vectors for the 205k corpus of ``bench.scale_corpus``: real where they fit the machine, a checked
proxy for the rest, so approximate search can be measured on the geometry of the real encoder.

Embedding all 227k chunks of the 205k corpus with MiniLM takes about 2.5 hours on 2 cores, more than a
session. So: every chunk of the dataset's own documents (the ones the qrels judge) and the first
``--real-distractors`` distractors are embedded for real; every other distractor gets a proxy. A distractor is
a few sentences drawn from the dataset's documents under a drawn title; mean pooling makes a text's vector
close to the length-weighted mean of its parts' vectors, so its proxy is the normalized mean of the MiniLM
vectors of its title and its sentences, each weighted by its words (every sentence and title is embedded
once, which is cheap). The proxy is checked against the real vectors of the distractors embedded for real:
the cosine between the two for each, written to ``check.json``, and ``bench.ann`` run on the real and the
proxy vectors of the same rows gives both recalls side by side.

Writes to ``--out``: ``vectors.npy`` (every chunk in corpus order, real or proxy), ``chunks.parquet``
(chunk id, doc id, whether its vector is real), ``real.npy`` and ``proxy.npy`` (the real-embedded
distractors and their proxies), ``queries.npy`` and ``queries.json`` (the split's queries) and ``check.json``.

    python -m bench.minilm_vectors --corpus bench/out/scifact-200k --out bench/out/minilm-205k
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import load_beir, machine

SENTENCE = re.compile(r"(?<=[.!?])\s+")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.minilm_vectors", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a BEIR folder made by bench.scale_corpus")
    ap.add_argument("--real-distractors", type=int, default=5000)
    ap.add_argument("--split", default="test")
    ap.add_argument("--chunk-size", type=int, default=128)
    ap.add_argument("--chunk-overlap", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    import torch

    from index_build.config import DEFAULT_ENCODER
    from index_build.corpus import Document, iter_documents
    from index_format.chunking import chunk_document
    from index_format.encoders import load_encoder

    torch.set_num_threads(torch.get_num_threads())
    encoder = load_encoder(DEFAULT_ENCODER, "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    chunk_ids, doc_ids, contents, kinds, parts = [], [], [], [], []  # kinds: own | real | proxy
    real_left = args.real_distractors
    for doc in iter_documents(args.corpus / "corpus.jsonl"):
        if not isinstance(doc, Document):
            continue
        distractor = doc.doc_id.startswith("x")
        for chunk in chunk_document(doc, args.chunk_size, args.chunk_overlap):
            chunk_ids.append(chunk.chunk_id)
            doc_ids.append(chunk.doc_id)
            contents.append(chunk.contents(True))
            if not distractor:
                kinds.append("own")
            elif real_left > 0:
                kinds.append("real")
            else:
                kinds.append("proxy")
            parts.append([chunk.title, *SENTENCE.split(chunk.text)] if distractor else None)
        if distractor and real_left > 0:
            real_left -= 1
    kinds_a = np.array(kinds)
    print(f"{len(chunk_ids):,} chunks: {int((kinds_a == 'own').sum()):,} of the dataset's documents, "
          f"{int((kinds_a == 'real').sum()):,} distractors embedded for real, {int((kinds_a == 'proxy').sum()):,} "
          "by proxy", flush=True)

    def embed(texts: list[str], what: str) -> np.ndarray:
        t = time.perf_counter()
        out = encoder.encode(texts, args.batch_size).astype(np.float32)
        print(f"  embedded {len(texts):,} {what} in {time.perf_counter() - t:.0f} s", flush=True)
        return out

    vectors = np.zeros((len(chunk_ids), encoder.encode(["x"]).shape[1]), dtype=np.float32)
    direct = np.flatnonzero(kinds_a != "proxy")
    vectors[direct] = embed([contents[i] for i in direct], "chunks (the dataset's and the real distractors)")

    pieces = sorted({p for i, ps in enumerate(parts) if ps is not None for p in ps if p.strip()})
    piece_vectors = dict(zip(pieces, embed(pieces, "titles and sentences"), strict=True))

    def proxy(i: int) -> np.ndarray:
        ps = [p for p in parts[i] if p.strip()]
        weights = np.array([len(p.split()) for p in ps], dtype=np.float32)
        v = (np.stack([piece_vectors[p] for p in ps]) * weights[:, None]).sum(axis=0)
        return v / np.linalg.norm(v)

    for i in np.flatnonzero(kinds_a == "proxy"):
        vectors[i] = proxy(i)
    real_rows = np.flatnonzero(kinds_a == "real")
    proxies = np.stack([proxy(i) for i in real_rows]) if len(real_rows) else np.zeros((0, vectors.shape[1]))
    cosines = (proxies * vectors[real_rows]).sum(axis=1)

    queries, _ = load_beir(args.corpus, args.split)
    query_vectors = embed(list(queries.values()), "queries")
    np.save(args.out / "vectors.npy", vectors)
    np.save(args.out / "real.npy", vectors[real_rows])
    np.save(args.out / "proxy.npy", proxies.astype(np.float32))
    np.save(args.out / "queries.npy", query_vectors)
    (args.out / "queries.json").write_text(json.dumps(list(queries)))
    pq.write_table(pa.table({"chunk_id": chunk_ids, "doc_id": doc_ids, "vector": kinds}), args.out / "chunks.parquet")
    check = {"machine": machine(), "corpus": str(args.corpus), "chunks": len(chunk_ids),
             "own": int((kinds_a == "own").sum()), "real_distractors": int(len(real_rows)),
             "proxy_distractors": int((kinds_a == "proxy").sum()),
             "proxy_vs_real_cosine": {"mean": float(cosines.mean()), "p5": float(np.percentile(cosines, 5)),
                                      "min": float(cosines.min())} if len(cosines) else None,
             "seconds": round(time.perf_counter() - t0, 1)}
    (args.out / "check.json").write_text(json.dumps(check, indent=2))
    print(json.dumps(check, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
