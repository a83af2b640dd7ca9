"""Offline index builds: corpus -> chunks -> embeddings -> sharded FAISS + Lucene -> published version."""

__version__ = "0.1.0"
