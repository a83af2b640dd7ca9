"""Relevance judgments from users, stored durably per collection and read back as BEIR qrels.

One append-only JSON-lines file per collection, kept beside the index versions (``ROOT/judgments/``),
so judgments survive restarts and reindexing. Each judgment is one ``write`` of one line under an
exclusive ``flock`` followed by ``fsync``, so concurrent writers (router replicas are separate
processes) never interleave or lose a line. A query's id is a digest of its normalized text, so the
same question judged twice, by anyone, lands on one qrels query.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections import defaultdict
from pathlib import Path

JUDGMENTS_FILE = "judgments.jsonl"


def query_id(query: str) -> str:
    return "q" + hashlib.sha256(" ".join(query.lower().split()).encode()).hexdigest()[:12]


def doc_of_chunk(chunk_id: str) -> str:
    """Chunk ids are ``<doc id>#<chunk index>`` (see index_build.chunking)."""
    return chunk_id.rsplit("#", 1)[0]


class JudgmentStore:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / JUDGMENTS_FILE

    def add(self, query: str, doc_id: str, label: int, chunk_id: str | None = None, user: str | None = None,
            tenant: str | None = None) -> dict:
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "query_id": query_id(query),
                  "query": query, "doc_id": doc_id, "chunk_id": chunk_id, "label": int(label), "user": user,
                  "tenant": tenant}
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)  # closing releases the lock
        return record

    def records(self) -> list[dict]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def qrels(self) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
        """(query id -> text, query id -> doc id -> grade). A user's latest label of a document counts;
        several users' labels are averaged and rounded."""
        latest: dict[tuple[str, str, str | None], int] = {}
        texts: dict[str, str] = {}
        for r in self.records():
            latest[(r["query_id"], r["doc_id"], r.get("user"))] = r["label"]
            texts.setdefault(r["query_id"], r["query"])
        grades: dict[tuple[str, str], list[int]] = defaultdict(list)
        for (qid, doc, _), label in latest.items():
            grades[(qid, doc)].append(label)
        qrels: dict[str, dict[str, int]] = defaultdict(dict)
        for (qid, doc), labels in grades.items():
            qrels[qid][doc] = int(sum(labels) / len(labels) + 0.5)
        return texts, dict(qrels)

    def write_beir(self, out: Path, split: str = "test") -> Path:
        """``out/queries.jsonl`` and ``out/qrels/<split>.tsv``, the files BEIR tools and bench.quality read."""
        texts, qrels = self.qrels()
        (out / "qrels").mkdir(parents=True, exist_ok=True)
        with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
            for qid, text in texts.items():
                f.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
        with open(out / "qrels" / f"{split}.tsv", "w") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for qid, docs in qrels.items():
                for doc, grade in docs.items():
                    f.write(f"{qid}\t{doc}\t{grade}\n")
        return out

