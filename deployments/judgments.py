"""Relevance judgments from users, stored durably per collection and read back as BEIR qrels; and the
command ``python -m deployments.judgments export ROOT OUT``, which writes them out as a BEIR folder.

The store is online: the router's ``POST /feedback`` writes it and ``GET /feedback/qrels`` reads it. The
offline tools (``relevance.evaluate``, ``relevance.tune``, the trainers) read it through this module.

A folder root keeps one append-only JSON-lines file per collection beside the index versions
(``ROOT/judgments/``), so judgments survive restarts and reindexing. Each judgment is one ``write`` of one
line under an exclusive ``flock`` followed by ``fsync``, so concurrent writers (router replicas are separate
processes) never interleave or lose a line. A root in object storage keeps them in its store, one object per
judgment created only if absent (``judgments/<time>-<random>.json``, ``ObjectJudgments``): routers on any nodes
never overwrite each other's, none is on a node's disk, and every router reads every judgment as soon as it is
acknowledged. ``judgments_of(root)`` gives a root's, either kind. A query's id is a digest of its normalized text, so the
same question judged twice, by anyone, lands on one qrels query.

What is read back is checked, not trusted: a torn line (a writer killed mid-line) or a record with a
malformed field is skipped and counted (``JudgmentStore.skipped``), never fatal, and an identifier
holding a control character is refused on the way in and skipped on the way out, so a qrels row can
never be forged. A write the disk did not take in full is an error to the caller (507 when full, 503
otherwise), never a 201.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from deployments.errors import InvalidField, StorageFull, Unavailable
from index_format.store import Store, StoreError

JUDGMENTS_FILE = "judgments.jsonl"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
logger = logging.getLogger(__name__)


def has_control_character(value: str) -> bool:
    return _CONTROL.search(value) is not None


def check_identifier(name: str, value: str | None) -> None:
    """A document or chunk id goes into TSV rows: a tab or a line break in it would forge rows."""
    if value is not None and has_control_character(value):
        raise InvalidField(f"{name} {value!r} holds a control character (tab, line break, ...); ids may not")


def _well_formed(record: object) -> bool:
    if not isinstance(record, dict):
        return False
    ids = (record.get("query_id"), record.get("doc_id"))
    return (all(isinstance(i, str) and i and not has_control_character(i) for i in ids)
            and isinstance(record.get("query"), str) and type(record.get("label")) is int
            and isinstance(record.get("user"), str | None)
            and isinstance(record.get("principals", []), list)
            and all(isinstance(p, str) for p in record.get("principals") or ()))


def query_id(query: str) -> str:
    return "q" + hashlib.sha256(" ".join(query.lower().split()).encode()).hexdigest()[:12]


def _record(query: str, doc_id: str, label: int, chunk_id: str | None, user: str | None, tenant: str | None,
            caller: str | None, principals: Sequence[str]) -> dict:
    check_identifier("doc_id", doc_id)
    check_identifier("chunk_id", chunk_id)
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "query_id": query_id(query),
            "query": query, "doc_id": doc_id, "chunk_id": chunk_id, "label": int(label), "user": user,
            "tenant": tenant, "caller": caller, "principals": sorted(principals)}


class JudgmentStore:
    """A folder root's judgments: one JSON-lines file."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / JUDGMENTS_FILE
        self.skipped = 0  # lines of the last read that were torn or malformed

    def add(self, query: str, doc_id: str, label: int, chunk_id: str | None = None, user: str | None = None,
            tenant: str | None = None, caller: str | None = None, principals: Sequence[str] = ()) -> dict:
        """``caller`` and ``principals``: the key that judged and who it is (the tenant that may read the
        judgment back); ``tenant`` is only a label, kept when keys are off."""
        record = _record(query, doc_id, label, chunk_id, user, tenant, caller, principals)
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # a torn last line stays alone, instead of swallowing this record
                written = 0
                while written < len(line):  # a short write is retried for the rest; none written is an error
                    n = os.write(fd, line[written:])
                    if n <= 0:
                        raise OSError(errno.EIO, "the disk took no bytes")
                    written += n
                os.fsync(fd)
            finally:
                os.close(fd)  # closing releases the lock
        except OSError as e:
            kind = StorageFull if e.errno in (errno.ENOSPC, errno.EDQUOT) else Unavailable
            raise kind(f"the judgment was not stored: {e.strerror or e}") from None
        return record

    def records(self) -> list[dict]:
        """Every well-formed judgment; torn or malformed lines are skipped and counted in ``skipped``."""
        out, skipped = [], 0
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:
                        record = None
                    if _well_formed(record):
                        out.append(record)
                    else:
                        skipped += 1
        except FileNotFoundError:
            pass
        if skipped:
            logger.warning(f"{self.path}: skipped {skipped} torn or malformed line(s)")
        self.skipped = skipped
        return out

    def qrels(self, tenant: Sequence[str] | None = None) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
        """(query id -> text, query id -> doc id -> grade). A user's latest label of a document counts;
        several users' labels are averaged and rounded. ``tenant``: only the judgments made by keys with
        exactly these principals (None: every judgment)."""
        latest: dict[tuple[str, str, str | None], int] = {}
        texts: dict[str, str] = {}
        wanted = None if tenant is None else sorted(tenant)
        for r in self.records():
            if wanted is not None and sorted(r.get("principals") or ()) != wanted:
                continue
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


class ObjectJudgments(JudgmentStore):
    """A root in object storage's judgments: one object each in its store (immutable: read once per process)."""

    PREFIX = "judgments/"

    def __init__(self, store: Store):
        self.store = store
        self.folder = self.path = f"{store.url}/{self.PREFIX}"
        self.skipped = 0
        self._read: dict[str, dict | None] = {}  # key -> its record (None: malformed); objects never change

    def add(self, query: str, doc_id: str, label: int, chunk_id: str | None = None, user: str | None = None,
            tenant: str | None = None, caller: str | None = None, principals: Sequence[str] = ()) -> dict:
        record = _record(query, doc_id, label, chunk_id, user, tenant, caller, principals)
        key = f"{self.PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{time.time_ns() % 10**9:09d}-" \
              f"{secrets.token_hex(6)}.json"
        try:
            self.store.put_if(key, json.dumps(record, ensure_ascii=False).encode(), None)  # created, never replaced
        except StoreError as e:
            raise Unavailable(f"the judgment was not stored: {e}") from None
        self._read[key] = record
        return record

    def records(self) -> list[dict]:
        try:
            keys = sorted(self.store.list(self.PREFIX))
            new = [k for k in keys if k not in self._read]
            with ThreadPoolExecutor(8) as pool:
                for key, data in zip(new, pool.map(self._get, new), strict=True):
                    self._read[key] = _parsed(data)
        except StoreError as e:
            raise Unavailable(f"the judgments cannot be read: {e}") from None
        out = [self._read[k] for k in keys if self._read.get(k) is not None]
        self.skipped = len(keys) - len(out)
        if self.skipped:
            logger.warning(f"{self.path}: skipped {self.skipped} malformed judgment(s)")
        return out

    def _get(self, key: str) -> bytes | None:
        return self.store.get_tagged(key)[0]


def _parsed(data: bytes | None) -> dict | None:
    try:
        record = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return record if _well_formed(record) else None


def judgments_of(root: str | Path) -> JudgmentStore:
    """A collection's judgments: ``ROOT/judgments/`` for a folder root, objects in the store for a root in object
    storage."""
    from index_format.versions import open_root

    r = open_root(root)
    return ObjectJudgments(r.store) if r.shared_by_nodes else JudgmentStore(Path(root) / "judgments")


def main(argv: list[str] | None = None) -> int:
    """``python -m deployments.judgments export ROOT OUT``: a collection's judgments as a BEIR folder."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m deployments.judgments", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export", help="write OUT/queries.jsonl and OUT/qrels/test.tsv from ROOT/judgments")
    p.add_argument("root", help="the collection's index root: a folder, or a URL in object storage (s3://bucket/prefix)")
    p.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    store = judgments_of(args.root)
    texts, qrels = store.qrels()
    store.write_beir(args.out)
    print(f"{sum(len(d) for d in qrels.values())} judgments of {len(texts)} queries -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
