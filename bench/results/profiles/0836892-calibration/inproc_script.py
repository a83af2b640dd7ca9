"""Throwaway: the pipeline as served (rendered), in process, each query's vector given (the encoder left out)."""
import asyncio, json, sys, time
from pathlib import Path
from deployments.search.inprocess import inprocess_pipeline
from deployments.edge.schemas import SearchRequest, response_json
from deployments.config import RouterSettings

root = Path("/work/out/engines/raysearch")
queries = [json.loads(l)["text"] for l in open("/work/shared/data/scifact/queries.jsonl")]
import itertools
queries = queries[:300]
pipe = inprocess_pipeline({"default": root}, settings=RouterSettings(cache_size=0))
enc = pipe.collections["default"].encoder
vecs = asyncio.run(enc.embed_many(queries))
embedded = {(id(enc), q): v for q, v in zip(queries, vecs)}

async def run(rounds):
    for _ in range(rounds):
        for q in queries:
            r = await pipe.search(SearchRequest(query=q, limit=10), rendered=True, embedded=embedded)
            response_json(r)

asyncio.run(run(1))  # warm
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    t = time.process_time(); th = time.thread_time(); w = time.perf_counter()
    asyncio.run(run(1))
    print(f"round {i}: {(time.process_time()-t)/len(queries)*1000:.2f} ms CPU a query, {(time.thread_time()-th)/len(queries)*1000:.2f} ms of the main thread, {(time.perf_counter()-w)/len(queries)*1000:.2f} ms wall")
