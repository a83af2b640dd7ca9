"""A build's inputs: local files, or objects named by a URL in object storage (a corpus, a delta's changes or deletes).

A corpus is read where it is: its files are named by a location (a local path, or the object's URL), and every task
that scans or reads one opens it through the store layer (``open_input``), so a corpus in object storage is read
with ranged reads by the tasks of every node, never downloaded whole to one. What the version records is that
location and the bytes' sha256 (the manifest's corpus record, each record's ``source``, each bad record's file).

A delta's changes and deletes files are read the same way, by the tasks of the delta's read (``delta``).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import BinaryIO

from index_format.store import Store, is_remote, open_store

from .corpus import CORPUS_SUFFIXES, CorpusError, corpus_files

BEIR_FILES = ("corpus.jsonl", "corpus.parquet")


def locate(url: str) -> tuple[Store, list[str]]:
    """The store and the keys a URL names, in name order: one object (``s3://b/corpus.jsonl``); the objects a glob
    in the last segment matches (``s3://b/data/part-*.parquet``); or under a prefix (``s3://b/data/``) its
    ``corpus.jsonl`` when it holds one (a BEIR folder), else its .jsonl and .parquet files, as a local folder."""
    base = url.rstrip("/")
    head, _, last = base.rpartition("/")
    is_path = "://" in head  # s3://bucket/something, not the bare bucket
    if is_path and any(c in last for c in "*?["):
        store = open_store(head)
        keys = sorted(k for k in store.list() if "/" not in k and fnmatch.fnmatchcase(k, last))
        odd = [k for k in keys if not k.lower().endswith(CORPUS_SUFFIXES)]
        if odd:
            raise CorpusError(f"unsupported corpus file {head}/{odd[0]}: expected .jsonl or .parquet")
    elif is_path and not url.endswith("/") and (store := open_store(head)).exists(last):
        keys = [last]
    else:
        store = open_store(base)
        top = [k for k in store.list() if "/" not in k]
        keys = [k for k in BEIR_FILES if k in top][:1] or sorted(k for k in top if k.lower().endswith(CORPUS_SUFFIXES))
    if not keys:
        raise CorpusError(f"nothing to read at {url}: no such object, and no .jsonl or .parquet object under it "
                          "(name one object, a prefix holding them, or a glob such as s3://bucket/part-*.parquet)")
    return store, keys


def corpus_locations(corpus: str | Path) -> list[str]:
    """The files a corpus is read from, in corpus order: local paths (``corpus.corpus_files``), or the URLs of the
    objects a URL names (``locate``)."""
    if not is_remote(corpus):
        return [str(f) for f in corpus_files(Path(corpus))]
    store, keys = locate(str(corpus))
    return [f"{store.url}/{key}" for key in keys]


def open_input(location: str) -> BinaryIO:
    """A corpus file for reading, wherever it is: a local path, or an object's URL (read in ranges as asked)."""
    if not is_remote(location):
        return open(location, "rb")  # noqa: SIM115 (the caller closes it)
    head, _, key = location.rpartition("/")
    return open_store(head).open(key)
