"""The relay's storage: schema, migrations and every query (the only package with SQL), on
SQLite (``store.path``, the default) or PostgreSQL (``store.url``).

The database is at once the archive (sessions, activities kept whole), the event log, the
outbox (``deliveries``: a row exists before any POST) and the delivery log (``attempts``).
Tables and columns are listed in ``docs/store.md``.

A store is its roles, each a collaborator over the database handle:
``store.outbox.due_deliveries(...)``. Each role method declares, where it is implemented,
how it meets a store that cannot be written for now (:mod:`.policy`); the async door runs
it under that policy: ``await astore.run(Outbox.record_attempts, records)``.

Its modules are listed in ``docs/design.md``; the tables, the two backends and the API in
``docs/store.md``.

Errors::

    StoreError      the database cannot be opened or used (directory not writable, not a
                    sessionhook database, schema newer than this version, unknown endpoint,
                    write on a read-only store, wrong password); ``path`` tells which file
                    (``None`` on PostgreSQL: the message names the database)
    +-- StoreLockedError  another daemon holds the store's lock; ``pid`` is its PID
    +-- StoreUnwritableError  a write cannot be done for now (read-only, database
        |                     unreachable); nothing committed
        +-- StoreFullError    a write failed for lack of space
"""

from typing import TYPE_CHECKING, Any

from .actions import ActionQueries
from .aio import AsyncStore, FullObserver
from .console_queries import ConsoleQueries
from .core import StoreCore
from .economy_queries import ArchivedSession, Economy, KnownSession
from .endpoints import EndpointQueries
from .errors import (
    EndpointConflictError,
    EndpointLimitError,
    StoreError,
    StoreFullError,
    StoreUnwritableError,
)
from .ingest import Ingest
from .leases import LeaseRow, Leases, ReplicaState
from .lock import DaemonLock, StoreLockedError, acquire_daemon_lock
from .meta import MetaQueries
from .opening import (
    StoreSettings,
    configured_errors,
    database_errors,
    describe_store,
    open_store,
    store_failures,
)
from .ops_queries import OperatorQueries
from .outbox import PRUNE_BATCH, QUEUED_ONLY_ABOVE, AttemptRecord, Caps, Outbox, Round
from .refusals import REFUSAL_REASONS, Refusals
from .sqlite import Store

if TYPE_CHECKING:
    from .postgres import PostgresStore

__all__ = [
    "PRUNE_BATCH",
    "QUEUED_ONLY_ABOVE",
    "REFUSAL_REASONS",
    "ActionQueries",
    "ArchivedSession",
    "AsyncStore",
    "AttemptRecord",
    "Caps",
    "ConsoleQueries",
    "DaemonLock",
    "Economy",
    "EndpointConflictError",
    "EndpointLimitError",
    "EndpointQueries",
    "FullObserver",
    "Ingest",
    "KnownSession",
    "LeaseRow",
    "Leases",
    "MetaQueries",
    "OperatorQueries",
    "Outbox",
    "PostgresStore",
    "Refusals",
    "ReplicaState",
    "Round",
    "Store",
    "StoreCore",
    "StoreError",
    "StoreFullError",
    "StoreLockedError",
    "StoreSettings",
    "StoreUnwritableError",
    "acquire_daemon_lock",
    "configured_errors",
    "database_errors",
    "describe_store",
    "open_store",
    "store_failures",
]


def __getattr__(name: str) -> Any:
    """``PostgresStore`` on first use: psycopg (about 10 MB) is loaded only by those who
    use PostgreSQL, never by a relay on SQLite."""
    if name == "PostgresStore":
        from .postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
