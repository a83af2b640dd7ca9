"""What a small build costs beyond its work: the first documents of a corpus built again and again on one local Ray.

A build's fixed cost (Ray Data's pipelines, the embedding actors' start, each shard's Lucene indexer) is most of a
small build: a collection created from a few documents, a delta, and every build of the test suite. This builds the
first ``--docs`` documents ``--builds`` times into fresh roots (the first build, cold, reported apart) and records
each build's wall time, the machine's busy CPU over it, and the CPU of every process that started during it (an
actor, a JVM), sampled every 50 ms: a process that lives less than that is missed.

    python -m bench.build_overhead --corpus ../shared/data/scifact --docs 60 --shards 2 \\
        --out bench/results/build_overhead.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.common import machine, write_record
from bench.cpu import machine_busy_s, process_cpu


class NewProcesses:
    """The processes that start while it watches: label and CPU seconds when last seen."""

    def __init__(self):
        self.before = set(process_cpu()) | {os.getpid()}  # process_cpu leaves this one out
        self.seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.seen |= {pid: got for pid, got in process_cpu().items() if pid not in self.before}
            self._stop.wait(0.05)

    def __enter__(self) -> NewProcesses:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()

    def by_label(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for label, cpu in self.seen.values():
            out[label] = out.get(label, 0.0) + cpu
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def first_documents(corpus: Path, docs: int, folder: Path) -> Path:
    """The first ``docs`` lines of a JSONL corpus (a BEIR folder's ``corpus.jsonl``) as a file of their own."""
    source = corpus / "corpus.jsonl" if corpus.is_dir() else corpus
    out = folder / "corpus.jsonl"
    with open(source, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as w:
        for _, line in zip(range(docs), f, strict=False):
            w.write(line)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.build_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="a BEIR folder or a JSONL corpus file")
    parser.add_argument("--docs", type=int, default=60, help="how many of its first documents to build")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--encoder", default="hashing:64", help="the encoder (hashing:DIM: no model's cost)")
    parser.add_argument("--builds", type=int, default=4, help="builds in all, the first (cold) reported apart")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    import ray

    from index_build.build import build_index
    from index_build.config import BuildConfig

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False,
             configure_logging=False)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = first_documents(args.corpus, args.docs, Path(tmp))
        for i in range(args.builds):
            busy, t = machine_busy_s(), time.monotonic()
            with NewProcesses() as started:
                summary = build_index(BuildConfig(corpus=corpus, out=Path(tmp) / f"root{i}", shards=args.shards,
                                                  encoder=args.encoder, chunk_size=40, chunk_overlap=8,
                                                  progress=False))
            wall = time.monotonic() - t
            runs.append({"wall_s": wall, "busy_cpu_s": machine_busy_s() - busy, "started": started.by_label(),
                         "docs": summary.docs, "chunks": summary.chunks})
            print(f"build {i}{' (cold)' if i == 0 else ''}: {wall:.1f} s, {runs[-1]['busy_cpu_s']:.1f} s of CPU; "
                  f"started: {', '.join(f'{k} {v:.2f}' for k, v in list(started.by_label().items())[:4])}",
                  flush=True)
    ray.shutdown()
    warm = runs[1:]
    result = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "builds": runs,
              "warm_wall_s_median": statistics.median(r["wall_s"] for r in warm) if warm else None,
              "warm_cpu_s_median": statistics.median(r["busy_cpu_s"] for r in warm) if warm else None}
    if warm:
        print(f"warm builds: median {result['warm_wall_s_median']:.2f} s, {result['warm_cpu_s_median']:.2f} s of CPU")
    if args.out:
        write_record(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
