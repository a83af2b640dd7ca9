"""A shard's engines: dense (FAISS or torch), Lucene BM25 with corpus-wide statistics, metadata filters; one shard opened for search, and a group of shards searched in one process."""
