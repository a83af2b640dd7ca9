"""The LangChain peer, built the way LangChain's documentation shows a hybrid retriever, behind FastAPI.

An ``EnsembleRetriever`` of a ``BM25Retriever`` (rank_bm25 over whitespace tokens) and a FAISS vector
store, weights 0.7 / 0.3 (dense / BM25; ``--dense-weight``), over the same documents this project indexes (title + text,
whole documents), with the same embedding model. ``POST /search`` takes ``{"query", "limit"}`` and
answers in this project's result shape so the same bench client measures both.

The FAISS store is filled with the document vectors this project's build already computed for the
same texts with the same model (``--vectors-from INDEX_VERSION``), sparing a second embedding of the
corpus; queries are embedded at request time through LangChain's ``Embeddings`` interface, the way
``HuggingFaceEmbeddings`` does it (sentence-transformers ``encode``). Without ``--vectors-from`` the
corpus is embedded here.

    python -m bench.langchain_service --corpus ../shared/data/scifact/corpus.jsonl --port 8500 \\
        --vectors-from bench/out/indexes/scifact-4
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pydantic import BaseModel, Field

from bench.engine_service import read_corpus

K = 100  # candidates each retriever returns (LangChain's default is 4; a ranking bench needs depth)
DENSE_WEIGHT = 0.7  # the BM25 retriever gets 1 - this (0.7 / 0.3 dense / BM25 reproduces the usual figures)


def index_vectors(version_dir: Path) -> dict[str, list[float]]:
    """doc id -> vector, for the documents a whole-document index version holds as one chunk (longer
    ones were split, so their vectors are of parts: those are embedded here)."""
    import numpy as np
    import pyarrow.parquet as pq

    out: dict[str, list[float]] = {}
    split: set[str] = set()
    for shard in sorted((version_dir / "shards").iterdir()):
        ids = pq.read_table(shard / "chunks.parquet", columns=["doc_id", "chunk_index"]).to_pylist()
        vectors = np.load(shard / "embeddings.npy")
        for row, v in zip(ids, vectors, strict=True):
            if row["chunk_index"] == 0:
                out[row["doc_id"]] = v.tolist()
            else:
                split.add(row["doc_id"])
    return {d: v for d, v in out.items() if d not in split}


def build_retriever(corpus: Path, model: str, vectors_from: Path | None, dense_weight: float = DENSE_WEIGHT):
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_community.retrievers import BM25Retriever
    from langchain_community.vectorstores import FAISS
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings

    from index_format.encoders import load_encoder

    class EncoderEmbeddings(Embeddings):
        """What langchain_huggingface.HuggingFaceEmbeddings does (sentence-transformers ``encode``, normalized),
        through the encoder loader this project uses, so ``hashing:DIM`` works too. (That package pins
        huggingface_hub < 2, which this environment cannot take.)"""

        def __init__(self, name: str):
            self.encoder = load_encoder(name)

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return self.encoder.encode(texts, batch_size=32).tolist()

        def embed_query(self, text: str) -> list[float]:
            return self.encoder.encode([text])[0].tolist()

    rows = read_corpus(corpus)
    docs = [Document(page_content=text, metadata={"doc_id": doc_id}) for doc_id, text in rows]
    embeddings = EncoderEmbeddings(model)
    t = time.perf_counter()
    bm25 = BM25Retriever.from_documents(docs, k=K)
    if vectors_from is not None:
        from index_format.versions import resolve_version_dir

        known = index_vectors(resolve_version_dir(vectors_from))
        missing = [(d, text) for d, text in rows if d not in known]
        known.update(zip((d for d, _ in missing), embeddings.embed_documents([text for _, text in missing]),
                         strict=True))
        print(f"{len(rows) - len(missing):,} document vectors from {vectors_from}, {len(missing):,} embedded here",
              flush=True)
        store = FAISS.from_embeddings([(text, known[d]) for d, text in rows], embeddings,
                                      metadatas=[{"doc_id": d} for d, _ in rows])
    else:
        store = FAISS.from_documents(docs, embeddings)
    retriever = EnsembleRetriever(retrievers=[bm25, store.as_retriever(search_kwargs={"k": K})],
                                  weights=[1 - dense_weight, dense_weight])
    print(f"LangChain retriever over {len(docs):,} documents ready in {time.perf_counter() - t:.1f} s", flush=True)
    return retriever


class Query(BaseModel):  # at module level: FastAPI resolves the (string) annotation of the route here
    query: str
    limit: int = Field(10, ge=1, le=K)


def make_app(retriever):
    from fastapi import FastAPI

    app = FastAPI(title="LangChain EnsembleRetriever service")

    @app.post("/search")
    def search(q: Query) -> dict:  # a plain def: FastAPI runs it on its thread pool, as such services do
        t = time.perf_counter()
        found = retriever.invoke(q.query)[: q.limit]
        n = len(found)
        return {"results": [{"doc_id": d.metadata["doc_id"], "score": float(n - i), "rank": i + 1}
                            for i, d in enumerate(found)],
                "timings_ms": {"total": (time.perf_counter() - t) * 1000}}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    ap = argparse.ArgumentParser(prog="python -m bench.langchain_service", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="BEIR corpus.jsonl")
    ap.add_argument("--model", default="all-MiniLM-L6-v2",
                    help="sentence-transformers model, or hashing:DIM (default: the packaged all-MiniLM-L6-v2)")
    ap.add_argument("--vectors-from", type=Path, help="index root or version whose document vectors fill FAISS")
    ap.add_argument("--dense-weight", type=float, default=DENSE_WEIGHT,
                    help="EnsembleRetriever weight of the FAISS retriever; BM25 gets the rest")
    ap.add_argument("--port", type=int, default=8500)
    args = ap.parse_args(argv)
    app = make_app(build_retriever(args.corpus, args.model, args.vectors_from, args.dense_weight))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
