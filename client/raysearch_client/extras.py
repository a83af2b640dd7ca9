"""The framework adapters' imports: a missing framework says which extra installs it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def needs(extra: str, package: str) -> Iterator[None]:
    """Around an adapter's imports of ``package``: where it is missing, an ImportError that names the extra to install
    (``pip install "raysearch-client[EXTRA]"``), the missing module's own error chained."""
    try:
        yield
    except ImportError as exc:
        raise ImportError(f"raysearch_client.{extra} needs {package}, which is not installed: "
                          f'pip install "raysearch-client[{extra}]"') from exc
