"""The search console's static files (``deployments/console/``), served by name from a fixed list.

A requested name is looked up, never joined onto a path. The policy lets the page load only its own files and
call only this origin, so a result's text can never run as script even if it slipped past the page's escaping.
"""

from __future__ import annotations

from pathlib import Path

from starlette.responses import FileResponse

from deployments.edge.guard import CONSOLE_ASSETS

CONSOLE_DIR = Path(__file__).parents[1] / "console"
CONSOLE_TYPES = {"index.html": "text/html; charset=utf-8", "console.css": "text/css; charset=utf-8",
                 "console.js": "text/javascript; charset=utf-8"}
CONSOLE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",  # revalidate, so a redeployed console is picked up at once
}


def page_file() -> FileResponse:
    """The console's page (served at ``/console``, never by its file name)."""
    return _file("index.html")


def asset_file(name: str) -> FileResponse | None:
    """One of the console's assets by name (``console.css``, ``console.js``); None for any other name."""
    return _file(name) if name in CONSOLE_ASSETS else None


def _file(name: str) -> FileResponse:
    return FileResponse(CONSOLE_DIR / name, media_type=CONSOLE_TYPES[name], headers=CONSOLE_HEADERS)
