"""One shard of the 1M heaps index: IVF lists of different codes, the same lists probed, the candidates rescored
exactly from the stored vectors; recall@10 against exact, CPU ms a search (one thread)."""
import sys, time, json
import numpy as np, faiss
from pathlib import Path
faiss.omp_set_num_threads(1)
shard = Path(sys.argv[1]); nq = 100
vec = np.load(shard / "embeddings.npy", mmap_mode="r")
n, d = vec.shape
rng = np.random.default_rng(0)
# queries: real query vectors from the heaps corpus queries
from index_format.encoders import encode_queries, load_encoder
import json as _j
qs = [json.loads(l)["text"] for l in open(sys.argv[2])][:nq]
q = np.ascontiguousarray(encode_queries(load_encoder("hashing:384"), qs, ""), dtype=np.float32)
k = 10
exact = (q @ np.asarray(vec).T)
truth = np.argsort(-exact, axis=1)[:, :k]
sample = np.ascontiguousarray(vec[rng.choice(n, min(n, 100_000), replace=False)])
nlist = int(4 * np.sqrt(n))
coarse = faiss.IndexFlatIP(d)
km = faiss.Kmeans(d, nlist, niter=10, seed=1, spherical=False); km.train(sample); coarse.add(km.centroids)
out = {}
for name, factory in [("sq4", "SQ4"), ("pq96x4fs", f"PQ{d//4}x4fs"), ("pq48x4fs", f"PQ{d//8}x4fs"), ("rabitqfs", "RaBitQfs")]:
    metric = faiss.METRIC_L2 if "rabitq" in name else faiss.METRIC_INNER_PRODUCT
    cq = faiss.IndexFlat(d, metric); cq.add(km.centroids)
    idx = faiss.index_factory(d, f"IVF{nlist},{factory}", metric)
    ivf = faiss.extract_index_ivf(idx); ivf.quantizer = cq; ivf.own_fields = False
    t = time.process_time(); idx.train(sample)
    for s in range(0, n, 65536): idx.add(np.ascontiguousarray(vec[s:s+65536]))
    build = time.process_time() - t
    for nprobe in (266, 532, 1065):
        ivf.nprobe = nprobe
        for refine in (4, 16):
            t = time.process_time()
            hits = 0
            for i in range(nq):
                _, cand = idx.search(q[i:i+1], k * refine)
                c = cand[0][cand[0] >= 0]
                sc = np.asarray(vec[np.sort(c)]) @ q[i]
                top = np.sort(c)[np.argsort(-sc)[:k]]
                hits += len(set(top.tolist()) & set(truth[i].tolist()))
            cpu = (time.process_time() - t) * 1000 / nq
            out[f"{name} nprobe {nprobe} refine {refine}"] = (round(hits / (nq * k), 4), round(cpu, 2))
            print(name, nprobe, refine, round(hits / (nq * k), 4), round(cpu, 2), "ms", f"build {build:.0f}s", flush=True)
json.dump(out, open("/work/out/codes/scan.json", "w"), indent=1)
