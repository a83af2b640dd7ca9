"""The one reader of relevance judgments files (qrels), for evaluation, tuning, training and the benchmarks.

Two layouts are read, as the tools that write them do: BEIR's ``query-id<TAB>corpus-id<TAB>score`` (its
header line optional) and TREC's ``qid iteration docid relevance`` (four columns, tabs or spaces; the
iteration is ignored). Blank lines are skipped. Any other line is an error naming the file and the line:
before this reader, the training reader silently dropped TREC lines (training on TREC qrels got no pairs
and no error) and the benchmarks' reader crashed on them.
"""

from __future__ import annotations

from pathlib import Path

Qrels = dict[str, dict[str, int]]


class QrelsError(ValueError):
    pass


def read_qrels(path: Path | str) -> Qrels:
    """query id -> document id -> grade (an int; a document judged twice keeps the last line's grade)."""
    qrels: Qrels = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) not in (3, 4):
                parts = line.split()
            if n == 1 and parts[:2] == ["query-id", "corpus-id"]:
                continue
            if len(parts) == 4:  # TREC: qid iteration docid relevance
                parts = [parts[0], parts[2], parts[3]]
            if len(parts) != 3 or not parts[0].strip() or not parts[1].strip():
                raise QrelsError(f"{path}:{n}: expected 'query-id<TAB>corpus-id<TAB>score' (BEIR) or "
                                 f"'qid 0 docid relevance' (TREC), got {line.rstrip()[:120]!r}")
            try:
                grade = int(parts[2])
            except ValueError:
                raise QrelsError(f"{path}:{n}: the grade {parts[2]!r} is not an integer") from None
            qrels.setdefault(parts[0].strip(), {})[parts[1].strip()] = grade
    return qrels
