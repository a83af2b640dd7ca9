"""The index format: what a built index is on disk, and what both the build job and the service read and write.

Manifests and checksums (``manifest``), versions under a root and their activation (``versions``), corpus-wide
BM25 statistics (``bm25_stats``), which shard a document goes to (``sharding``), the text encoders
(``encoders``), Lucene: its JVM boot, the Java search helper, and its collection format (``lucene``), and the
change log of the documents written through the API (``change_log``). ``index_build`` (the job) writes indexes
with it and folds the log into them; ``deployments`` (the service) reads them and appends to the log with it, and
never imports the job.
"""

__version__ = "0.1.0"
