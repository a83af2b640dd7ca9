"""What a candidate ranking feature is worth before it is built into the shards: the cosine of another index's
encoder, added as one more column to the candidates a ranking model was trained on, cross-validated by query
folds on the training queries alone (the test queries are never read).

    python -m relevance.train_ranker --index ROOT --data DATA/scifact --out DIR --candidates kept.pkl
    python -m bench.feature_trial --candidates kept.pkl --data DATA/scifact --other e5=OTHER_ROOT

``OTHER_ROOT`` is an index of the same corpus with the same chunking (so the same chunk ids) built with another
encoder; each query is embedded with that version's encoder and query prompt, each candidate's stored vector read
from its shards. The row "every feature + dense_NAME" against "every feature" says whether holding that encoder
in the version (and asking the shards for its cosine) would pay.
"""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path

import numpy as np

from bench.common import machine, write_record


def other_cosines(root: Path, texts: list[str], chunk_ids: list[list[str]]) -> list[np.ndarray]:
    """Per query, the cosine of each of its candidates with the query under ``root``'s encoder (NaN for a chunk
    that index does not hold)."""
    import pyarrow.parquet as pq

    from index_format.encoders import encode_queries, load_encoder
    from index_format.manifest import CHUNKS_FILE, EMBEDDINGS_FILE
    from index_format.prompts import EncoderSpec
    from index_format.versions import read_version_manifest, resolve_version_dir

    version_dir = resolve_version_dir(root, None)
    manifest = read_version_manifest(version_dir)
    spec = EncoderSpec.of(manifest)
    where: dict[str, tuple[int, int]] = {}
    vectors = []
    for s, name in enumerate(manifest.shards):
        folder = version_dir / "shards" / name
        for row, cid in enumerate(pq.read_table(folder / CHUNKS_FILE, columns=["chunk_id"])["chunk_id"].to_pylist()):
            where[cid] = (s, row)
        vectors.append(np.load(folder / EMBEDDINGS_FILE, mmap_mode="r"))
    queries = encode_queries(load_encoder(spec.model), texts, spec.query_prompt)
    out = []
    for q, ids in zip(queries, chunk_ids, strict=True):
        cos = np.full(len(ids), np.nan, dtype=np.float32)
        for i, cid in enumerate(ids):
            if cid in where:
                s, row = where[cid]
                cos[i] = float(np.asarray(vectors[s][row], dtype=np.float32) @ q)
        out.append(cos)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.feature_trial", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=Path, required=True, help="kept candidates (train_ranker --candidates)")
    ap.add_argument("--data", type=Path, required=True, help="the BEIR folder the candidates were judged from")
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--test-split", default="test")
    ap.add_argument("--held-out-share", type=float, default=None)
    ap.add_argument("--validation-share", type=float, default=0.2,
                    help="the share train_ranker held out for activation, left out here too (default: %(default)s)")
    ap.add_argument("--other", required=True, metavar="NAME=ROOT", help="an index of the same chunks, another encoder")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("bench/results/feature_trial.json"))
    args = ap.parse_args(argv)
    from index_format.process import configure_process

    configure_process()
    from relevance.train_ranker import cross_validate, feature_names
    from relevance.training import beir_judgments
    from relevance.tuning import split_queries

    name, root = args.other.split("=", 1)
    column = f"dense_{name}"
    judged = beir_judgments(args.data, args.train_split, args.test_split, args.held_out_share)
    with open(args.candidates, "rb") as f:
        data = pickle.load(f)["data"]
    queries = {q.query_id: q.text for q in data}
    fit_ids, _ = split_queries(queries, args.validation_share, seed="ranker")  # as train_ranker splits them
    by_id = {q.query_id: q for q in data}
    fit_data = [by_id[q] for q in fit_ids]
    cosines = other_cosines(Path(root), [q.text for q in fit_data], [q.chunk_ids for q in fit_data])
    for q, cos in zip(fit_data, cosines, strict=True):
        q.columns[column] = cos
        q.columns[f"{column}_gap"] = np.nanmax(cos) - cos if np.isfinite(cos).any() else cos
    base = [n for n in feature_names(fit_data) if not n.startswith(column)]
    rows = []
    for label, names in (("every feature", base), (f"every feature + {column}", base + [column]),
                         (f"every feature + {column}, {column}_gap", base + [column, f"{column}_gap"])):
        cv = cross_validate(fit_data, judged.qrels, names, args.folds)
        rows.append({"features": label, "model_ndcg": cv["model_ndcg"], "trees": cv["trees"],
                     "without_model_ndcg": cv["without_model_ndcg"],
                     "per_fold": [f["model"] for f in cv["per_fold"]]})
        print(json.dumps(rows[-1]), flush=True)
    missing = float(np.mean([np.isnan(c).mean() for c in cosines]))
    write_record(args.out, {"machine": machine(), "candidates": str(args.candidates), "other": {name: root},
                            "queries": len(fit_data), "folds": args.folds, "missing_share": missing, "rows": rows})
    print("| features | CV nDCG@10 | trees |\n|---|---:|---:|")
    for r in rows:
        print(f"| {r['features']} | {r['model_ndcg']:.4f} | {r['trees']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
