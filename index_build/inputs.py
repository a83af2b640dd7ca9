"""A build's inputs named by a URL in object storage (a corpus, a delta's changes or deletes), brought to this node.

The simplest correct way: the object, or the corpus files under a prefix (in name order), are downloaded through
the store layer (``index_format.store``) into a scratch folder on the build's node; the build then plans, fingerprints
and reads them as local files. What the version records is the URL and the bytes' sha256 (the manifest's corpus
record, each record's ``source``, each bad record's file), never the scratch path, so a build from the URL and a
build from a local copy of the same bytes differ only in those names.

A multi-node build would not funnel the corpus through one node's disk: its driver would plan the splits from the
objects' sizes (a JSONL cut found by a ranged read around each cut point, a Parquet split from the footer's row
groups) and each read task would read its own byte range straight from object storage with ranged GETs, so no node
holds the whole corpus and the reads scale with the tasks.
"""

from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path

from index_format.store import Store, open_store

from .corpus import CORPUS_SUFFIXES, CorpusError

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


def download(url: str, scratch: Path) -> tuple[Path, dict[str, str]]:
    """What ``url`` names (``locate``), downloaded into ``scratch`` (emptied first). Returns the local path to read
    (the one file, or the folder of the files, under the keys' own names so that their order is kept) and each
    local file's URL."""
    store, keys = locate(url)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    names = {}
    for key in keys:
        local = scratch / key
        part = local.with_name(f".{local.name}.part")
        store.download(key, part)
        part.replace(local)
        names[str(local)] = f"{store.url}/{key}"
    return (scratch / keys[0] if len(keys) == 1 else scratch), names
