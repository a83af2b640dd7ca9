"""The index format: what a built index is on disk, and what both the build job and the service read and write.

Manifests and checksums (``manifest``), versions under a root and their activation (``versions``), corpus-wide
BM25 statistics (``bm25_stats``), which shard a document goes to (``sharding``), the text encoders
(``encoders``), and Lucene: its JVM boot, the Java search helper, and its collection format (``lucene``).
``index_build`` (the job) writes indexes with it; ``deployments`` (the service) reads them with it, and never
imports the job.
"""

__version__ = "0.1.0"
