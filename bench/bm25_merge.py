"""``python -m bench.bm25_merge``: the corpus-wide BM25 term table summed two ways, from the shards' term tables.

The build sums the shards' term tables (term, df, cf) with pyarrow's ``group_by`` in one task on the driver's node
(``index_format.bm25_stats.merge_term_tables``); the alternative is a Ray Data aggregate over the same tables
(``from_arrow_refs(...).groupby("term").sum(...)``), whose result still has to be gathered into one file. This
measures both on made-up tables (random terms, so about as many distinct terms as rows), the tables already in
Ray's object store as the verify tasks leave them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.common import machine


def term_tables(shards: int, terms: int, seed: int = 0) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(shards):
        ids = np.unique(rng.integers(0, terms * 2, terms))
        out.append(pa.table({"term": pa.array([f"t{x}" for x in ids]),
                             "df": pa.array(rng.integers(1, 100, len(ids))),
                             "cf": pa.array(rng.integers(1, 100, len(ids)))}))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bm25_merge", description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--terms", type=int, nargs="+", default=[5_000, 300_000], help="Distinct terms a shard holds.")
    p.add_argument("--rounds", type=int, default=2, help="Rounds per size (the first of each warms).")
    p.add_argument("--out", type=Path, default=None, help="Write the results as JSON here.")
    args = p.parse_args(argv)

    import ray
    import ray.data

    from index_format.bm25_stats import merge_term_tables

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    rows = []
    for terms in args.terms:
        tables = term_tables(args.shards, terms)
        refs = [ray.put(t) for t in tables]
        for r in range(args.rounds):
            t = time.perf_counter()
            merged = merge_term_tables([ray.get(ref) for ref in refs])
            arrow_s = time.perf_counter() - t
            for partitions in (1, args.shards):
                t = time.perf_counter()
                ds = ray.data.from_arrow_refs(refs).groupby("term", num_partitions=partitions).sum(["df", "cf"])
                got = sum(ray.get(ref).num_rows for ref in ds.to_arrow_refs())
                data_s = time.perf_counter() - t
                assert got == merged.num_rows
                rows.append({"terms_a_shard": terms, "round": r, "distinct_terms": merged.num_rows,
                             "pyarrow_s": round(arrow_s, 4), "ray_data_partitions": partitions,
                             "ray_data_s": round(data_s, 4)})
                print(json.dumps(rows[-1]))
    result = {"machine": machine(), "shards": args.shards, "results": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
