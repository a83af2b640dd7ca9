"""Offline relevance work: evaluation, tuning and training on judgments, apart from the service.

The one qrels reader (``qrels``), retrieval metrics (``metrics``), fusion replay for tuning (``tuning``),
training data (``training``) and the commands ``python -m relevance.evaluate``, ``relevance.tune``,
``relevance.train_encoder`` and ``relevance.train_reranker``. This package may import the service's
client, schemas, fusion and judgments store (``deployments``) and the index format; the service never
imports it.
"""
