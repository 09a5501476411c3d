""":func:`open_store`: the one place that picks the backend from the configuration.

The daemon (``run``, ``--once``) and every operator command open their store here, and
speak only the :class:`~.core.StoreCore` interface afterwards. What must be known of the
backend before it is opened (how /readyz names it, which errors it may raise) is said
here too: :func:`describe_store`, :func:`described_errors`.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from .core import StoreCore
from .errors import StoreError
from .sqlite import Store

#: The engines as :func:`describe_store` names them.
SQLITE, POSTGRESQL = "sqlite", "postgresql"


def database_errors(*, postgresql: bool = False) -> tuple[type[Exception], ...]:
    """What the engines raise for a database problem the store did not map (a bug, a
    corrupt file): callers that must not crash on one catch these with
    :class:`~.errors.StoreError`, as ``except (StoreError, *database_errors())``.

    A function, not a constant: psycopg (about 10 MB of memory) is imported only when a
    PostgreSQL store is opened, so a relay on SQLite never loads it. Until then no psycopg
    error can be raised, and the tuple holds SQLite's alone. An ``except`` clause evaluates
    it when an exception is matched, so it always sees the engines loaded by then. A table
    built before the store is opened (the web app's error handlers) passes
    ``postgresql=True`` when the configuration names a PostgreSQL store."""
    if postgresql:
        import psycopg  # noqa: F401  (loads it: the store will, once opened)
    psycopg_module = sys.modules.get("psycopg")
    if psycopg_module is None:
        return (sqlite3.Error,)
    return (sqlite3.Error, psycopg_module.Error)


def store_failures() -> tuple[type[Exception], ...]:
    """Every way a store call can fail without it being a bug of the caller: the store's
    own :class:`~.errors.StoreError`, an OS error (a socket, a file), and what
    :func:`database_errors` names. ``except store_failures() as exc:``."""
    return (StoreError, OSError, *database_errors())


class StoreSettings(Protocol):
    """What :func:`open_store` reads of the configuration (``StoreConfig`` fits)."""

    @property
    def path(self) -> Path: ...

    @property
    def pool_size(self) -> int: ...

    def database_url(self) -> str | None: ...


class NamedStoreSettings(StoreSettings, Protocol):
    """:class:`StoreSettings` that also name the store for messages (``StoreConfig`` fits)."""

    @property
    def location(self) -> str: ...


def open_store(
    settings: StoreSettings,
    *,
    readonly: bool = False,
    clock: Callable[[], float] = time.time,
) -> StoreCore:
    """Open the configured store: PostgreSQL when a database URL is set, else the SQLite
    file at ``settings.path``. ``readonly``: for reading while the daemon runs (the schema
    must be current). Raises :class:`~.errors.StoreError` (and its subclasses) as the
    backend's ``open`` / ``open_readonly`` do."""
    url = settings.database_url()
    if url is not None:
        from .postgres import PostgresStore  # psycopg is loaded for PostgreSQL only

        if readonly:
            return PostgresStore.open_readonly(url, clock=clock)
        return PostgresStore.open(url, clock=clock, pool_size=settings.pool_size)
    if readonly:
        return Store.open_readonly(settings.path, clock=clock)
    return Store.open(settings.path, clock=clock)


def describe_store(settings: NamedStoreSettings) -> dict[str, str]:
    """What /readyz says of the configured store before it is opened: its engine
    (``backend``: ``sqlite`` or ``postgresql``) and where it is (``database``, without a
    password)."""
    engine = POSTGRESQL if settings.database_url() is not None else SQLITE
    return {"backend": engine, "database": settings.location}


def configured_errors(settings: NamedStoreSettings) -> tuple[type[Exception], ...]:
    """:func:`database_errors` of the configured store, for a table of error handlers built
    before the store is opened (the web app: /readyz says why the store is not open)."""
    return database_errors(postgresql=settings.database_url() is not None)
