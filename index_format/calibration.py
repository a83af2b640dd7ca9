"""A collection's calibration of ``relevance_score`` under its index root (in the root's store: a folder or object
storage), beside its ranking models::

    ROOT/calibration.json   {"models": {...}, "fitted": {...}}   (deployments.search.calibration.Calibration)

Written whole by ``python -m relevance.calibrate`` (one object replaced in one put, so a reader sees the old one or
the new one); removed by ``--off``. Running routers follow it within ``router.version_poll_s``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .store import open_store

CALIBRATION = "calibration.json"


def read_calibration(root: str | Path) -> dict | None:
    """The calibration under ``root``, or None where it has none."""
    text = open_store(root).text(CALIBRATION)
    return json.loads(text) if text is not None else None


def write_calibration(root: str | Path, calibration: dict) -> None:
    open_store(root).put(CALIBRATION, json.dumps(calibration, indent=1).encode())


def remove_calibration(root: str | Path) -> bool:
    """Removed (True), or there was none (False)."""
    store = open_store(root)
    if not store.exists(CALIBRATION):
        return False
    store.delete([CALIBRATION])
    return True
