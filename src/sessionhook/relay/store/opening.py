""":func:`open_store`: the one place that picks the backend from the configuration.

The daemon (``run``, ``--once``) and every operator command open their store here, and
speak only the :class:`~.core.StoreCore` interface afterwards.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import psycopg

from .core import StoreCore
from .postgres import PostgresStore
from .sqlite import Store

__all__ = ["DATABASE_ERRORS", "StoreSettings", "open_store"]

#: What the engines raise for a database problem the store did not map (a bug, a corrupt
#: file): callers that must not crash on one catch these with :class:`~.rows.StoreError`.
DATABASE_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, psycopg.Error)


class StoreSettings(Protocol):
    """What :func:`open_store` reads of the configuration (``StoreConfig`` fits)."""

    @property
    def path(self) -> Path: ...

    @property
    def pool_size(self) -> int: ...

    def database_url(self) -> str | None: ...


def open_store(
    settings: StoreSettings,
    *,
    readonly: bool = False,
    clock: Callable[[], float] = time.time,
) -> StoreCore:
    """Open the configured store: PostgreSQL when a database URL is set, else the SQLite
    file at ``settings.path``. ``readonly``: for reading while the daemon runs (the schema
    must be current). Raises :class:`~.rows.StoreError` (and its subclasses) as the
    backend's ``open`` / ``open_readonly`` do."""
    url = settings.database_url()
    if url is not None:
        if readonly:
            return PostgresStore.open_readonly(url, clock=clock)
        return PostgresStore.open(url, clock=clock, pool_size=settings.pool_size)
    if readonly:
        return Store.open_readonly(settings.path, clock=clock)
    return Store.open(settings.path, clock=clock)
