"""Relevance tooling: judgments storage, retrieval metrics, fusion replay for tuning."""
