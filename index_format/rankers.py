"""Ranking models under an index root, published and activated like index versions.

Layout (in the root's store: a folder or object storage, ``index_format.store``)::

    ROOT/rankers/<id>/ranker.json   what the model reads and how it was trained, validated and compared
    ROOT/rankers/<id>/model.txt     LightGBM's model
    ROOT/rankers/ACTIVE.json        {"active": <id> or null, "history": [one entry per activation]}

A model is activated only with a comparison made on held-out judgments against what the collection serves at
that moment (``relevance.rankers.compare``): it names the model it was compared with (``served``: the active
model, or null for the order without one), both nDCG@10 figures and the guard's verdict (``relevance.guard``: the
gain, its interval, the queries behind it). The comparison must be against the model active now, and the guard
must accept the gain; it is kept in the history with the activation. ``ACTIVE.json``
is replaced by a compare-and-swap (``Store.put_if``), so two activations at once cannot both win, and rolling back
is one more activation, of the model that was active before (null included: no model).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

from .store import Conflict, open_store

RANKERS = "rankers"
STATE = f"{RANKERS}/ACTIVE.json"
DESCRIPTION = "ranker.json"
MODEL = "model.txt"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RankerError(RuntimeError):
    """A ranking model that cannot be published, found or activated, with the reason."""


def checked_id(model_id: str) -> str:
    """A model id as a key part: letters, digits, ``._-`` (it may come from an HTTP request or a command line)."""
    if not _ID.match(model_id or ""):
        raise RankerError(f"ranking model id {model_id!r} is not valid: letters, digits, '.', '_', '-', at most 128")
    return model_id


def model_id_for(description: dict, model_text: str) -> str:
    """``<name>-<UTC time>-<8 hex of the model>``: sortable by time, and two models never share an id."""
    digest = hashlib.sha256(model_text.encode()).hexdigest()[:8]
    return f"{description.get('name', 'ranker')}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{digest}"


def publish_ranker(root: str | Path, folder: Path) -> str:
    """Copy a trained model folder (``ranker.json``, ``model.txt``) under ``ROOT/rankers/<id>``; returns the id
    (the folder's ``ranker.json`` ``id``). Publishing the same model again is a no-op; another under its id is
    refused."""
    description = json.loads((Path(folder) / DESCRIPTION).read_text())
    model_text = (Path(folder) / MODEL).read_text()
    model_id = checked_id(description["id"])
    store = open_store(root)
    key = f"{RANKERS}/{model_id}"
    if store.exists(f"{key}/{MODEL}"):
        if store.get(f"{key}/{MODEL}").decode() != model_text:
            raise RankerError(f"another ranking model is published as {model_id!r} under {root}")
        return model_id
    store.put(f"{key}/{DESCRIPTION}", json.dumps(description, indent=1).encode())
    store.put(f"{key}/{MODEL}", model_text.encode())  # last: a model is listed once both files are there
    return model_id


def list_rankers(root: str | Path) -> list[str]:
    keys = open_store(root).list(f"{RANKERS}/")
    return sorted({k.split("/")[1] for k in keys if k.endswith(f"/{MODEL}") and k.count("/") == 2})


def read_ranker(root: str | Path, model_id: str) -> tuple[dict, str]:
    """(description, model text) of a published model; RankerError naming the published ones otherwise."""
    description = ranker_description(root, model_id)
    return description, open_store(root).get(f"{RANKERS}/{checked_id(model_id)}/{MODEL}").decode()


def ranker_description(root: str | Path, model_id: str) -> dict:
    """A published model's description alone (``ranker.json``; its trees not read); RankerError naming the
    published ones where there is no such model."""
    store = open_store(root)
    key = f"{RANKERS}/{checked_id(model_id)}"
    if not store.exists(f"{key}/{MODEL}"):
        known = list_rankers(root)
        raise RankerError(f"no ranking model {model_id!r} under {root}; published: {', '.join(known) or 'none'}")
    return json.loads(store.get(f"{key}/{DESCRIPTION}"))


def ranker_state(root: str | Path) -> tuple[dict[str, Any], str | None]:
    """(``ACTIVE.json``'s content, its tag for ``put_if``); no file yet: no model, no history."""
    data, tag = open_store(root).get_tagged(STATE)
    return (json.loads(data) if data else {"active": None, "history": []}), tag


def active_ranker(root: str | Path) -> str | None:
    return ranker_state(root)[0]["active"]


def activate_ranker(root: str | Path, model_id: str | None, comparison: dict | None, by: str = "cli",
                    rollback: bool = False) -> str | None:
    """Make ``model_id`` the collection's ranking model (None: none); returns the one it replaced.

    Refused (``RankerError``) unless ``comparison`` (``relevance.rankers.compare``) was made against the model
    active now and the guard accepted its gain on held-out judgments (``comparison["guard"]``). A rollback
    (``rollback=True``) returns to what was active before and needs none: that model was served already."""
    if model_id is not None:
        read_ranker(root, model_id)  # published, or a RankerError naming what is
    store = open_store(root)
    for _ in range(20):
        state, tag = ranker_state(root)
        previous = state["active"]
        if previous == model_id:
            return previous
        if not rollback:
            refuse_unless_better(model_id, previous, comparison)
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": model_id,
                 "previous": previous, "by": by, "rollback": rollback, "comparison": comparison}
        state = {"active": model_id, "history": [*state["history"], entry]}
        try:
            store.put_if(STATE, json.dumps(state, indent=1).encode(), tag)
            return previous
        except Conflict:
            continue  # another activation landed first: look again (its model may change the verdict)
    raise RankerError(f"{root}: the ranking model pointer kept changing under this activation; try again")


def refuse_unless_better(model_id: str | None, served: str | None, comparison: dict | None) -> None:
    if model_id is None:
        return  # turning the model off is a rollback to the plain order, always allowed
    if comparison is None:
        raise RankerError(f"not activating {model_id!r}: no comparison with what is served (relevance.rankers "
                          "compare makes one)")
    if comparison.get("model") != model_id or comparison.get("served") != served:
        raise RankerError(f"not activating {model_id!r}: its comparison was made against "
                          f"{comparison.get('served') or 'no model'}, and {served or 'no model'} is served now; "
                          "compare again")
    verdict = comparison.get("guard")
    if verdict is None:
        raise RankerError(f"not activating {model_id!r}: its comparison carries no verdict of the guard "
                          "(relevance.guard); compare again")
    if not verdict["accept"]:
        raise RankerError(f"not activating {model_id!r} against {served or 'no model'}: {verdict['why']}")


def previous_ranker(root: str | Path) -> tuple[bool, str | None]:
    """(whether there is an earlier state to return to, the model active before the current one)."""
    state, _ = ranker_state(root)
    for entry in reversed(state["history"]):
        if entry["model"] == state["active"]:
            return True, entry["previous"]
    return False, None


def rollback_ranker(root: str | Path, by: str = "cli") -> tuple[str | None, str | None]:
    """Return to the model active before this one (or to none); (from, to)."""
    known, target = previous_ranker(root)
    if not known:
        raise RankerError(f"{root}: no earlier ranking model activation to roll back to")
    return activate_ranker(root, target, None, by=by, rollback=True), target
