"""Each collection's active ranking model in a running router: the one its root's ``rankers/ACTIVE.json`` names
(``index_format.rankers``), loaded when the pointer moves and dropped when it is cleared; and its calibration of
``relevance_score`` (``index_format.calibration``), loaded when it changes and dropped when it is removed.

A model or calibration that cannot be loaded leaves the one loaded before in place (or none) and says why in
``errors``; the next look tries again. Loading happens off the event loop: a router keeps answering meanwhile."""

from __future__ import annotations

import asyncio
import logging

from deployments.search.calibration import Calibration
from deployments.search.learned import RankingModel
from index_format.calibration import read_calibration
from index_format.rankers import active_ranker, read_ranker

logger = logging.getLogger("ray.serve")


class RankingModels:
    def __init__(self, models: dict[str, RankingModel], roots: dict[str, str],
                 calibrations: dict[str, Calibration] | None = None):
        self.models = models  # the pipeline's own dicts: a change replaces one entry
        self.calibrations = calibrations if calibrations is not None else {}
        self.roots = roots  # collection -> index root (collections pinned to a version folder have no models)
        self.errors: dict[str, str] = {}

    async def follow(self) -> None:
        """One look at every root's pointer; load or drop where it moved."""
        for name, root in self.roots.items():
            try:
                await self._follow(name, root)
                self.errors.pop(name, None)
            except Exception as exc:  # the model loaded before (or none) keeps ranking
                self.errors[name] = f"{type(exc).__name__}: {exc}"[:500]
                logger.error(f"collection {name!r}: ranking model not loaded: {self.errors[name]}")

    async def _follow(self, name: str, root: str) -> None:
        await self._follow_model(name, root)
        await self._follow_calibration(name, root)

    async def _follow_calibration(self, name: str, root: str) -> None:
        data = await asyncio.to_thread(read_calibration, root)
        current = self.calibrations.get(name)
        if data is None:
            if current is not None:
                del self.calibrations[name]
                logger.info(f"collection {name!r}: relevance_score no longer calibrated")
            return
        if current is None or current.fitted != data.get("fitted"):
            self.calibrations[name] = Calibration.from_json(data)
            logger.info(f"collection {name!r}: relevance_score calibrated ({data.get('fitted')})")

    async def _follow_model(self, name: str, root: str) -> None:
        active = await asyncio.to_thread(active_ranker, root)
        current = self.models.get(name)
        if active == (current.id if current is not None else None):
            return
        if active is None:
            self.models.pop(name, None)
            logger.info(f"collection {name!r}: no ranking model (was {current.id})")
            return
        description, text = await asyncio.to_thread(read_ranker, root, active)
        self.models[name] = await asyncio.to_thread(RankingModel, active, description["features"], text)
        logger.info(f"collection {name!r}: ranking model {active} (was {current.id if current else 'none'})")

    def describe(self) -> dict[str, dict]:
        return {name: {"ranking_model": getattr(self.models.get(name), "id", None),
                       "calibrated": name in self.calibrations,
                       **({"error": self.errors[name]} if name in self.errors else {})} for name in self.roots}
