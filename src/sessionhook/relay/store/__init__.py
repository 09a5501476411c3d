"""SQLite storage of the relay: schema, migrations and every query (the only package with SQL).

The database is at once the archive (sessions, activities kept whole), the event log, the
outbox (``deliveries``: a row exists before any POST) and the delivery log (``attempts``).
Tables and columns are listed in ``docs/relay-design.md``.

Modules
    :mod:`.rows`         the row dataclasses, the protocols of inputs, :class:`StoreError`
                         (no SQL)
    :mod:`.schema`       migrations and the checks that a file is ours (DDL)
    :mod:`.sqlite`       :class:`Store`: connections, durability, the daemon's queries
    :mod:`.ops_queries`  the operator's queries, mixed into :class:`Store`
    :mod:`.console_queries`  the web console's lists and chart counts, mixed into
                         :class:`Store`
    :mod:`.economy_queries`  the history walk, known sessions, the request budget's window
                         (mixed into :class:`Store`)
    :mod:`.aio`          :class:`AsyncStore`, the daemon's async handle (waits out a full
                         disk)
    :mod:`.lock`         the daemon lock: one ``sessionhook run`` per store (``flock``)
    :mod:`.refusals`     what was refused from upstream, and why, mixed into :class:`Store`
    :mod:`.leases`       the replicas' lease protocol: registry, heartbeats, claims on
                         outbox heads and session polls, named leases (mixed into
                         :class:`Store`)
    :mod:`.copy`         ``sessionhook store copy``: a whole store into another, ids kept

    Only this package speaks SQL; a second backend is a new module beside :mod:`.sqlite`.

Connections and durability (``synchronous=NORMAL``) are described in :mod:`.sqlite`.

Threads
    A :class:`Store` is used from one thread at a time. :class:`AsyncStore` gives the daemon
    async methods that run the Store's in worker threads under a ``CapacityLimiter(1)``: one
    writer, never two statements at once, the event loop never blocked on disk.

Errors::

    StoreError      the database cannot be opened or used (directory not writable, not a
                    sessionhook database, schema newer than this version, unknown endpoint,
                    write on a read-only store); ``path`` tells which file
    +-- StoreLockedError  another daemon holds the store's lock; ``pid`` is its PID
    +-- StoreUnwritableError  a write cannot be done for now (read-only); nothing committed
        +-- StoreFullError    a write failed for lack of space
"""

from .aio import AsyncStore, FullObserver
from .core import StoreCore
from .economy_queries import HistoryProgress, KnownSession
from .leases import LeaseRow, ReplicaRow
from .lock import DaemonLock, StoreLockedError, acquire_daemon_lock
from .opening import DATABASE_ERRORS, StoreSettings, open_store
from .outbox import AttemptRecord
from .postgres import PostgresStore
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

__all__ = [
    "DATABASE_ERRORS",
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
    "open_store",
]
