"""The engines a RAG team would pick instead of this project, each built and served the way its own documentation
shows, behind a small FastAPI app: LanceDB, Milvus Lite, Chroma, bm25s and Pyserini.

Three commands, each run in a process of its own by ``bench.engines`` (the engines live in their own virtual
environment, made by ``make bench-engines``; Pyserini runs in the project's, where Lucene is):

    python -m bench.engine_service embed --corpus corpus.jsonl --model MODEL_DIR --out work/vectors.npy
    python -m bench.engine_service build --engine lancedb --corpus corpus.jsonl --vectors work/vectors.npy \\
        --work work/lancedb
    python -m bench.engine_service serve --engine lancedb --work work/lancedb --model MODEL_DIR --port 8700 \\
        [--query-encoder torch|onnx]

``embed`` computes every document's vector once with sentence-transformers on torch, as each engine's embedding
helper would (whole documents, title + text, MiniLM truncating at its 256 word pieces); ``build`` hands the same
vectors to each engine, so a build's seconds are the engine's own (ingest and indexes). ``serve`` embeds each query
with sentence-transformers on torch (``--query-encoder torch``, what the engines' documentation does) or with this
project's ONNX query encoder (``onnx``), and hands the engine the vector: the same query vector as the project's.

``POST /search`` takes ``{"query", "limit"}`` and answers ``{"results": [{"doc_id", "score", "rank"}]}``, the shape
this project answers, so one client measures all of them. This module imports no engine at the top: each command
imports the one it runs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pydantic import BaseModel, Field

ENGINES = ("lancedb", "milvus", "chroma", "bm25s", "pyserini")
DENSE = {"lancedb", "milvus", "chroma"}  # the engines that take a query vector
MAX_LIMIT = 100  # the most results a request may ask for
INSERT_BATCH = 1000


def read_corpus(path: Path) -> list[tuple[str, str]]:
    """(doc id, "title\\ntext"), the text this project's build indexes for a document; records without text are
    left out as the build leaves them out."""
    out = []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            title, text = d.get("title") or "", d.get("text") or ""
            if text.strip():
                out.append((str(d["_id"]), f"{title}\n{text}" if title else text))
    return out


def embed(corpus: Path, model: str, out: Path) -> dict:
    import numpy as np
    from sentence_transformers import SentenceTransformer

    rows = read_corpus(corpus)
    t = time.perf_counter()
    encoder = SentenceTransformer(model, device="cpu")
    vectors = encoder.encode([text for _, text in rows], batch_size=32, normalize_embeddings=True,
                             show_progress_bar=False, convert_to_numpy=True).astype(np.float32)
    seconds = time.perf_counter() - t
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, vectors)
    out.with_suffix(".ids.json").write_text(json.dumps([d for d, _ in rows]))
    return {"documents": len(rows), "seconds": seconds}


# --- building -----------------------------------------------------------------------------------------------


def build_lancedb(rows, vectors, work: Path) -> None:
    import lancedb
    import pyarrow as pa

    db = lancedb.connect(str(work))
    table = db.create_table("docs", data=pa.table({
        "doc_id": [d for d, _ in rows], "text": [t for _, t in rows],
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])}))
    # LanceDB's native full-text index (BM25), with its English stemming and stop words.
    table.create_fts_index("text", language="English", stem=True, remove_stop_words=True, lower_case=True)


def build_milvus(rows, vectors, work: Path) -> None:
    from pymilvus import DataType, Function, FunctionType, MilvusClient

    client = MilvusClient(str(work / "milvus.db"))
    schema = client.create_schema(auto_id=False)
    schema.add_field("doc_id", DataType.VARCHAR, is_primary=True, max_length=64)
    # The standard tokenizer with Milvus's English stemmer and stop words (Milvus Lite has no "english" analyzer;
    # the standard one alone neither stems nor drops stop words).
    schema.add_field("text", DataType.VARCHAR, max_length=65535, enable_analyzer=True, analyzer_params={
        "tokenizer": "standard",
        "filter": ["lowercase", {"type": "stemmer", "language": "english"}, {"type": "stop", "stop_words": ["_english_"]}]})
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    schema.add_field("dense", DataType.FLOAT_VECTOR, dim=vectors.shape[1])
    schema.add_function(Function(name="bm25", function_type=FunctionType.BM25, input_field_names=["text"],
                                 output_field_names=["sparse"]))
    index = client.prepare_index_params()
    index.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
    index.add_index(field_name="dense", index_type="FLAT", metric_type="IP")
    client.create_collection("docs", schema=schema, index_params=index)
    for i in range(0, len(rows), INSERT_BATCH):
        client.insert("docs", [{"doc_id": d, "text": t, "dense": v.tolist()}
                               for (d, t), v in zip(rows[i:i + INSERT_BATCH], vectors[i:i + INSERT_BATCH], strict=True)])
    client.flush("docs")  # without it the rows stay in the memtable and BM25 is rebuilt on every search
    client.close()


def build_chroma(rows, vectors, work: Path) -> None:
    import chromadb

    client = chromadb.PersistentClient(path=str(work))
    collection = client.create_collection("docs", metadata={"hnsw:space": "cosine"}, embedding_function=None)
    for i in range(0, len(rows), INSERT_BATCH):
        part = rows[i:i + INSERT_BATCH]
        collection.add(ids=[d for d, _ in part], documents=[t for _, t in part],
                       embeddings=vectors[i:i + INSERT_BATCH].tolist())


def build_bm25s(rows, vectors, work: Path) -> None:
    import bm25s
    import Stemmer

    retriever = bm25s.BM25()  # the library's defaults: Lucene's BM25, k1 1.5, b 0.75
    retriever.index(bm25s.tokenize([t for _, t in rows], stopwords="en", stemmer=Stemmer.Stemmer("english"),
                                   show_progress=False), show_progress=False)
    retriever.save(str(work / "bm25s"), corpus=[{"doc_id": d} for d, _ in rows])


def build_pyserini(rows, vectors, work: Path) -> None:
    from index_format.lucene import build_lucene_index, write_collection

    write_collection(rows, work / "collection")
    build_lucene_index(work / "collection", work / "lucene", threads=2)


BUILDERS = {"lancedb": build_lancedb, "milvus": build_milvus, "chroma": build_chroma, "bm25s": build_bm25s,
            "pyserini": build_pyserini}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def build(engine: str, corpus: Path, vectors_path: Path | None, work: Path) -> dict:
    import numpy as np

    rows = read_corpus(corpus)
    vectors = None
    if engine in DENSE:
        vectors = np.load(vectors_path)
        ids = json.loads(vectors_path.with_suffix(".ids.json").read_text())
        if ids != [d for d, _ in rows]:
            raise SystemExit(f"{vectors_path} holds the vectors of another corpus than {corpus}")
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    BUILDERS[engine](rows, vectors, work)
    seconds = time.perf_counter() - t
    if engine == "pyserini":  # the collection is the index's input, not the index
        import shutil

        shutil.rmtree(work / "collection", ignore_errors=True)
    record = {"engine": engine, "documents": len(rows), "seconds": seconds, "bytes": folder_bytes(work)}
    (work / "build.json").write_text(json.dumps(record))
    return record


# --- serving ------------------------------------------------------------------------------------------------


class QueryEncoder:
    """A query's vector: sentence-transformers on torch (``torch``) or this project's ONNX encoder (``onnx``)."""

    def __init__(self, model: str, backend: str):
        if backend == "torch":
            from sentence_transformers import SentenceTransformer

            st = SentenceTransformer(model, device="cpu")
            self.encode = lambda text: st.encode([text], normalize_embeddings=True, show_progress_bar=False)[0]
        else:
            from index_format.encoders import OnnxEncoder

            onnx = OnnxEncoder(model, threads=1)
            self.encode = lambda text: onnx.encode([text])[0]


def searcher(engine: str, work: Path, encoder: QueryEncoder | None):
    """``search(text, k) -> [(doc_id, score)]`` over the engine's index in ``work``, best first."""
    if engine == "lancedb":
        import lancedb

        table = lancedb.connect(str(work)).open_table("docs")

        def search(text, k):
            # Hybrid: the full-text and vector legs fused by LanceDB's default reranker (RRF).
            hits = (table.search(query_type="hybrid").vector(encoder.encode(text)).text(text)
                    .select(["doc_id"]).limit(k).to_list())
            return [(h["doc_id"], h["_relevance_score"]) for h in hits]

        return search
    if engine == "milvus":
        from pymilvus import AnnSearchRequest, MilvusClient, RRFRanker

        client = MilvusClient(str(work / "milvus.db"))
        client.load_collection("docs")

        def search(text, k):
            # Each leg asked for the page's k, as Milvus's hybrid search examples do (and as LanceDB's hybrid does).
            legs = [AnnSearchRequest(data=[text], anns_field="sparse", param={}, limit=k),
                    AnnSearchRequest(data=[encoder.encode(text).tolist()], anns_field="dense",
                                     param={"metric_type": "IP"}, limit=k)]
            (hits,) = client.hybrid_search("docs", legs, ranker=RRFRanker(), limit=k, output_fields=["doc_id"])
            return [(h["doc_id"], h["distance"]) for h in hits]

        return search
    if engine == "chroma":
        import chromadb

        collection = chromadb.PersistentClient(path=str(work)).get_collection("docs", embedding_function=None)

        def search(text, k):
            found = collection.query(query_embeddings=[encoder.encode(text).tolist()], n_results=k,
                                     include=["distances"])
            return [(d, 1.0 - s) for d, s in zip(found["ids"][0], found["distances"][0], strict=True)]

        return search
    if engine == "bm25s":
        import bm25s
        import Stemmer

        retriever = bm25s.BM25.load(str(work / "bm25s"), load_corpus=True)
        stemmer = Stemmer.Stemmer("english")

        def search(text, k):
            tokens = bm25s.tokenize([text], stopwords="en", stemmer=stemmer, show_progress=False)
            docs, scores = retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
            return [(d["doc_id"], float(s)) for d, s in zip(docs[0], scores[0], strict=True)]

        return search
    if engine == "pyserini":
        from index_format.lucene import boot

        boot()
        from pyserini.search.lucene import LuceneSearcher

        lucene = LuceneSearcher(str(work / "lucene"))
        lucene.set_bm25(0.9, 0.4)

        def search(text, k):
            return [(h.docid, h.score) for h in lucene.search(text, k=k)]

        return search
    raise ValueError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")


class Query(BaseModel):  # at module level: FastAPI resolves the route's (string) annotation here
    query: str = Field(min_length=1)
    limit: int = Field(10, ge=1, le=MAX_LIMIT)


def make_app(engine: str, search):
    from fastapi import FastAPI

    app = FastAPI(title=f"{engine} search")

    @app.post("/search")
    def search_route(q: Query) -> dict:  # a plain def: FastAPI runs it on its thread pool, as such apps do
        t = time.perf_counter()
        hits = search(q.query, q.limit)
        return {"results": [{"doc_id": d, "score": float(s), "rank": i + 1} for i, (d, s) in enumerate(hits)],
                "timings_ms": {"total": (time.perf_counter() - t) * 1000}}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engine_service", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    e = sub.add_parser("embed", help="every document's vector, once, with sentence-transformers")
    e.add_argument("--corpus", type=Path, required=True, help="BEIR corpus.jsonl")
    e.add_argument("--model", required=True, help="sentence-transformers model folder or name")
    e.add_argument("--out", type=Path, required=True, help="the .npy to write (ids beside it, .ids.json)")
    b = sub.add_parser("build", help="an engine's index from the corpus and its vectors")
    b.add_argument("--engine", choices=ENGINES, required=True)
    b.add_argument("--corpus", type=Path, required=True)
    b.add_argument("--vectors", type=Path, help="embed's .npy (the engines with a dense leg)")
    b.add_argument("--work", type=Path, required=True, help="the engine's folder (made here)")
    s = sub.add_parser("serve", help="an engine's index behind FastAPI")
    s.add_argument("--engine", choices=ENGINES, required=True)
    s.add_argument("--work", type=Path, required=True)
    s.add_argument("--model", help="sentence-transformers model folder (the engines with a dense leg)")
    s.add_argument("--query-encoder", choices=["torch", "onnx"], default="torch")
    s.add_argument("--port", type=int, default=8700)
    args = ap.parse_args(argv)
    if args.command == "embed":
        print(json.dumps(embed(args.corpus, args.model, args.out)))
    elif args.command == "build":
        print(json.dumps(build(args.engine, args.corpus, args.vectors, args.work)))
    else:
        import uvicorn

        encoder = QueryEncoder(args.model, args.query_encoder) if args.engine in DENSE else None
        search = searcher(args.engine, args.work, encoder)
        search("warm up", 10)  # once before /health answers, so the engine's first loading is not timed
        app = make_app(args.engine, search)
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
