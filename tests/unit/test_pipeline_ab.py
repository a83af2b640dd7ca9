"""``bench.pipeline_ab`` loads another checkout's ``deployments`` under another name, each of its imports rewritten,
so two versions of the pipeline live in one process without sharing a module."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from bench.pipeline_ab import RENAMED, load_before

ROOT = Path(__file__).resolve().parents[2]


def test_the_other_checkout_s_package_imports_only_itself(tmp_path):
    load_before(ROOT, tmp_path)
    try:
        fusion = importlib.import_module(f"{RENAMED}.search.fusion")
        import deployments.search.hits as ours

        assert fusion.Hit.__module__ == f"{RENAMED}.search.hits" and fusion.Hit is not ours.Hit
        text = (tmp_path / RENAMED / "search" / "pipeline.py").read_text()
        assert "from deployments" not in text and "import deployments" not in text and f"from {RENAMED}." in text
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == RENAMED or m.startswith(f"{RENAMED}.")]:
            del sys.modules[name]
