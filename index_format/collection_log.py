"""A root's change log, either kind: the segments in a folder root, the objects of a root in object storage."""

from __future__ import annotations

from pathlib import Path

from index_format.change_log import CHANGES_DIR, ChangeLog
from index_format.changes import ChangeLogLike
from index_format.store_log import StoreChangeLog, import_folder_log
from index_format.versions import open_root, state_dir


def open_change_log(root: str | Path, after: int = 0) -> ChangeLogLike:
    """The change log of an index root's documents, read past ``after``: in the store for a root in object
    storage (``StoreChangeLog``), else the segments in ``<root>/changes`` (``ChangeLog``)."""
    if open_root(root).shared_by_nodes:
        import_folder_log(str(root), ChangeLog(state_dir(root) / CHANGES_DIR))  # kept on the node by an older release
        return StoreChangeLog(str(root), after)
    return ChangeLog(Path(root) / CHANGES_DIR, after=after)
