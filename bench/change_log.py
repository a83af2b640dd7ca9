"""What the change log costs a replica that starts, and what it keeps on disk, as writes pile up.

A log of ``--writes`` writes is made through ``ChangeLog.append_many`` (groups of 64, as the service's group commit
stores them): each write upserts one of ``--documents`` documents (the corpus's first ones, their texts as they
are, rewritten round after round). Then, in one run:

- **start, the whole log**: a reader from the start, what every replica did before the log had segments (and what
  one still does for a version built from a corpus file, ``log_seq`` 0). Measured twice: with this code over the
  segmented log, and with the code of ``--before`` (a commit whose log was one file: its ``log.py`` is loaded from
  git) over the same lines in one file;
- **start, past the version**: a reader past seq ``writes - --tail`` (a replica starting on a version that folded
  all but the last ``--tail`` writes): only the segments holding later writes are opened;
- **compaction** (what a fold does after publishing): the closed segments rewritten to each document's last
  write; bytes before and after, seconds, and the whole-log read again.

Each read is the median of ``--repeats`` (the files are in the page cache after the first: what is measured is
parsing, not the disk).

    python -m bench.change_log --corpus ../shared/data/scifact --work /work/out/changelog \\
        --out bench/results/change_log.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import machine, write_record

GROUP = 64


def read_s(make_reader, repeats: int) -> tuple[float, int]:
    """Median seconds of a fresh reader's ``read_new`` and the changes it returned."""
    times, n = [], 0
    for _ in range(repeats):
        reader = make_reader()
        t = time.perf_counter()
        n = len(reader.read_new())
        times.append(time.perf_counter() - t)
    return statistics.median(times), n


def old_log_module(commit: str, work: Path):
    """The change log of ``commit`` (one file, read from its start), loaded as a module of its own (from where the
    log lived then: deployments/documents/log.py, before it moved to index_format/change_log.py)."""
    source = subprocess.run(["git", "show", f"{commit}:deployments/documents/log.py"], check=True,
                            capture_output=True, text=True).stdout
    path = work / "log_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("log_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["log_before"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.change_log", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, required=True, help="A BEIR folder or JSONL corpus: the written texts.")
    p.add_argument("--writes", type=int, default=200_000)
    p.add_argument("--documents", type=int, default=5_000, help="Distinct documents the writes rewrite in turn.")
    p.add_argument("--tail", type=int, default=1_000, help="Writes past the version a starting replica reads.")
    p.add_argument("--before", default="7e397e7", help="A commit whose change log was one file.")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", type=Path, required=True, help="Scratch folder (the logs; emptied first).")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)

    from index_format.change_log import ChangeLog, segments

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    corpus = args.corpus / "corpus.jsonl" if args.corpus.is_dir() else args.corpus
    records = []
    with open(corpus) as f:
        for line in f:
            d = json.loads(line)
            records.append({"id": str(d["_id"]), "title": d.get("title") or "", "text": d.get("text") or "",
                            "metadata": {}})
            if len(records) == args.documents:
                break

    log_dir = args.work / "segmented"
    log = ChangeLog(log_dir)
    t = time.perf_counter()
    for start in range(0, args.writes, GROUP):
        log.append_many([([records[i % len(records)]], [], None) for i in range(start, min(start + GROUP,
                                                                                           args.writes))])
    write_s = time.perf_counter() - t
    files = segments(log_dir)
    log_bytes = sum(path.stat().st_size for _, path in files)
    print(f"{args.writes:,} writes in {write_s:.1f} s: {log_bytes / 2**20:,.1f} MiB in {len(files)} segments",
          file=sys.stderr)

    one_file = args.work / "one-file"  # the same lines in the one file the code before wrote
    one_file.mkdir()
    with open(one_file / "log.jsonl", "wb") as out:
        for _, path in files:
            with open(path, "rb") as f:
                shutil.copyfileobj(f, out)
    before = old_log_module(args.before, args.work)

    after_seq = args.writes - args.tail
    record = {"bench": "change_log", "machine": machine(), "corpus": str(args.corpus), "writes": args.writes,
              "documents": len(records), "tail": args.tail, "before_commit": args.before,
              "write_s": round(write_s, 2), "log_bytes": log_bytes, "segments": len(files)}
    whole_before, n0 = read_s(lambda: before.ChangeLog(one_file), args.repeats)
    whole_now, n1 = read_s(lambda: ChangeLog(log_dir), args.repeats)
    tail_now, n2 = read_s(lambda: ChangeLog(log_dir, after=after_seq), args.repeats)
    assert n0 == n1 == args.writes and n2 == args.tail, (n0, n1, n2)
    record["start_read_s"] = {"whole_log_before": round(whole_before, 4), "whole_log_now": round(whole_now, 4),
                              "past_version_now": round(tail_now, 4)}

    t = time.perf_counter()
    summary = ChangeLog(log_dir).compact()
    compact_s = time.perf_counter() - t
    files = segments(log_dir)
    compacted_read, n3 = read_s(lambda: ChangeLog(log_dir), args.repeats)
    tail_compacted, n4 = read_s(lambda: ChangeLog(log_dir, after=after_seq), args.repeats)
    assert n4 == args.tail
    record["compaction"] = {"seconds": round(compact_s, 2), "segments_compacted": summary.segments,
                            "bytes_before": summary.bytes_before, "bytes_after": summary.bytes_after,
                            "log_bytes_after": sum(path.stat().st_size for _, path in files),
                            "changes_dropped": summary.changes_dropped, "whole_log_changes_after": n3,
                            "whole_log_read_s": round(compacted_read, 4),
                            "past_version_read_s": round(tail_compacted, 4)}
    print(json.dumps(record, indent=2))
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
