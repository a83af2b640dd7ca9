"""One shard opened for search, Ray-free: its manifest checked, its chunk table, FAISS and Lucene indexes,
and what it answers: both retrieval legs in one call, filters and ACLs applied inside the engines.

One call returns the dense and the BM25 candidates, as (chunk id, score) pairs only; texts and vectors
are fetched later for the few chunks that survive fusion.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from deployments.bounded import BoundedCache
from deployments.shard.chunk_ids import ChunkIds
from deployments.shard.dense import DenseShard, TorchDenseShard
from deployments.shard.features import position_of, words
from deployments.shard.filters import MetadataTable
from deployments.shard.listing import DocumentOrder
from deployments.shard.lucene import FieldStats, LuceneShard
from deployments.shard.query import DocumentsAnswer, DocumentsQuery
from deployments.shard.vocabulary import document_frequencies
from index_format.bm25_stats import CollectionStats, read_field_stats, read_stats
from index_format.chunk_table import ChunkTable
from index_format.lucene import DOC_ROWS_FILE
from index_format.manifest import (
    CHUNKS_FILE,
    EMBEDDINGS_FILE,
    FAISS_FILE,
    FAISS_ROWS_FILE,
    LUCENE_DIR,
    ShardManifest,
    encoder_dir,
    verify_shard,
)
from index_format.mapping import mapped_npy
from index_format.versions import read_version_manifest, resolve_version_dir

VOCABULARIES_KEPT = 8
# Chunk rows a shard keeps as Python objects once read (all of them, for a shard up to this size): an index
# version never changes, and reading rows out of Arrow and parsing their metadata was most of what a page of
# 100 results cost. Past the bound the least recently used are dropped, and read again when asked for.
ROWS_KEPT = 50_000


class ShardService:
    def __init__(
        self,
        shard_dir: Path,
        corpus: CollectionStats,
        corpus_df: Mapping[str, int],
        expect: Mapping[str, Any] | None = None,
        verify_checksums: bool = True,
        search_device: str = "cpu",
        fields: Mapping[str, FieldStats] | None = None,
    ):
        """``fields``: the corpus statistics of the Lucene fields beside ``contents`` (None: those of the version
        the shard folder is in, ``version_fields``)."""
        import faiss

        from index_format.encoders import resolve_device

        self.folder = Path(shard_dir)
        self.name = self.folder.name
        self.manifest: ShardManifest = verify_shard(self.folder, expect=dict(expect or {}), checksums=verify_checksums)
        self.shard = self.manifest.shard
        # Memory-mapped (``chunks.arrow``; a version built before it: read whole): a page's rows are read from
        # their batch alone (a ``take`` over a table of many chunks cost time in proportion to the whole table, 43%
        # of the router's CPU at 273k rows a shard: py-spy, 1M corpus).
        self.table = ChunkTable(self.folder)
        self.ids = ChunkIds(self.table)  # row -> id read from the table, id -> row by a sorted hash array
        chunk_ids = self.ids
        self.embeddings = mapped_npy(self.folder / EMBEDDINGS_FILE)
        if resolve_device(search_device) == "cuda":  # exact search on the GPU, from the shard's vectors
            self.dense = TorchDenseShard(np.load(self.folder / EMBEDDINGS_FILE), chunk_ids, self.shard, "cuda")
        else:
            vector_rows = np.load(self.folder / FAISS_ROWS_FILE) if (self.folder / FAISS_ROWS_FILE).is_file() else None
            self.dense = DenseShard(faiss.read_index(str(self.folder / FAISS_FILE)), chunk_ids, self.shard,
                                    options=self.manifest.faiss,
                                    vectors=self.embeddings,
                                    vector_rows=vector_rows)
        # The version's named encoders (``index_build.add_encoder``): a dense leg each, searched when a request names
        # it, and their vectors read for a ranking model's ``dense_<name>``.
        self.named = {name: DenseShard(faiss.read_index(str(self.folder / encoder_dir(name) / FAISS_FILE)), chunk_ids,
                                       self.shard, options=entry.faiss,
                                       vectors=mapped_npy(self.folder / encoder_dir(name) / EMBEDDINGS_FILE))
                      for name, entry in self.manifest.encoders.items()}
        if fields is None:
            fields = version_fields(self.folder.parent.parent) if self.manifest.lucene.get("fields") else {}
        rows_file = self.folder / DOC_ROWS_FILE
        self.lucene = LuceneShard(self.folder / LUCENE_DIR, chunk_ids, self.manifest.lucene, corpus, corpus_df,
                                  self.shard, fields=fields,
                                  row_of_doc=np.load(rows_file) if rows_file.is_file() else None)
        self.metadata = MetadataTable.from_json_column(self.table.column("metadata_json").to_pylist())
        # Computed on the first spell-corrected query of each set of callers; the few latest are kept (one pass
        # over the shard's texts each, so a bounded cache, not one per caller forever).
        self._vocabularies: BoundedCache[tuple | None, dict[str, int]] = BoundedCache(VOCABULARIES_KEPT)
        self._rows: BoundedCache[int, dict[str, Any]] = BoundedCache(ROWS_KEPT)
        self._row_facts: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._documents: DocumentOrder | None = None

    @property
    def chunks(self) -> int:
        return self.table.num_rows

    def check(self) -> None:
        """Raises when this shard cannot answer: its files are gone (a version folder removed or unmounted
        under a running process), or its Lucene index no longer answers through the JVM."""
        for path in (self.folder / CHUNKS_FILE, self.folder / EMBEDDINGS_FILE, self.folder / LUCENE_DIR):
            if not path.exists():
                raise RuntimeError(f"shard {self.name}: {path} is gone")
        if self.lucene.reader.numDocs() != self.chunks:  # one call into the JVM
            raise RuntimeError(f"shard {self.name}: Lucene reports a different number of documents")

    def close(self) -> None:
        """Release the Lucene reader (its files and JVM memory); the shard answers nothing afterwards."""
        self.lucene.close()

    def analyze(self, text: str) -> list[str]:
        """The query's terms as this shard's Lucene analyzer makes them (the same for every shard)."""
        return self.lucene.analyzer.analyze(text)

    def fields(self) -> dict[str, str]:
        return self.metadata.fields()

    def allowed_rows(self, filters: dict[str, Any] | None = None,
                     acl: tuple[str, list[str]] | None = None) -> np.ndarray | None:
        """The rows a search may return (None: all), the same for both legs, so a filtered top-k is complete:
        the filter is applied inside each engine. ``acl`` = (field, principals): only chunks whose field holds
        one of the principals exist for this call, before any ranking; a chunk without the field is seen by
        nobody. A field the collection knows but this shard never saw is missing from every row here (the router
        has refused fields no shard knows). Raises ``FilterError`` for a filter this shard cannot apply."""
        return self.metadata.searchable_rows(filters, acl)

    def dense_leg(self, vector: np.ndarray, k: int, allowed: np.ndarray | None = None,
                  ann: dict[str, Any] | None = None, encoder: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The dense leg's top-k as (chunk-table rows, float32 scores), best first. ``ann`` overrides the
        index's search options for this call (see ``DenseShard``); ``encoder`` names one of the version's named
        encoders (None: its own), whose query vector ``vector`` is."""
        dense = self.dense if encoder is None else self.named[encoder]
        return dense.search_rows(np.asarray(vector, dtype=np.float32), k, allowed, ann)

    def keyword_leg(self, terms: list[str], k: int, allowed: np.ndarray | None = None,
                    keyword_top=None, weights: Mapping[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The BM25 leg's top-k over the query's analyzed ``terms``, as ``dense_leg``; ``keyword_top`` is the
        top-k shared by a group's shards (``LuceneShard.shared_top_k``); ``weights`` {field: weight} scores the
        weighted sum of the fields' BM25 (None: ``contents`` alone)."""
        return self.lucene.search_rows(terms, k, None if allowed is None else allowed.tolist(), keyword_top, weights)

    def row_facts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Words in each chunk's text and in its title, and its position in its document, by row: read once, on the
        first call (a ranking model's length features; a shard that serves no model never pays for them)."""
        if self._row_facts is None:
            positions = np.array([position_of(c) for c in self.ids], dtype=np.float32)
            self._row_facts = (words(self.table.column("text").to_pylist()),
                               words(self.table.column("title").to_pylist()), positions)
        return self._row_facts

    @property
    def row_facts_read(self) -> bool:
        return self._row_facts is not None

    def fetch(self, chunk_ids: list[str]) -> list[dict]:
        """Chunk rows for ids held by this shard, in the order asked: the chunk table's columns, and
        ``metadata`` (``metadata_json`` parsed). Rows are shared between calls: read them, never change them."""
        rows = self.ids.rows_of(chunk_ids)
        return self.rows_at(rows[rows >= 0].tolist())

    def rows_at(self, rows: list[int]) -> list[dict]:
        """The chunk rows at these positions of the chunk table (see ``ROWS_KEPT``). Called from more than one
        thread (a large group's answer is made on its dense thread, a page's rows fetched on the event loop), so
        the answer is made from its own lookups: another call dropping kept rows meanwhile cannot lose one."""
        kept = self._rows
        found = {r: kept.get(r) for r in rows}
        missing = [r for r, row in found.items() if row is None]
        if missing:
            for r, row in zip(missing, self.table.take(missing).to_pylist(), strict=True):
                row["metadata"] = json.loads(row["metadata_json"] or "{}")
                kept.put(r, row)
                found[r] = row
        return [found[r] for r in rows]

    def documents(self) -> DocumentOrder:
        """The shard's documents in id order (``DocumentOrder``): read once, on the first listing (a shard never listed
        never pays for it)."""
        if self._documents is None:
            self._documents = DocumentOrder.of(self.table.column("doc_id"))
        return self._documents

    def list_documents(self, query: DocumentsQuery) -> DocumentsAnswer:
        """A page of the shard's documents in id order (``DocumentsQuery``). Raises ``FilterError`` for a filter this
        shard cannot apply."""
        return self.documents().page(query, self.allowed_rows(query.filters, query.acl), self.chunks)

    def vocabulary(self, acl: tuple[str, list[str]] | None = None) -> dict[str, int]:
        """Word -> number of this shard's chunks (title and text) holding it: what spell correction may
        suggest. With ``acl`` only the chunks those principals may see count, so a suggestion never
        reveals a word of a chunk the caller cannot read."""
        key = None if acl is None else (acl[0], tuple(sorted(acl[1])))
        found = self._vocabularies.get(key)
        if found is None:
            titles, texts = self.table.column("title").to_pylist(), self.table.column("text").to_pylist()
            rows = range(len(texts)) if acl is None else self.metadata.visible_rows(*acl).tolist()
            found = dict(document_frequencies(f"{titles[i]} {texts[i]}" for i in rows))
            self._vocabularies.put(key, found)
        return found

    def vectors(self, chunk_ids: list[str]) -> np.ndarray:
        rows = self.ids.rows_of(chunk_ids)
        if (rows < 0).any():
            raise KeyError(f"chunk {chunk_ids[int(np.flatnonzero(rows < 0)[0])]!r} is not in shard {self.name}")
        return self.vectors_at(rows)

    def vectors_at(self, rows: np.ndarray) -> np.ndarray:
        """The stored vectors of these chunk-table rows, in their order."""
        return np.asarray(self.embeddings[rows], dtype=np.float32)


@functools.lru_cache(maxsize=4)
def version_fields(version_dir: Path) -> dict[str, FieldStats]:
    """The corpus statistics of a version's Lucene fields beside ``contents`` (none in a version built before
    fields), read once per process and version (a version never changes; its shards share them)."""
    return {name: FieldStats(stats, corpus_df_map(terms))
            for name, (stats, terms) in read_field_stats(Path(version_dir) / "bm25").items()}


def corpus_df_map(terms) -> dict[str, int]:
    return dict(zip(terms["term"].to_pylist(), terms["df"].to_pylist(), strict=True))


def open_version(path: Path, version: str | None = None):
    """(version folder, its manifest, corpus BM25 stats, df per term, what every shard must match)."""
    version_dir = resolve_version_dir(path, version)  # a URL: its copy in the node cache
    manifest = read_version_manifest(version_dir)
    stats, terms = read_stats(version_dir / "bm25")
    expect = manifest.shard_expect()
    return version_dir, manifest, stats, corpus_df_map(terms), expect
