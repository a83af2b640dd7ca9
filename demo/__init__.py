"""The demo, end to end: the embedded corpus (``corpus``: Python's installed documentation, no download), its
index built by the job (``index_build``), then searched through the serving pipeline (``deployments``), in
process (``python -m demo``; ``make demo`` then serves it). It uses both sides, so it lives apart from either:
the job and the service never import each other, nor this package."""
