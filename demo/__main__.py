"""The embedded default, end to end: make the demo corpus, build its index, search it.

``python -m demo`` writes Python's installed documentation as a corpus (see ``demo.corpus``), builds a
2-shard index of it with the default encoder (skipped when the active version was already built from the
same corpus and settings), then runs a few example searches through the serving pipeline, in process.
"""

from __future__ import annotations

import argparse
import os
import textwrap
from pathlib import Path

from demo.corpus import write_demo_corpus
from index_build.config import BuildConfig
from index_build.corpus import fingerprint
from index_format.process import configure_process
from index_format.versions import active_version, read_version_manifest, versions_dir

EXAMPLES = ("how do I parse command line arguments", "compress a file with gzip", "send an email over smtp")


def _already_built(cfg: BuildConfig) -> str | None:
    name = active_version(cfg.out)
    if name is None:
        return None
    manifest = read_version_manifest(versions_dir(cfg.out) / name)
    return name if manifest.build_key == cfg.build_key(fingerprint(cfg.corpus)) else None


def show(index, query: str, k: int = 3) -> None:
    print(f"\nquery: {query!r}")
    for method, hits in (("bm25", index.bm25(query, k)), ("dense", index.dense(query, k))):
        for rank, (hit, row) in enumerate(zip(hits, index.fetch(hits), strict=True), start=1):
            snippet = textwrap.shorten(row["text"].replace("\n", " "), 90)
            print(f"  {method:5} {rank}. {hit.score:7.3f}  {row['doc_id']:<40.40}  {snippet}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("data/demo/corpus.jsonl"))
    parser.add_argument("--out", type=Path, default=Path("indexes/demo"))
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=40, help="docstrings are short and dense: small chunks")
    parser.add_argument("--chunk-overlap", type=int, default=8)
    parser.add_argument("--rebuild", action="store_true", help="build a new version even if one is current")
    parser.add_argument("--no-search", action="store_true", help="build only; skip the in-process example searches")
    parser.add_argument("query", nargs="*", help="queries to run (default: a few examples)")
    args = parser.parse_args(argv)
    configure_process()

    if not args.corpus.exists():
        n = write_demo_corpus(args.corpus)
        print(f"demo corpus: {n:,} docstrings of the installed Python documentation -> {args.corpus}")
    cfg = BuildConfig(corpus=args.corpus, out=args.out, shards=args.shards, chunk_size=args.chunk_size,
                      chunk_overlap=args.chunk_overlap)
    current = None if args.rebuild else _already_built(cfg)
    if current:
        print(f"index {args.out} is current (version {current}); --rebuild to build again")
    else:
        from index_build.build import build_index

        print(f"building {args.out} with {cfg.shards} shards, encoder {cfg.encoder} ...")
        print(build_index(cfg).render())

    if args.no_search:
        return 0
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    from deployments.search.inprocess import LocalIndex

    index = LocalIndex(args.out)
    for query in args.query or EXAMPLES:
        show(index, query)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
