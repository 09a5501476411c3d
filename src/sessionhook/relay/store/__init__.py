"""The relay's storage: schema, migrations and every query (the only package with SQL), on
SQLite (``store.path``, the default) or PostgreSQL (``store.url``).

The database is at once the archive (sessions, activities kept whole), the event log, the
outbox (``deliveries``: a row exists before any POST) and the delivery log (``attempts``).
Tables and columns are listed in ``docs/design.md``.

Modules
    :mod:`.rows`         the row dataclasses, the protocols of inputs, :class:`StoreError`
                         (no SQL)
    :mod:`.dialect`      the SQL subset both engines run; each query is written once
    :mod:`.core`         :class:`StoreCore`: the daemon's queries, whatever the engine
                         (meta, endpoints, sessions, upstream counters; the mixins below)
    :mod:`.ingest`       archiving pages of activities and events, compressed bodies
                         (mixed into :class:`StoreCore`)
    :mod:`.ops_queries`  the operator's queries (mixed in)
    :mod:`.outbox`       due deliveries, attempts, pruning (mixed in)
    :mod:`.console_queries`  the web console's lists and chart counts (mixed in)
    :mod:`.economy_queries`  the history walk, known sessions, the request budget's window
                         (mixed in)
    :mod:`.refusals`     what was refused from upstream, and why (mixed in)
    :mod:`.sqlite`       :class:`Store`: the SQLite file, its connections and durability
    :mod:`.schema`       SQLite migrations and the checks that a file is ours (DDL)
    :mod:`.postgres`     :class:`PostgresStore`: the pool, transactions, error mapping
    :mod:`.schema_pg`    the same migrations in PostgreSQL DDL
    :mod:`.opening`      :func:`open_store`: the backend the configuration names
    :mod:`.aio`          :class:`AsyncStore`, the daemon's async handle (waits out a full
                         disk or an unreachable database)
    :mod:`.lock`         the daemon lock: one ``sessionhook run`` per SQLite store (``flock``)
    :mod:`.leases`       the replicas' lease protocol: registry, heartbeats, claims on
                         outbox heads and session polls, named leases (mixed in)
    :mod:`.copy`         ``sessionhook store copy``: a whole store into another, ids kept

Threads
    A store is used from one thread at a time per connection. :class:`AsyncStore` gives the
    daemon async methods that run the store's in worker threads under a
    ``CapacityLimiter(store.concurrency)``: one on SQLite (one writer, never two statements
    at once), the pool size on PostgreSQL (writes serialized by the database).

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

from .aio import AsyncStore, FullObserver
from .core import StoreCore
from .economy_queries import HistoryProgress, KnownSession
from .leases import LeaseRow, ReplicaRow
from .lock import DaemonLock, StoreLockedError, acquire_daemon_lock
from .opening import StoreSettings, database_errors, open_store, store_failures
from .outbox import AttemptRecord
from .refusals import REFUSAL_REASONS
from .rows import (
    OPEN_STATUSES,
    AttemptLike,
    AttemptRow,
    DeliveryRow,
    DueDelivery,
    EndpointLike,
    EndpointState,
    EndpointSummary,
    EventRow,
    Ingested,
    RefusedRow,
    RefusedSummary,
    SessionRow,
    StatusSummary,
    StoreError,
    StoreFullError,
    StoreUnwritableError,
    UpstreamSummary,
)
from .sqlite import Store

if TYPE_CHECKING:
    from .postgres import PostgresStore

__all__ = [
    "OPEN_STATUSES",
    "REFUSAL_REASONS",
    "AsyncStore",
    "AttemptLike",
    "AttemptRecord",
    "AttemptRow",
    "DaemonLock",
    "DeliveryRow",
    "DueDelivery",
    "EndpointLike",
    "EndpointState",
    "EndpointSummary",
    "EventRow",
    "FullObserver",
    "HistoryProgress",
    "Ingested",
    "KnownSession",
    "LeaseRow",
    "PostgresStore",
    "RefusedRow",
    "RefusedSummary",
    "ReplicaRow",
    "SessionRow",
    "StatusSummary",
    "Store",
    "StoreCore",
    "StoreError",
    "StoreFullError",
    "StoreLockedError",
    "StoreSettings",
    "StoreUnwritableError",
    "UpstreamSummary",
    "acquire_daemon_lock",
    "database_errors",
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
