"""The store's shared query core: every query the daemon runs, written once for both engines.

:class:`StoreCore` holds the daemon's queries (meta, endpoints, sessions, upstream counters)
and mixes in the ingest (:mod:`.ingest`), the operator's (:mod:`.ops_queries`), the
outbox's (:mod:`.outbox`), the economy's (:mod:`.economy_queries`) and the refusals'
(:mod:`.refusals`). The SQL is in the common subset of SQLite and PostgreSQL described in
:mod:`.dialect`. A backend subclass provides the connection and the transactions:

* :class:`~.sqlite.Store` (``store.path``): one SQLite file, its pragmas and durability;
* :class:`~.postgres.PostgresStore` (``store.url``): a PostgreSQL database through a pool.

``self._conn`` is what reads run on (autocommit statements: each sees committed data);
``self._tx()`` yields the connection of ONE write transaction, committed when the block
ends, rolled back whole when it raises (a backend maps "cannot write now" errors to
:class:`~.rows.StoreUnwritableError` / :class:`~.rows.StoreFullError`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Self

from sessionhook.api.models import Session

from .console_queries import ConsoleQueries
from .copying import CopyQueries
from .dialect import Connection
from .economy_queries import EconomyQueries
from .ingest import IngestQueries
from .leases import LeaseQueries
from .ops_queries import OperatorQueries
from .outbox import OutboxQueries
from .refusals import RefusalQueries
from .rows import (
    EndpointLike,
    EndpointState,
    SessionRow,
    StoreError,
    StoreUnwritableError,
)

#: Per-minute upstream counters older than this many minutes are pruned.
_UPSTREAM_KEEP_MINUTES = 2 * 24 * 60


class StoreCore(
    IngestQueries,
    OutboxQueries,
    OperatorQueries,
    EconomyQueries,
    RefusalQueries,
    ConsoleQueries,
    LeaseQueries,
    CopyQueries,
):
    """The queries of a store, whatever its engine (see the module docstring).

    ``clock`` (Unix seconds) stamps our own bookkeeping (``created_at``, ``first_seen_at``...);
    tests inject one. Times passed in (``now``, ``at``) are used as given. ``path`` is the
    SQLite file (``None`` on PostgreSQL); ``location`` names the store in messages (the file,
    or the database URL without its password).
    """

    #: ``"sqlite"`` or ``"postgresql"``.
    backend: str = ""
    #: How many threads may use the store at once (:class:`~.aio.AsyncStore`'s limiter):
    #: one on SQLite (one writer connection), the pool's size on PostgreSQL.
    concurrency: int = 1

    def __init__(
        self,
        conn: Connection,
        *,
        path: Path | None,
        location: str,
        readonly: bool,
        clock: Callable[[], float],
    ) -> None:
        self._conn = conn
        self.path = path
        self.location = location
        self.readonly = readonly
        self._clock = clock
        # Decoded reference bodies by id, and each session's current reference (see codec).
        self._refs: dict[int, bytes] = {}
        self._session_refs: dict[str, tuple[int, bytes]] = {}
        # ``_refs`` is filled by reads too, which run in several threads on PostgreSQL;
        # ``_session_refs`` only in write transactions, which are serialized.
        self._refs_lock = threading.Lock()

    def _forget_refs(self) -> None:
        """Drop the cached references: a rolled-back transaction may have created some."""
        with self._refs_lock:
            self._session_refs.clear()
            self._refs.clear()

    def _tx(  # pragma: no cover - abstract
        self, serialized: bool = True
    ) -> AbstractContextManager[Connection]:
        """One write transaction. ``serialized=False``: the block orders itself by row
        locks (conditional updates, ``FOR UPDATE``, the outbox heads' per-key lock), so on
        PostgreSQL it does not wait for the global write lock (SQLite has one writer)."""
        raise NotImplementedError

    def unwritable_error(self, exc: BaseException) -> StoreUnwritableError | None:
        """``exc`` (raised by the engine outside a write transaction) as the
        :class:`StoreUnwritableError` it means (no space, read-only, database unreachable),
        or ``None`` when it means something else."""
        return None

    def open_reader(self) -> StoreCore:  # pragma: no cover - abstract
        """A second, read-only handle on the same store (e.g. to read while writing)."""
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - abstract
        """Release the connection(s)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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
                # Payload conditions (EndpointConfig.filter); endpoints without are {}.
                conditions = {k: list(v) for k, v in (getattr(ep, "filter", None) or {}).items()}
                accounts = getattr(ep, "accounts", None)  # optional: every account
                c.execute(
                    "INSERT INTO endpoints (name, url, events, configured, enabled, created_at, "
                    "filter, accounts) VALUES (?, ?, ?, ?, 1, ?, ?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET url = excluded.url, "
                    "events = excluded.events, "
                    "configured = excluded.configured, filter = excluded.filter, "
                    "accounts = excluded.accounts",
                    (
                        ep.name,
                        ep.url,
                        json.dumps(list(ep.events)),
                        int(ep.enabled),
                        now,
                        json.dumps(conditions),
                        None if accounts is None else json.dumps(list(accounts)),
                    ),
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

    def _active_endpoints(
        self, account: str | None = None
    ) -> list[tuple[str, list[str], dict[str, list[str]]]]:
        """Active endpoints: name, globs, payload conditions; with ``account``, only those
        taking that account's events (``endpoints[].accounts``)."""
        rows = self._conn.execute(
            "SELECT name, events, filter, accounts FROM endpoints "
            "WHERE enabled = 1 AND configured = 1 ORDER BY name"
        ).fetchall()
        return [
            (name, json.loads(globs), json.loads(cond))
            for name, globs, cond, accounts in rows
            if accounts is None or account is None or account in json.loads(accounts)
        ]

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

    def finish_poll(
        self,
        name: str,
        fresh: Session | None,
        *,
        baseline: bool,
        next_poll_at: float | None,
        polled_update_time: str,
    ) -> None:
        """The end of a session's activity poll, in one call: the session read again after
        the walk (``fresh``, when it was) archived as :meth:`upsert_session` does, then the
        poll recorded and the next one scheduled as :meth:`schedule_poll` does. Each step
        commits as it does when called alone (the session's events were archived before);
        one hand-off to the store's thread instead of two."""
        if fresh is not None:
            self.upsert_session(fresh, baseline=baseline)
        self.schedule_poll(name, next_poll_at, polled_update_time=polled_update_time)

    # ----------------------------------------------------------------- upstream

    def record_upstream(self, label: str, status: int | str | None, at: float) -> None:
        """Count one upstream request in its minute bucket.

        ``status`` is the HTTP status, ``None`` for no answer (stored as -1) or
        ``"malformed"`` for a 2xx answer that did not parse (stored as -2).
        """
        self.record_upstream_counts({(label, status, int(at // 60)): 1})

    def record_upstream_counts(
        self, counts: Mapping[tuple[str, int | str | None, int], int]
    ) -> None:
        """Count many upstream requests at once: ``counts[(label, status, minute)]`` requests
        (``minute`` = Unix seconds // 60; ``status`` as in :meth:`record_upstream`). One
        transaction, the same rows as that many :meth:`record_upstream` calls."""
        if not counts:
            return
        with self._tx(serialized=False) as c:  # upserts and a prune: no read
            c.executemany(
                "INSERT INTO upstream_requests (minute, label, status, count) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (minute, label, status) "
                "DO UPDATE SET count = upstream_requests.count + excluded.count",
                [
                    (minute, label, _upstream_code(status), n)
                    for (label, status, minute), n in counts.items()
                ],
            )
            c.execute(
                "DELETE FROM upstream_requests WHERE minute < ?",
                (max(minute for _, _, minute in counts) - _UPSTREAM_KEEP_MINUTES,),
            )

    def mark_poll(self, ok: bool, at: float) -> None:
        """Record a discovery pass: when it ran and, if it succeeded, when it last did."""
        with self._tx(serialized=False) as c:  # upserts: no read
            keys = [("last_poll_at", at)] + ([("last_ok_poll_at", at)] if ok else [])
            for key, value in keys:
                c.execute(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (key, repr(value)),
                )


#: How ``upstream_requests.status`` stores what is not an HTTP status.
UPSTREAM_NO_ANSWER = -1
UPSTREAM_MALFORMED = -2


def _upstream_code(status: int | str | None) -> int:
    if status is None:
        return UPSTREAM_NO_ANSWER
    if isinstance(status, str):  # "malformed", the only non-HTTP outcome
        return UPSTREAM_MALFORMED
    return status
