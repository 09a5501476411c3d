"""SQLite storage of the relay: schema, migrations and every query (the only module with SQL).

The database is at once the archive (sessions, activities kept whole), the event log, the
outbox (``deliveries``: a row exists before any POST) and the delivery log (``attempts``).
Tables and columns are listed in ``docs/relay-design.md``.

Connections
    :meth:`Store.open` opens the one writer connection: WAL journal, ``foreign_keys=ON``,
    ``busy_timeout`` so that an operator command writing at the same time waits instead of
    failing. Each write method is one ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction.
    :meth:`Store.open_readonly` opens a ``mode=ro`` connection for operator commands; WAL lets
    it read a consistent snapshot while the daemon writes.

Durability (``synchronous=NORMAL``)
    In WAL mode a commit appends the transaction to the ``-wal`` file with ``write()`` before
    ``COMMIT`` returns; only the ``fsync`` is deferred to checkpoints. A ``kill -9`` of the
    process therefore loses no committed transaction: the data sits in the OS page cache and
    reaches the file. A power loss or kernel crash can lose the last transactions committed
    since the previous sync (never corrupt the file). That costs nothing that matters here:
    an activity, its events, its deliveries and the session's ``activity_cursor`` commit in one
    transaction, so a lost tail is re-polled from upstream and re-ingested with the same event
    ids; a lost "delivered" mark means one more send of the same ``webhook-id`` (at-least-once).
    Only operator writes (replay, enable) in those last moments would need redoing.
    ``synchronous=FULL`` would fsync every commit, at a cost of several milliseconds each.

Threads
    A :class:`Store` is used from one thread at a time. :class:`AsyncStore` gives the daemon
    async methods that run the Store's in worker threads under a ``CapacityLimiter(1)``: one
    writer, never two statements at once, the event loop never blocked on disk.

Errors::

    StoreError      the database cannot be opened or used (directory not writable, not a
                    sessionhook database, schema newer than this version, unknown endpoint,
                    write on a read-only store); ``path`` tells which file
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

import anyio
import anyio.to_thread
from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from sessionhook.api.models import Activity, Session, parse_timestamp

from .events import Event, matches
from .retry import Dead, Decision, Delivered, DisableEndpoint, Retry

__all__ = [
    "OPEN_STATUSES",
    "AsyncStore",
    "AttemptLike",
    "AttemptRow",
    "DeliveryRow",
    "DueDelivery",
    "EndpointLike",
    "EndpointState",
    "EndpointSummary",
    "EventRow",
    "Ingested",
    "SessionRow",
    "StatusSummary",
    "Store",
    "StoreError",
    "UpstreamSummary",
]

#: Delivery statuses that still wait for an attempt (``pending``: never tried or parked by a
#: 410; ``failed``: tried, retry scheduled). ``delivered`` and ``dead`` are final.
OPEN_STATUSES = ("pending", "failed")
BUSY_TIMEOUT_MS = 10_000
_FETCH = 500
_HOUR = 3600.0
#: Per-minute upstream counters older than this many minutes are pruned.
_UPSTREAM_KEEP_MINUTES = 2 * 24 * 60


class StoreError(Exception):
    """The store cannot do what was asked; the message says why and names the file."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


# --------------------------------------------------------------------------- inputs


class EndpointLike(Protocol):
    """What :meth:`Store.sync_endpoints` reads of an endpoint (``EndpointConfig`` fits)."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def events(self) -> Sequence[str]: ...

    @property
    def enabled(self) -> bool: ...


class AttemptLike(Protocol):
    """What :meth:`Store.record_attempt` reads of an attempt (``retry.AttemptResult`` fits)."""

    @property
    def status_code(self) -> int | None: ...

    @property
    def error(self) -> str | None: ...

    @property
    def duration_ms(self) -> float: ...

    @property
    def response_body(self) -> str: ...

    @property
    def started_at(self) -> float: ...


# --------------------------------------------------------------------------- rows


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A session as archived, with the poller's bookkeeping."""

    name: str
    id: str
    title: str
    state: str
    url: str
    source: str
    create_time: str
    update_time: str
    raw: dict[str, Any]
    first_seen_at: float
    baseline: bool
    polled_update_time: str | None
    activity_cursor: str | None
    last_polled_at: float | None
    next_poll_at: float | None
    poll_errors: int

    def to_session(self) -> Session:
        """The archived upstream JSON as a :class:`Session`."""
        return Session.model_validate(self.raw)


@dataclass(frozen=True, slots=True)
class EndpointState:
    """An endpoint as the store knows it.

    ``configured``: present in the current config with ``enabled = true``. ``enabled``: not
    disabled at run time (410, failing too long, operator). Only an endpoint that is both is
    :attr:`active`: gets new deliveries and is sent to.
    """

    name: str
    url: str
    events: tuple[str, ...]
    configured: bool
    enabled: bool
    disabled_reason: str | None
    disabled_at: float | None
    last_success_at: float | None
    failing_since: float | None
    last_error: str | None
    last_error_at: float | None
    created_at: float

    @property
    def active(self) -> bool:
        """Configured and enabled."""
        return self.configured and self.enabled


@dataclass(frozen=True, slots=True)
class EventRow:
    """An archived event; ``body`` is the exact payload every delivery sends."""

    seq: int
    id: str
    session_name: str
    type: str
    activity_name: str | None
    occurred_at: str
    occurred_ts: float
    created_at: float
    body: bytes

    def payload(self) -> dict[str, Any]:
        """The body parsed."""
        result: dict[str, Any] = json.loads(self.body)
        return result


@dataclass(frozen=True, slots=True)
class Ingested:
    """What one ingest call archived: new activities, and the type of each new event."""

    activities: int
    event_types: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DueDelivery:
    """A delivery the dispatcher should attempt now.

    ``attempts`` counts the attempts already made (this one is number ``attempts + 1``);
    ``body`` is the event's stored payload, byte for byte.
    """

    id: int
    event_id: str
    event_type: str
    endpoint: str
    url: str
    session_name: str
    attempts: int
    body: bytes
    created_at: float

    @property
    def key(self) -> tuple[str, str]:
        """``(endpoint, session_name)``: at most one in flight per key keeps the order."""
        return (self.endpoint, self.session_name)


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    """One row of the outbox / delivery history."""

    id: int
    event_id: str
    event_type: str
    endpoint: str
    session_name: str
    status: str
    attempts: int
    next_attempt_at: float | None
    created_at: float
    updated_at: float
    delivered_at: float | None
    last_status_code: int | None
    last_error: str | None
    replayed: bool


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One POST of a delivery, as logged."""

    id: int
    delivery_id: int
    attempt: int
    started_at: float
    duration_ms: float
    status_code: int | None
    error: str | None
    response_body: str


@dataclass(frozen=True, slots=True)
class EndpointSummary:
    """Per endpoint figures of :meth:`Store.status_summary`; ``*_last_hour`` count rows."""

    name: str
    url: str
    configured: bool
    enabled: bool
    disabled_reason: str | None
    pending: int
    oldest_pending_age: float | None
    delivered_last_hour: int
    failed_last_hour: int
    dead_last_hour: int
    dead_total: int
    last_error: str | None
    last_error_at: float | None
    last_success_at: float | None
    failing_since: float | None


@dataclass(frozen=True, slots=True)
class UpstreamSummary:
    """Sessions API figures of :meth:`Store.status_summary`."""

    last_poll_at: float | None
    last_ok_poll_at: float | None
    requests_last_hour: int
    throttled_last_hour: int
    errors_last_hour: int


@dataclass(frozen=True, slots=True)
class StatusSummary:
    """What ``sessionhook status`` shows."""

    now: float
    endpoints: tuple[EndpointSummary, ...]
    upstream: UpstreamSummary
    sessions: int
    activities: int
    events: int
    baseline_complete: bool


# --------------------------------------------------------------------------- schema

MIGRATIONS = Migrations("sessionhook")
#: Every migration this version knows, in order (a database with others is newer than us).
_KNOWN_MIGRATIONS: list[str] = []


def _migration(name: str) -> Callable[[Callable[[Database], None]], Callable[[Database], None]]:
    _KNOWN_MIGRATIONS.append(name)
    return MIGRATIONS(name=name)


_INITIAL_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
    """CREATE TABLE sessions (
        name TEXT PRIMARY KEY,
        id TEXT NOT NULL DEFAULT '',
        title TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL DEFAULT '',
        url TEXT NOT NULL DEFAULT '',
        source TEXT NOT NULL DEFAULT '',
        create_time TEXT NOT NULL DEFAULT '',
        update_time TEXT NOT NULL DEFAULT '',
        raw TEXT NOT NULL,
        first_seen_at REAL NOT NULL,
        baseline INTEGER NOT NULL DEFAULT 0,
        polled_update_time TEXT,
        activity_cursor TEXT,
        last_polled_at REAL,
        next_poll_at REAL,
        poll_errors INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE activities (
        name TEXT PRIMARY KEY,
        session_name TEXT NOT NULL REFERENCES sessions(name),
        id TEXT NOT NULL DEFAULT '',
        create_time TEXT NOT NULL DEFAULT '',
        kind TEXT NOT NULL,
        raw TEXT NOT NULL,
        ingested_at REAL NOT NULL
    )""",
    "CREATE INDEX activities_by_session ON activities(session_name, create_time)",
    """CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        session_name TEXT NOT NULL REFERENCES sessions(name),
        type TEXT NOT NULL,
        activity_name TEXT,
        occurred_at TEXT NOT NULL,
        occurred_ts REAL NOT NULL,
        created_at REAL NOT NULL,
        body TEXT NOT NULL
    )""",
    "CREATE INDEX events_by_session ON events(session_name, seq)",
    "CREATE INDEX events_by_time ON events(occurred_ts)",
    """CREATE TABLE endpoints (
        name TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        events TEXT NOT NULL DEFAULT '["*"]',
        configured INTEGER NOT NULL DEFAULT 1,
        enabled INTEGER NOT NULL DEFAULT 1,
        disabled_reason TEXT,
        disabled_at REAL,
        last_success_at REAL,
        failing_since REAL,
        last_error TEXT,
        last_error_at REAL,
        created_at REAL NOT NULL
    )""",
    """CREATE TABLE deliveries (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id TEXT NOT NULL REFERENCES events(id),
        endpoint TEXT NOT NULL REFERENCES endpoints(name),
        session_name TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'failed', 'dead', 'delivered')),
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        delivered_at REAL,
        last_status_code INTEGER,
        last_error TEXT,
        replayed INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX deliveries_by_key ON deliveries(endpoint, session_name, status, id)",
    # The outbox proper: only open rows, so it stays small however long the history grows.
    """CREATE INDEX deliveries_open ON deliveries(endpoint, session_name, id)
        WHERE status IN ('pending', 'failed')""",
    "CREATE INDEX deliveries_by_event ON deliveries(event_id)",
    "CREATE INDEX deliveries_by_update ON deliveries(status, updated_at)",
    """CREATE TABLE attempts (
        id INTEGER PRIMARY KEY,
        delivery_id INTEGER NOT NULL REFERENCES deliveries(id),
        attempt INTEGER NOT NULL,
        started_at REAL NOT NULL,
        duration_ms REAL NOT NULL,
        status_code INTEGER,
        error TEXT,
        response_body TEXT NOT NULL DEFAULT ''
    )""",
    "CREATE INDEX attempts_by_delivery ON attempts(delivery_id, attempt)",
    "CREATE INDEX attempts_by_time ON attempts(started_at)",
    """CREATE TABLE upstream_requests (
        minute INTEGER NOT NULL,
        label TEXT NOT NULL,
        status INTEGER NOT NULL,
        count INTEGER NOT NULL,
        PRIMARY KEY (minute, label, status)
    ) WITHOUT ROWID""",
)


@_migration("0001_initial")
def _m0001_initial(db: Database) -> None:
    # Statement by statement: executescript() would COMMIT the migration's transaction.
    for statement in _INITIAL_SCHEMA:
        db.execute(statement)


def _schema_state(db: Database) -> tuple[list[str], list[str]]:
    """(pending migration names, applied names this version does not know)."""
    applied = [m.name for m in MIGRATIONS.applied(db)]
    pending = [name for name in _KNOWN_MIGRATIONS if name not in applied]
    return pending, [name for name in applied if name not in _KNOWN_MIGRATIONS]


# --------------------------------------------------------------------------- the store

P = ParamSpec("P")
T = TypeVar("T")


class Store:
    """Synchronous access to the relay database. Open with :meth:`open` or
    :meth:`open_readonly`; the daemon goes through :class:`AsyncStore`.

    ``clock`` (Unix seconds) stamps our own bookkeeping (``created_at``, ``first_seen_at``...);
    tests inject one. Times passed in (``now``, ``at``) are used as given.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        *,
        readonly: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._conn = conn
        self.path = path
        self.readonly = readonly
        self._clock = clock
        conn.create_function("fnmatch", 2, _sql_fnmatch, deterministic=True)

    # ----------------------------------------------------------------- opening

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time) -> Store:
        """Open (creating the directory and file if needed) and migrate the database.

        Raises :class:`StoreError` when the directory cannot be created or written, when the
        file is not a SQLite database, or is one that sessionhook did not create.
        """
        db_path = Path(path)
        parent = db_path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create directory {parent}: {exc.strerror or exc}", path=db_path
            ) from None
        if not os.access(parent, os.W_OK | os.X_OK):
            raise StoreError(
                f"directory {parent} is not writable (SQLite creates {db_path.name}-wal and "
                f"{db_path.name}-shm next to the database)",
                path=db_path,
            )
        if db_path.exists() and not os.access(db_path, os.R_OK | os.W_OK):
            raise StoreError(f"{db_path} is not readable and writable", path=db_path)
        try:
            conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open {db_path}: {exc}", path=db_path) from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # Before anything changes the file: a foreign database is left exactly as it was.
            _check_ours(conn, db_path)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{db_path}: cannot use WAL journal (got {mode})", path=db_path)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            # Truncate the WAL file after checkpoints instead of leaving it at its peak size.
            conn.execute(f"PRAGMA journal_size_limit = {64 * 1024 * 1024}")
            _migrate(conn, Database(conn, execute_plugins=False), db_path)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(
                f"{db_path} is not a usable SQLite database: {exc}", path=db_path
            ) from None
        except BaseException:
            conn.close()
            raise
        return cls(conn, db_path, readonly=False, clock=clock)

    @classmethod
    def open_readonly(
        cls, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> Store:
        """Open an existing database read-only (``mode=ro``), e.g. while the daemon runs.

        Write methods then raise :class:`StoreError`. The schema must be current.
        """
        db_path = Path(path)
        if not db_path.is_file():
            raise StoreError(f"no database at {db_path}", path=db_path)
        uri = f"file:{urllib.parse.quote(str(db_path.absolute()))}?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open {db_path}: {exc}", path=db_path) from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA query_only = ON")
            _check_ours(conn, db_path)
            pending, unknown = _schema_state(Database(conn, execute_plugins=False))
            if unknown:
                raise StoreError(
                    f"{db_path} was written by a newer sessionhook (migration {unknown[0]})",
                    path=db_path,
                )
            if pending:
                raise StoreError(
                    f"{db_path} needs migrating: start the daemon once (or open it writable)",
                    path=db_path,
                )
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(
                f"{db_path} is not a usable SQLite database: {exc}", path=db_path
            ) from None
        except BaseException:
            conn.close()
            raise
        return cls(conn, db_path, readonly=True, clock=clock)

    def close(self) -> None:
        """Close the connection (a checkpoint folds the WAL into the database file)."""
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; the write lock is taken up front (no upgrade deadlock)."""
        if self.readonly:
            raise StoreError(f"{self.path} is open read-only", path=self.path)
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            # Some errors (SQLITE_FULL, IOERR...) already rolled back; do not mask them.
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = self._conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    # ----------------------------------------------------------------- meta

    def get_meta(self, key: str) -> str | None:
        """A value of the ``meta`` table."""
        value = self._one("SELECT value FROM meta WHERE key = ?", (key,))
        return None if value is None else str(value)

    def set_meta(self, key: str, value: str) -> None:
        """Set a value of the ``meta`` table."""
        with self._tx() as c:
            c.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def is_baseline_complete(self) -> bool:
        """Whether the first discovery pass (the baseline of ``backfill = false``) finished."""
        return self.get_meta("baseline_complete") == "1"

    def mark_baseline_complete(self) -> None:
        """Record that the first discovery pass finished."""
        self.set_meta("baseline_complete", "1")

    # ----------------------------------------------------------------- endpoints

    def sync_endpoints(self, endpoints: Iterable[EndpointLike]) -> None:
        """Make the endpoints table match the config: upsert url and globs, keep the run-time
        enabled state; endpoints missing from the config stay (history) but become inactive.
        """
        now = self._clock()
        with self._tx() as c:
            names = []
            for ep in endpoints:
                names.append(ep.name)
                c.execute(
                    "INSERT INTO endpoints (name, url, events, configured, enabled, created_at) "
                    "VALUES (?, ?, ?, ?, 1, ?) ON CONFLICT (name) DO UPDATE SET "
                    "url = excluded.url, events = excluded.events, "
                    "configured = excluded.configured",
                    (ep.name, ep.url, json.dumps(list(ep.events)), int(ep.enabled), now),
                )
            c.execute(
                "UPDATE endpoints SET configured = 0 "
                "WHERE name NOT IN (SELECT value FROM json_each(?))",
                (json.dumps(names),),
            )

    def set_endpoint_enabled(self, name: str, enabled: bool, reason: str | None = None) -> None:
        """Enable (clearing the reason and the failing clock) or disable an endpoint.

        Deliveries left pending while it was disabled are sent once it is enabled again.
        """
        now = self._clock()
        with self._tx() as c:
            if enabled:
                cur = c.execute(
                    "UPDATE endpoints SET enabled = 1, disabled_reason = NULL, "
                    "disabled_at = NULL, failing_since = NULL WHERE name = ?",
                    (name,),
                )
            else:
                cur = c.execute(
                    "UPDATE endpoints SET enabled = 0, disabled_reason = ?, disabled_at = ? "
                    "WHERE name = ?",
                    (reason, now, name),
                )
            if cur.rowcount == 0:
                raise StoreError(f"unknown endpoint {name!r}", path=self.path)

    def endpoint_states(self) -> list[EndpointState]:
        """Every endpoint the store knows, by name."""
        rows = self._conn.execute(
            "SELECT name, url, events, configured, enabled, disabled_reason, disabled_at, "
            "last_success_at, failing_since, last_error, last_error_at, created_at "
            "FROM endpoints ORDER BY name"
        ).fetchall()
        return [
            EndpointState(
                name=r[0],
                url=r[1],
                events=tuple(json.loads(r[2])),
                configured=bool(r[3]),
                enabled=bool(r[4]),
                disabled_reason=r[5],
                disabled_at=r[6],
                last_success_at=r[7],
                failing_since=r[8],
                last_error=r[9],
                last_error_at=r[10],
                created_at=r[11],
            )
            for r in rows
        ]

    def _active_endpoints(self) -> list[tuple[str, list[str]]]:
        rows = self._conn.execute(
            "SELECT name, events FROM endpoints WHERE enabled = 1 AND configured = 1 ORDER BY name"
        ).fetchall()
        return [(name, json.loads(globs)) for name, globs in rows]

    # ----------------------------------------------------------------- sessions

    _SESSION_COLUMNS = (
        "name, id, title, state, url, source, create_time, update_time, raw, first_seen_at, "
        "baseline, polled_update_time, activity_cursor, last_polled_at, next_poll_at, poll_errors"
    )

    @staticmethod
    def _session_row(r: Sequence[Any]) -> SessionRow:
        return SessionRow(
            name=r[0],
            id=r[1],
            title=r[2],
            state=r[3],
            url=r[4],
            source=r[5],
            create_time=r[6],
            update_time=r[7],
            raw=json.loads(r[8]),
            first_seen_at=r[9],
            baseline=bool(r[10]),
            polled_update_time=r[11],
            activity_cursor=r[12],
            last_polled_at=r[13],
            next_poll_at=r[14],
            poll_errors=r[15],
        )

    def get_session(self, name: str) -> SessionRow | None:
        """The archived session, or ``None``."""
        row = self._conn.execute(
            f"SELECT {self._SESSION_COLUMNS} FROM sessions WHERE name = ?", (name,)
        ).fetchone()
        return None if row is None else self._session_row(row)

    def all_sessions(self) -> list[SessionRow]:
        """Every archived session, in the order they were first seen."""
        rows = self._conn.execute(
            f"SELECT {self._SESSION_COLUMNS} FROM sessions ORDER BY first_seen_at, name"
        ).fetchall()
        return [self._session_row(r) for r in rows]

    def upsert_session(self, session: Session, *, baseline: bool) -> SessionRow:
        """Archive a session (no events). A list item updates only the fields it carries: the
        stored JSON is merged (new keys win), and empty fields never erase known ones.
        ``baseline`` counts only when the session is new.
        """
        now = self._clock()
        wire = session.to_wire()
        with self._tx() as c:
            old = c.execute("SELECT raw FROM sessions WHERE name = ?", (session.name,)).fetchone()
            merged = {**json.loads(old[0]), **wire} if old else wire
            full = Session.model_validate(merged)
            source = full.source_context.source if full.source_context else ""
            c.execute(
                "INSERT INTO sessions (name, id, title, state, url, source, create_time, "
                "update_time, raw, first_seen_at, baseline) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "id = excluded.id, title = excluded.title, state = excluded.state, "
                "url = excluded.url, source = excluded.source, "
                "create_time = excluded.create_time, update_time = excluded.update_time, "
                "raw = excluded.raw",
                (
                    full.name,
                    full.session_id,
                    full.title,
                    full.state,
                    full.url,
                    source,
                    full.create_time,
                    full.update_time,
                    json.dumps(merged, separators=(",", ":"), ensure_ascii=False),
                    now,
                    int(baseline),
                ),
            )
        row = self.get_session(session.name)
        if row is None:  # pragma: no cover - the row was just written
            raise StoreError(f"session {session.name} vanished", path=self.path)
        return row

    def schedule_poll(
        self,
        name: str,
        next_poll_at: float | None,
        *,
        polled_update_time: str | None = None,
        polled_at: float | None = None,
        poll_errors: int | None = None,
    ) -> None:
        """Set when the session's activities are polled next (``None``: not scheduled).

        Passing ``polled_update_time`` records a completed activity poll: the session's
        ``updateTime`` it covered, and ``last_polled_at`` = ``polled_at`` or the clock (a
        baseline session delivers from its second poll on). ``poll_errors`` sets the count
        of consecutive failed polls (backoff).
        """
        if polled_update_time is not None and polled_at is None:
            polled_at = self._clock()
        with self._tx() as c:
            c.execute(
                "UPDATE sessions SET next_poll_at = ?, "
                "polled_update_time = COALESCE(?, polled_update_time), "
                "last_polled_at = COALESCE(?, last_polled_at), "
                "poll_errors = COALESCE(?, poll_errors) WHERE name = ?",
                (next_poll_at, polled_update_time, polled_at, poll_errors, name),
            )

    # ----------------------------------------------------------------- ingest

    def _insert_events(
        self,
        c: sqlite3.Connection,
        events: Iterable[Event],
        deliver: bool,
        now: float,
    ) -> tuple[str, ...]:
        endpoints = self._active_endpoints() if deliver else []
        inserted: list[str] = []
        for event in events:
            cur = c.execute(
                "INSERT OR IGNORE INTO events (id, session_name, type, activity_name, "
                "occurred_at, occurred_ts, created_at, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    event.id,
                    event.session_name,
                    event.type,
                    event.activity_name,
                    event.occurred_at,
                    event.occurred_ts,
                    now,
                    event.body.decode("utf-8"),
                ),
            )
            if cur.rowcount == 0:
                continue  # already archived: its deliveries were enqueued back then
            inserted.append(event.type)
            for endpoint, globs in endpoints:
                if matches(globs, event.type):
                    c.execute(
                        "INSERT INTO deliveries (event_id, endpoint, session_name, status, "
                        "next_attempt_at, created_at, updated_at) "
                        "VALUES (?, ?, ?, 'pending', ?, ?, ?)",
                        (event.id, endpoint, event.session_name, now, now, now),
                    )
        return tuple(inserted)

    def ingest_session_events(
        self, session_name: str, events: Sequence[Event], deliver: bool
    ) -> Ingested:
        """Append session-level events (discovered, state changed, pull request) and, when
        ``deliver``, enqueue them for every active endpoint whose globs match. One
        transaction; events already archived (same id) are skipped. Returns what was new.
        """
        now = self._clock()
        with self._tx() as c:
            return Ingested(0, self._insert_events(c, events, deliver, now))

    def ingest_activities(
        self,
        session_name: str,
        activities: Sequence[Activity],
        events: Sequence[Event],
        deliver: bool,
    ) -> Ingested:
        """Archive a page of activities with their events, in ONE transaction.

        Activities already archived (by name) are skipped, and so are their events: they
        produce no delivery. New events get a delivery per active, matching endpoint when
        ``deliver``. The session's ``activity_cursor`` advances to the newest ``createTime``
        of the page (compared as instants, never as strings). Returns how many activities
        were new and the types of the new events. If anything fails, nothing of the page is
        written.
        """
        now = self._clock()
        with self._tx() as c:
            if not c.execute("SELECT 1 FROM sessions WHERE name = ?", (session_name,)).fetchone():
                raise StoreError(f"unknown session {session_name!r}", path=self.path)
            names = list(dict.fromkeys(a.name for a in activities))
            known = {
                row[0]
                for row in c.execute(
                    "SELECT name FROM activities WHERE name IN (SELECT value FROM json_each(?))",
                    (json.dumps(names),),
                )
            }
            fresh: dict[str, Activity] = {}
            for activity in activities:
                if activity.name not in known and activity.name not in fresh:
                    fresh[activity.name] = activity
            for activity in fresh.values():
                c.execute(
                    "INSERT INTO activities (name, session_name, id, create_time, kind, raw, "
                    "ingested_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        activity.name,
                        session_name,
                        activity.id,
                        activity.create_time,
                        activity.event_member or "unknown",
                        json.dumps(activity.to_wire(), separators=(",", ":"), ensure_ascii=False),
                        now,
                    ),
                )
            wanted = [e for e in events if e.activity_name is None or e.activity_name in fresh]
            types = self._insert_events(c, wanted, deliver, now)
            cursor = self._one(
                "SELECT activity_cursor FROM sessions WHERE name = ?", (session_name,)
            )
            newest = _newest([cursor, *(a.create_time for a in activities)])
            if newest is not None and newest != cursor:
                c.execute(
                    "UPDATE sessions SET activity_cursor = ? WHERE name = ?",
                    (newest, session_name),
                )
            return Ingested(len(fresh), types)

    # ----------------------------------------------------------------- outbox

    _HEADS = (
        "SELECT MIN(id) AS id FROM deliveries WHERE status IN ('pending', 'failed') "
        "GROUP BY endpoint, session_name"
    )

    def due_deliveries(
        self, now: float, limit: int, busy: Iterable[tuple[str, str]] = ()
    ) -> list[DueDelivery]:
        """Deliveries to attempt now, soonest first, at most ``limit``.

        Per (endpoint, session) only the oldest open (pending/failed) delivery is eligible,
        so a session's events reach an endpoint in order; it must be due
        (``next_attempt_at <= now``) and its endpoint active. Keys in ``busy`` (in flight)
        are skipped. Dead and delivered rows never block.
        """
        skip = set(busy)
        rows = self._conn.execute(
            "SELECT d.id, d.event_id, e.type, d.endpoint, ep.url, d.session_name, d.attempts, "
            "e.body, d.created_at "
            f"FROM ({self._HEADS}) AS h "
            "JOIN deliveries d ON d.id = h.id "
            "JOIN endpoints ep ON ep.name = d.endpoint AND ep.enabled = 1 AND ep.configured = 1 "
            "JOIN events e ON e.id = d.event_id "
            "WHERE d.next_attempt_at <= ? ORDER BY d.next_attempt_at, d.id LIMIT ?",
            (now, max(0, limit) + len(skip)),
        ).fetchall()
        due = [
            DueDelivery(
                id=r[0],
                event_id=r[1],
                event_type=r[2],
                endpoint=r[3],
                url=r[4],
                session_name=r[5],
                attempts=r[6],
                body=r[7].encode("utf-8"),
                created_at=r[8],
            )
            for r in rows
            if (r[3], r[5]) not in skip
        ]
        return due[: max(0, limit)]

    def next_due_at(self) -> float | None:
        """When the earliest eligible delivery of an active endpoint is due (``None``: none)."""
        value = self._one(
            f"SELECT MIN(d.next_attempt_at) FROM ({self._HEADS}) AS h "
            "JOIN deliveries d ON d.id = h.id "
            "JOIN endpoints ep ON ep.name = d.endpoint AND ep.enabled = 1 AND ep.configured = 1"
        )
        return None if value is None else float(value)

    def record_attempt(
        self, delivery_id: int, attempt: AttemptLike, decision: Decision
    ) -> float | None:
        """Log an attempt and apply its decision, in one transaction.

        * :class:`Delivered`: the delivery is final; the endpoint's ``last_success_at`` is
          set and its ``failing_since`` cleared.
        * :class:`Retry`: status ``failed``, ``next_attempt_at = decision.at``.
        * :class:`Dead`: status ``dead`` (replayable).
        * :class:`DisableEndpoint`: the endpoint is disabled with the reason; the delivery
          stays ``pending`` and goes out first once the endpoint is enabled again.

        Any failure sets the endpoint's ``failing_since`` if it was not set. Returns the
        endpoint's ``failing_since`` afterwards (``None`` when healthy), which the caller
        hands to ``retry.should_disable``.
        """
        finished = attempt.started_at + attempt.duration_ms / 1000.0
        code = attempt.status_code
        error = attempt.error or (
            None if code is not None and 200 <= code < 300 else f"HTTP {code}"
        )
        with self._tx() as c:
            row = c.execute(
                "SELECT endpoint, attempts FROM deliveries WHERE id = ?", (delivery_id,)
            ).fetchone()
            if row is None:
                raise StoreError(f"unknown delivery {delivery_id}", path=self.path)
            endpoint, number = row[0], row[1] + 1
            c.execute(
                "INSERT INTO attempts (delivery_id, attempt, started_at, duration_ms, "
                "status_code, error, response_body) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    delivery_id,
                    number,
                    attempt.started_at,
                    attempt.duration_ms,
                    code,
                    attempt.error,
                    attempt.response_body,
                ),
            )
            common = "attempts = ?, updated_at = ?, last_status_code = ?, last_error = ?"
            values: tuple[Any, ...] = (number, finished, code, error)
            if isinstance(decision, Delivered):
                c.execute(
                    f"UPDATE deliveries SET status = 'delivered', {common}, "
                    "next_attempt_at = NULL, delivered_at = ? WHERE id = ?",
                    (*values, finished, delivery_id),
                )
                c.execute(
                    "UPDATE endpoints SET last_success_at = ?, failing_since = NULL WHERE name = ?",
                    (finished, endpoint),
                )
            else:
                if isinstance(decision, Retry):
                    c.execute(
                        f"UPDATE deliveries SET status = 'failed', {common}, "
                        "next_attempt_at = ? WHERE id = ?",
                        (*values, decision.at, delivery_id),
                    )
                elif isinstance(decision, Dead):
                    c.execute(
                        f"UPDATE deliveries SET status = 'dead', {common}, "
                        "next_attempt_at = NULL WHERE id = ?",
                        (*values, delivery_id),
                    )
                elif isinstance(decision, DisableEndpoint):
                    c.execute(
                        f"UPDATE deliveries SET status = 'pending', {common} WHERE id = ?",
                        (*values, delivery_id),
                    )
                    c.execute(
                        "UPDATE endpoints SET enabled = 0, disabled_reason = ?, "
                        "disabled_at = ? WHERE name = ?",
                        (decision.reason, finished, endpoint),
                    )
                c.execute(
                    "UPDATE endpoints SET failing_since = COALESCE(failing_since, ?), "
                    "last_error = ?, last_error_at = ? WHERE name = ?",
                    (attempt.started_at, error, finished, endpoint),
                )
            value = self._one("SELECT failing_since FROM endpoints WHERE name = ?", (endpoint,))
        return None if value is None else float(value)

    def pending_count(self, endpoint: str | None = None) -> int:
        """Open (pending or failed) deliveries, of one endpoint or all."""
        if endpoint is None:
            return int(
                self._one("SELECT COUNT(*) FROM deliveries WHERE status IN ('pending', 'failed')")
            )
        return int(
            self._one(
                "SELECT COUNT(*) FROM deliveries "
                "WHERE status IN ('pending', 'failed') AND endpoint = ?",
                (endpoint,),
            )
        )

    def outbox_stats(self) -> dict[str, tuple[int, float | None]]:
        """Per known endpoint: (open deliveries, ``created_at`` of the oldest) for metrics."""
        rows = self._conn.execute(
            "SELECT ep.name, COUNT(d.id), MIN(d.created_at) FROM endpoints ep "
            "LEFT JOIN deliveries d ON d.endpoint = ep.name "
            "AND d.status IN ('pending', 'failed') GROUP BY ep.name ORDER BY ep.name"
        ).fetchall()
        return {name: (count, oldest) for name, count, oldest in rows}

    # ----------------------------------------------------------------- upstream

    def record_upstream(self, label: str, status: int | None, at: float) -> None:
        """Count one upstream request in its minute bucket (``status`` None: no answer)."""
        minute = int(at // 60)
        with self._tx() as c:
            c.execute(
                "INSERT INTO upstream_requests (minute, label, status, count) "
                "VALUES (?, ?, ?, 1) ON CONFLICT (minute, label, status) "
                "DO UPDATE SET count = count + 1",
                (minute, label, -1 if status is None else status),
            )
            c.execute(
                "DELETE FROM upstream_requests WHERE minute < ?",
                (minute - _UPSTREAM_KEEP_MINUTES,),
            )

    def mark_poll(self, ok: bool, at: float) -> None:
        """Record a discovery pass: when it ran and, if it succeeded, when it last did."""
        with self._tx() as c:
            keys = [("last_poll_at", at)] + ([("last_ok_poll_at", at)] if ok else [])
            for key, value in keys:
                c.execute(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (key, repr(value)),
                )

    # ----------------------------------------------------------------- operator queries

    def status_summary(self, now: float) -> StatusSummary:
        """Figures for ``sessionhook status``: per endpoint and upstream, at ``now``."""
        hour_ago = now - _HOUR
        open_rows = self.outbox_stats()
        final = {
            (ep, status): n
            for ep, status, n in self._conn.execute(
                "SELECT endpoint, status, COUNT(*) FROM deliveries "
                "WHERE status IN ('delivered', 'dead') AND updated_at >= ? "
                "GROUP BY endpoint, status",
                (hour_ago,),
            )
        }
        dead_total = dict(
            self._conn.execute(
                "SELECT endpoint, COUNT(*) FROM deliveries WHERE status = 'dead' GROUP BY endpoint"
            ).fetchall()
        )
        failed = dict(
            self._conn.execute(
                "SELECT d.endpoint, COUNT(*) FROM attempts a JOIN deliveries d "
                "ON d.id = a.delivery_id WHERE a.started_at >= ? "
                "AND (a.status_code IS NULL OR a.status_code NOT BETWEEN 200 AND 299) "
                "GROUP BY d.endpoint",
                (hour_ago,),
            ).fetchall()
        )
        summaries = []
        for st in self.endpoint_states():
            count, oldest = open_rows.get(st.name, (0, None))
            summaries.append(
                EndpointSummary(
                    name=st.name,
                    url=st.url,
                    configured=st.configured,
                    enabled=st.enabled,
                    disabled_reason=st.disabled_reason,
                    pending=count,
                    oldest_pending_age=None if oldest is None else max(0.0, now - oldest),
                    delivered_last_hour=final.get((st.name, "delivered"), 0),
                    failed_last_hour=failed.get(st.name, 0),
                    dead_last_hour=final.get((st.name, "dead"), 0),
                    dead_total=dead_total.get(st.name, 0),
                    last_error=st.last_error,
                    last_error_at=st.last_error_at,
                    last_success_at=st.last_success_at,
                    failing_since=st.failing_since,
                )
            )
        upstream = self._conn.execute(
            "SELECT COALESCE(SUM(count), 0), "
            "COALESCE(SUM(CASE WHEN status = 429 THEN count END), 0), "
            "COALESCE(SUM(CASE WHEN status = -1 OR status >= 500 THEN count END), 0) "
            "FROM upstream_requests WHERE minute >= ?",
            (int(hour_ago // 60),),
        ).fetchone()
        last_poll = self.get_meta("last_poll_at")
        last_ok = self.get_meta("last_ok_poll_at")
        return StatusSummary(
            now=now,
            endpoints=tuple(summaries),
            upstream=UpstreamSummary(
                last_poll_at=None if last_poll is None else float(last_poll),
                last_ok_poll_at=None if last_ok is None else float(last_ok),
                requests_last_hour=upstream[0],
                throttled_last_hour=upstream[1],
                errors_last_hour=upstream[2],
            ),
            sessions=int(self._one("SELECT COUNT(*) FROM sessions")),
            activities=int(self._one("SELECT COUNT(*) FROM activities")),
            events=int(self._one("SELECT COUNT(*) FROM events")),
            baseline_complete=self.is_baseline_complete(),
        )

    _DELIVERY_COLUMNS = (
        "d.id, d.event_id, e.type, d.endpoint, d.session_name, d.status, d.attempts, "
        "d.next_attempt_at, d.created_at, d.updated_at, d.delivered_at, d.last_status_code, "
        "d.last_error, d.replayed"
    )

    @staticmethod
    def _delivery_row(r: Sequence[Any]) -> DeliveryRow:
        return DeliveryRow(
            id=r[0],
            event_id=r[1],
            event_type=r[2],
            endpoint=r[3],
            session_name=r[4],
            status=r[5],
            attempts=r[6],
            next_attempt_at=r[7],
            created_at=r[8],
            updated_at=r[9],
            delivered_at=r[10],
            last_status_code=r[11],
            last_error=r[12],
            replayed=bool(r[13]),
        )

    def list_deliveries(
        self,
        endpoint: str | None = None,
        status: str | None = None,
        session: str | None = None,
        limit: int = 100,
        *,
        event_id: str | None = None,
    ) -> list[DeliveryRow]:
        """Deliveries, newest first, filtered by any of endpoint, status, session, event."""
        where, params = _where(
            ("d.endpoint = ?", endpoint),
            ("d.status = ?", status),
            ("d.session_name = ?", session),
            ("d.event_id = ?", event_id),
        )
        rows = self._conn.execute(
            f"SELECT {self._DELIVERY_COLUMNS} FROM deliveries d "
            f"JOIN events e ON e.id = d.event_id {where} ORDER BY d.id DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [self._delivery_row(r) for r in rows]

    def get_delivery(self, delivery_id: int) -> DeliveryRow | None:
        """One delivery, or ``None``."""
        row = self._conn.execute(
            f"SELECT {self._DELIVERY_COLUMNS} FROM deliveries d "
            "JOIN events e ON e.id = d.event_id WHERE d.id = ?",
            (delivery_id,),
        ).fetchone()
        return None if row is None else self._delivery_row(row)

    def list_attempts(self, delivery_id: int) -> list[AttemptRow]:
        """The attempts of a delivery, first to last."""
        rows = self._conn.execute(
            "SELECT id, delivery_id, attempt, started_at, duration_ms, status_code, error, "
            "response_body FROM attempts WHERE delivery_id = ? ORDER BY attempt, id",
            (delivery_id,),
        ).fetchall()
        return [AttemptRow(*r) for r in rows]

    def replay(
        self,
        endpoint: str,
        *,
        since: float | None = None,
        until: float | None = None,
        event_ids: Sequence[str] | None = None,
        type_glob: str | None = None,
        session: str | None = None,
    ) -> int:
        """Queue archived events again for ``endpoint``; returns how many were queued.

        Each selected event gets a NEW ``pending`` delivery row (``replayed = 1``) carrying the
        same event id, so the consumer sees the same ``webhook-id`` and body; dead letters are
        replayed this way. Filters combine with AND: ``since`` (inclusive) / ``until``
        (exclusive) on the event's upstream time in Unix seconds, explicit ``event_ids``, a
        ``type_glob`` (fnmatch) and a ``session`` name; at least one is required. Only event
        types the endpoint subscribes to are queued, and events that already have an open
        delivery to it are skipped (they are on their way). One ``INSERT ... SELECT``, in
        event order, so a large range costs one statement.
        """
        if since is None and until is None and event_ids is None and not type_glob and not session:
            raise ValueError("replay needs at least one filter (since, until, ids, type, session)")
        now = self._clock()
        where, params = _where(
            ("e.occurred_ts >= ?", since),
            ("e.occurred_ts < ?", until),
            (
                "e.id IN (SELECT value FROM json_each(?))",
                None if event_ids is None else json.dumps(list(event_ids)),
            ),
            ("fnmatch(?, e.type)", type_glob),
            ("e.session_name = ?", session),
        )
        with self._tx() as c:
            if not c.execute("SELECT 1 FROM endpoints WHERE name = ?", (endpoint,)).fetchone():
                raise StoreError(f"unknown endpoint {endpoint!r}", path=self.path)
            cur = c.execute(
                "INSERT INTO deliveries (event_id, endpoint, session_name, status, "
                "next_attempt_at, created_at, updated_at, replayed) "
                "SELECT e.id, ep.name, e.session_name, 'pending', ?, ?, ?, 1 "
                f"FROM events e JOIN endpoints ep ON ep.name = ? {where} "
                f"{'AND' if where else 'WHERE'} EXISTS (SELECT 1 FROM json_each(ep.events) g "
                "WHERE fnmatch(g.value, e.type)) "
                "AND NOT EXISTS (SELECT 1 FROM deliveries o WHERE o.event_id = e.id "
                "AND o.endpoint = ep.name AND o.status IN ('pending', 'failed')) "
                "ORDER BY e.seq",
                (now, now, now, endpoint, *params),
            )
            return cur.rowcount

    _EVENT_COLUMNS = (
        "seq, id, session_name, type, activity_name, occurred_at, occurred_ts, created_at, body"
    )

    def get_event(self, event_id: str) -> EventRow | None:
        """One archived event, or ``None``."""
        row = self._conn.execute(
            f"SELECT {self._EVENT_COLUMNS} FROM events WHERE id = ?", (event_id,)
        ).fetchone()
        return None if row is None else _event_row(row)

    def iter_events(
        self,
        session: str | None = None,
        type_glob: str | None = None,
        since: float | None = None,
        *,
        until: float | None = None,
    ) -> Iterator[EventRow]:
        """Archived events in ingest order, streamed from a cursor (never all in memory).

        ``since`` / ``until`` filter on the upstream time in Unix seconds (inclusive /
        exclusive). Rows are fetched in batches of a few hundred as the caller iterates.
        """
        where, params = _where(
            ("session_name = ?", session),
            ("fnmatch(?, type)", type_glob),
            ("occurred_ts >= ?", since),
            ("occurred_ts < ?", until),
        )
        cursor = self._conn.execute(
            f"SELECT {self._EVENT_COLUMNS} FROM events {where} ORDER BY seq", params
        )
        try:
            while rows := cursor.fetchmany(_FETCH):
                for row in rows:
                    yield _event_row(row)
        finally:
            cursor.close()


# --------------------------------------------------------------------------- async wrapper


class AsyncStore:
    """The daemon's handle on the :class:`Store`: every call runs in a worker thread under a
    ``CapacityLimiter(1)``, so there is one writer and the event loop never waits on disk.

    Explicit async methods cover what the poller, dispatcher and health server use; any
    other Store method is reachable through :meth:`call` (``await astore.call(store.replay,
    "ci", since=t)``). A call whose task is cancelled still finishes its transaction in the
    thread (anyio does not abandon the thread), so cancellation never half-writes.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._limiter = anyio.CapacityLimiter(1)

    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> AsyncStore:
        """:meth:`Store.open` in a worker thread."""
        store = await anyio.to_thread.run_sync(functools.partial(Store.open, path, clock=clock))
        return cls(store)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` (a Store method) in the store's worker thread."""
        return await anyio.to_thread.run_sync(
            functools.partial(fn, *args, **kwargs), limiter=self._limiter
        )

    async def close(self) -> None:
        """Close the store once every queued call has run."""
        await self.call(self.store.close)

    aclose = close

    async def sync_endpoints(self, endpoints: Iterable[EndpointLike]) -> None:
        """See :meth:`Store.sync_endpoints`."""
        await self.call(self.store.sync_endpoints, list(endpoints))

    async def set_endpoint_enabled(self, name: str, enabled: bool, reason: str | None) -> None:
        """See :meth:`Store.set_endpoint_enabled`."""
        await self.call(self.store.set_endpoint_enabled, name, enabled, reason)

    async def endpoint_states(self) -> list[EndpointState]:
        """See :meth:`Store.endpoint_states`."""
        return await self.call(self.store.endpoint_states)

    async def get_session(self, name: str) -> SessionRow | None:
        """See :meth:`Store.get_session`."""
        return await self.call(self.store.get_session, name)

    async def all_sessions(self) -> list[SessionRow]:
        """See :meth:`Store.all_sessions`."""
        return await self.call(self.store.all_sessions)

    async def is_baseline_complete(self) -> bool:
        """See :meth:`Store.is_baseline_complete`."""
        return await self.call(self.store.is_baseline_complete)

    async def mark_baseline_complete(self) -> None:
        """See :meth:`Store.mark_baseline_complete`."""
        await self.call(self.store.mark_baseline_complete)

    async def upsert_session(self, session: Session, *, baseline: bool) -> SessionRow:
        """See :meth:`Store.upsert_session`."""
        return await self.call(self.store.upsert_session, session, baseline=baseline)

    async def ingest_session_events(
        self, session_name: str, events: Sequence[Event], deliver: bool
    ) -> Ingested:
        """See :meth:`Store.ingest_session_events`."""
        return await self.call(self.store.ingest_session_events, session_name, events, deliver)

    async def schedule_poll(
        self,
        name: str,
        next_poll_at: float | None,
        *,
        polled_update_time: str | None = None,
        polled_at: float | None = None,
        poll_errors: int | None = None,
    ) -> None:
        """See :meth:`Store.schedule_poll`."""
        await self.call(
            self.store.schedule_poll,
            name,
            next_poll_at,
            polled_update_time=polled_update_time,
            polled_at=polled_at,
            poll_errors=poll_errors,
        )

    async def ingest_activities(
        self,
        session_name: str,
        activities: Sequence[Activity],
        events: Sequence[Event],
        deliver: bool,
    ) -> Ingested:
        """See :meth:`Store.ingest_activities`."""
        return await self.call(
            self.store.ingest_activities, session_name, activities, events, deliver
        )

    async def due_deliveries(
        self, now: float, limit: int, busy: Iterable[tuple[str, str]] = ()
    ) -> list[DueDelivery]:
        """See :meth:`Store.due_deliveries`."""
        return await self.call(self.store.due_deliveries, now, limit, set(busy))

    async def next_due_at(self) -> float | None:
        """See :meth:`Store.next_due_at`."""
        return await self.call(self.store.next_due_at)

    async def record_attempt(
        self, delivery_id: int, attempt: AttemptLike, decision: Decision
    ) -> float | None:
        """See :meth:`Store.record_attempt`."""
        return await self.call(self.store.record_attempt, delivery_id, attempt, decision)

    async def pending_count(self, endpoint: str | None = None) -> int:
        """See :meth:`Store.pending_count`."""
        return await self.call(self.store.pending_count, endpoint)

    async def outbox_stats(self) -> dict[str, tuple[int, float | None]]:
        """See :meth:`Store.outbox_stats`."""
        return await self.call(self.store.outbox_stats)

    async def status_summary(self, now: float) -> StatusSummary:
        """See :meth:`Store.status_summary`."""
        return await self.call(self.store.status_summary, now)

    async def record_upstream(self, label: str, status: int | None, at: float) -> None:
        """See :meth:`Store.record_upstream`."""
        await self.call(self.store.record_upstream, label, status, at)

    async def mark_poll(self, ok: bool, at: float) -> None:
        """See :meth:`Store.mark_poll`."""
        await self.call(self.store.mark_poll, ok, at)


# --------------------------------------------------------------------------- helpers


def _sql_fnmatch(pattern: str | None, value: str | None) -> int:
    return int(pattern is not None and value is not None and fnmatchcase(value, pattern))


def _where(*clauses: tuple[str, object | None]) -> tuple[str, list[object]]:
    used = [(sql, value) for sql, value in clauses if value is not None]
    if not used:
        return "", []
    return "WHERE " + " AND ".join(sql for sql, _ in used), [value for _, value in used]


def _event_row(r: Sequence[Any]) -> EventRow:
    return EventRow(
        seq=r[0],
        id=r[1],
        session_name=r[2],
        type=r[3],
        activity_name=r[4],
        occurred_at=r[5],
        occurred_ts=r[6],
        created_at=r[7],
        body=r[8].encode("utf-8"),
    )


def _newest(times: Iterable[str | None]) -> str | None:
    """The latest of upstream timestamps, compared as instants; unparsable ones are ignored."""
    best: tuple[datetime, str] | None = None
    for text in times:
        if not text:
            continue
        try:
            instant = parse_timestamp(text)
        except ValueError:
            continue
        if best is None or instant > best[0]:
            best = (instant, text)
    return None if best is None else best[1]


def _check_ours(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a SQLite file that holds tables but is not a sessionhook database."""
    tables = {
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    }
    if not tables:
        return
    ours = (
        Migrations.migrations_table in tables
        and conn.execute(
            f"SELECT 1 FROM {Migrations.migrations_table} WHERE migration_set = ? LIMIT 1",
            (MIGRATIONS.name,),
        ).fetchone()
    )
    if not ours:
        raise StoreError(f"{path} is not a sessionhook database", path=path)


def _migrate(conn: sqlite3.Connection, db: Database, path: Path) -> None:
    """Apply pending migrations: each with its bookkeeping row, all under one write lock so
    that two processes starting together cannot both migrate."""
    pending, unknown = _schema_state(db)
    if unknown:
        raise StoreError(
            f"{path} was written by a newer sessionhook (migration {unknown[0]})", path=path
        )
    if not pending:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Inside our transaction sqlite-utils runs each migration in a savepoint with its
        # bookkeeping row, and re-reads what is pending under the lock.
        MIGRATIONS.apply(db)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
