"""What every entry point sets up before its work starts (``configure_process``), rather than a library module
changing the process's environment when it is imported."""

from __future__ import annotations

import os
from pathlib import Path


def configure_process() -> None:
    """Models load from the local cache or a package only, unless the caller turned the hub on: nothing is downloaded
    at run time (``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` default to 1; an exported 0 is kept). Ray
    processes started afterwards inherit the same environment."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def cache_root() -> Path:
    """This node's cache of things made once and kept (checksums taken, ONNX exports, the Java helper, an object-storage
    root's files): ``$RAYSEARCH_CACHE``, default ``~/.cache/raysearch``."""
    return Path(os.environ.get("RAYSEARCH_CACHE") or Path.home() / ".cache" / "raysearch")
