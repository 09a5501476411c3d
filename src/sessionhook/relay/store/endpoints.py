"""The ``endpoints`` table: every webhook URL and its run-time state (enabled, disabled and
why, failing since, last success and error).

An endpoint is defined in one of two places (``source``): the config file (the row holds
its state; :meth:`EndpointQueries.sync_endpoints` makes the rows match the file), or the
store itself, created through the management API (the row holds its definition and its
signing secrets too: every replica of a PostgreSQL store signs with them). A name is
unique across both. Every change of a definition takes the next ``revision`` (one sequence
over all rows, indexed; writers take it one after the other, so revisions are committed in
order) and wakes every replica (:meth:`~.dialect.Database.notify_outbox`), whose
dispatcher sees the newer revision with its next round and reads only the definitions
changed since the one it holds (:meth:`EndpointQueries.endpoint_changes`). At most
``limit`` live endpoints created through the API may be held
(:meth:`~EndpointQueries.create_endpoint`; their number is kept in ``meta``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from ..domain.rows import (
    EndpointChanges,
    EndpointLike,
    EndpointSpec,
    EndpointState,
    StoredEndpoint,
    from_row,
)
from .dialect import Connection, Database, batches, first_value, queue_keys, refuse_readonly
from .errors import EndpointConflictError, EndpointLimitError, StoreError
from .policy import call, write

#: An endpoint deliveries go to now: enabled and configured (an endpoint removed from the
#: config file, or deleted through the API, keeps its row, not configured).
ACTIVE = "enabled = 1 AND configured = 1"

#: The row of a live endpoint created through the API.
_LIVE_API = "source = 'api' AND deleted_at IS NULL"


class EndpointQueries:
    """The endpoints role over one database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @call
    def sync_endpoints(self, endpoints: Iterable[EndpointLike]) -> None:
        """Make the config file's rows match the config: upsert url and globs, keep the
        run-time enabled state; endpoints missing from the config stay (history) but become
        inactive. Endpoints created through the API are left alone; a config endpoint named
        like one of them is an :class:`EndpointConflictError` (nothing is changed).
        """
        now = self._db.clock()
        endpoints = list(endpoints)
        with self._db.tx() as c:
            names = []
            taken = {
                str(row["name"])
                for row in c.execute(f"SELECT name FROM endpoints WHERE {_LIVE_API}")
            }
            clash = sorted(taken & {ep.name for ep in endpoints})
            if clash:
                raise EndpointConflictError(
                    f"endpoint {clash[0]!r} of the config file was created through the API "
                    f"too: rename one (or `sessionhook endpoints delete {clash[0]}`)",
                    path=self._db.path,
                )
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
                    "accounts = excluded.accounts, source = 'config', spec = NULL, "
                    "secret = NULL, previous_secret = NULL, previous_until = NULL, "
                    "deleted_at = NULL, description = ''",
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
                "WHERE source = 'config' AND name NOT IN (SELECT value FROM json_each(?))",
                (json.dumps(names),),
            )

    @write
    def set_endpoint_enabled(self, name: str, enabled: bool, reason: str | None = None) -> None:
        """Enable (clearing the reason and the failing clock) or disable an endpoint.

        Deliveries left pending while it was disabled are sent once it is enabled again.
        """
        now = self._db.clock()
        with self._db.tx() as c:
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
                raise StoreError(f"unknown endpoint {name!r}", path=self._db.path)

    @call
    def endpoint_states(self) -> list[EndpointState]:
        """Every endpoint the store knows, by name (not those deleted through the API)."""
        rows = self._db.conn.execute(
            f"SELECT {_STATE} FROM endpoints WHERE deleted_at IS NULL ORDER BY name"
        ).fetchall()
        return [_state(r) for r in rows]

    @call
    def endpoint_state(self, name: str) -> EndpointState | None:
        """The endpoint ``name`` (``None``: none, or one deleted through the API)."""
        row = self._db.conn.execute(
            f"SELECT {_STATE} FROM endpoints WHERE name = ? AND deleted_at IS NULL", (name,)
        ).fetchone()
        return None if row is None else _state(row)

    # ------------------------------------------------------------ created through the API

    @call
    def create_endpoint(self, spec: EndpointSpec, secret: str, limit: int | None = None) -> None:
        """Create the endpoint ``spec`` describes, signing with ``secret``, enabled. A name
        an endpoint has (in the config file, created through the API, or kept for the
        history of one the file no longer has) is an :class:`EndpointConflictError`; the
        name of one deleted through the API is taken again (its history stays). With
        ``limit``: an :class:`EndpointLimitError` when that many live endpoints created
        through the API are held already (their count read in the same transaction)."""
        now = self._db.clock()
        with self._db.tx() as c:
            held = _live_count(c)
            if limit is not None and held >= limit:
                raise EndpointLimitError(limit, held, path=self._db.path)
            row = c.execute(
                "SELECT source, deleted_at, configured FROM endpoints WHERE name = ?",
                (spec.name,),
            ).fetchone()
            if row is not None and (row["source"] != "api" or row["deleted_at"] is None):
                where = (
                    "created through the API"
                    if row["source"] == "api"
                    else "in the config file"
                    if row["configured"]
                    else "once in the config file: its history is kept under that name"
                )
                raise EndpointConflictError(
                    f"an endpoint named {spec.name!r} exists ({where})", path=self._db.path
                )
            values = (*_spec_values(spec), secret, _next_revision(c), now)
            if row is None:
                c.execute(
                    "INSERT INTO endpoints (url, events, filter, accounts, spec, description, "
                    "secret, revision, updated_at, name, source, configured, enabled, "
                    "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'api', 1, 1, ?)",
                    (*values, spec.name, now),
                )
            else:  # deleted through the API: a new endpoint under the old name
                c.execute(
                    "UPDATE endpoints SET url = ?, events = ?, filter = ?, accounts = ?, "
                    "spec = ?, description = ?, secret = ?, revision = ?, updated_at = ?, "
                    "created_at = ?, configured = 1, enabled = 1, deleted_at = NULL, "
                    "previous_secret = NULL, previous_until = NULL, disabled_reason = NULL, "
                    "disabled_at = NULL, failing_since = NULL, last_error = NULL, "
                    "last_error_at = NULL, last_success_at = NULL WHERE name = ?",
                    (*values, now, spec.name),
                )
            _set_live_count(c, held + 1)
            self._db.notify_outbox(c)

    @call
    def update_endpoint(self, spec: EndpointSpec) -> None:
        """Replace the definition of the endpoint created through the API ``spec.name``
        (its secrets and run-time state stay)."""
        now = self._db.clock()
        with self._db.tx() as c:
            cur = c.execute(
                "UPDATE endpoints SET url = ?, events = ?, filter = ?, accounts = ?, spec = ?, "
                f"description = ?, revision = ?, updated_at = ? WHERE name = ? AND {_LIVE_API}",
                (*_spec_values(spec), _next_revision(c), now, spec.name),
            )
            self._unknown_unless(cur.rowcount, spec.name)
            self._db.notify_outbox(c)

    @call
    def rotate_endpoint_secret(self, name: str, secret: str, previous_until: float) -> None:
        """Sign with ``secret`` from now on, and with the secret it replaces as well until
        ``previous_until`` (the overlap; a rotation within it ends the earlier overlap)."""
        now = self._db.clock()
        with self._db.tx() as c:
            cur = c.execute(
                "UPDATE endpoints SET previous_secret = secret, previous_until = ?, "
                f"secret = ?, revision = ?, updated_at = ? WHERE name = ? AND {_LIVE_API}",
                (previous_until, secret, _next_revision(c), now, name),
            )
            self._unknown_unless(cur.rowcount, name)
            self._db.notify_outbox(c)

    @call
    def delete_endpoint(self, name: str, reason: str) -> int:
        """Delete the endpoint created through the API ``name``: its secrets are erased,
        its open deliveries become ``dead`` with ``reason`` (nothing more is sent to it);
        the row stays for the history of its deliveries. Returns how many were open.

        The deliveries first, a transaction per :data:`~.dialect.QUEUES_PER_TX` queues,
        then those queued meanwhile with the endpoint's row: a recorded attempt locks its
        queues, then its rows, then the endpoint's row; the same order here (no deadlock on
        PostgreSQL). A name that is not one of the API's changes nothing."""
        refuse_readonly(self._db)
        now = self._db.clock()
        if (
            first_value(
                self._db.conn, f"SELECT 1 FROM endpoints WHERE name = ? AND {_LIVE_API}", (name,)
            )
            is None
        ):
            self._unknown_unless(0, name)
        queues = self._db.conn.execute(
            "SELECT DISTINCT session_name FROM deliveries "
            "WHERE endpoint = ? AND status IN ('pending', 'failed')",
            (name,),
        ).fetchall()
        closed = 0
        for batch in batches(sorted(str(r["session_name"]) for r in queues)):
            with self._db.tx() as c:
                self._db.lock_queue_keys(c, [(name, session) for session in batch])
                closed += self._close_open(
                    c,
                    name,
                    reason,
                    now,
                    f"AND session_name IN ({', '.join('?' * len(batch))})",
                    batch,
                )
        with self._db.tx() as c:
            open_rows = (
                "FROM deliveries e WHERE e.endpoint = ? AND e.status IN ('pending', 'failed')"
            )
            self._db.lock_queue_keys(c, queue_keys(c, name, open_rows, (name,)))
            closed += self._close_open(c, name, reason, now)
            cur = c.execute(
                "UPDATE endpoints SET configured = 0, deleted_at = ?, secret = NULL, "
                "previous_secret = NULL, previous_until = NULL, revision = ?, updated_at = ? "
                f"WHERE name = ? AND {_LIVE_API}",
                (now, _next_revision(c), now, name),
            )
            self._unknown_unless(cur.rowcount, name)
            _set_live_count(c, _live_count(c) - 1)
            self._db.notify_outbox(c)
        return closed

    @staticmethod
    def _close_open(
        c: Connection,
        name: str,
        reason: str,
        now: float,
        where: str = "",
        params: Sequence[str] = (),
    ) -> int:
        """Make the open deliveries to ``name`` (and ``where``) dead with ``reason``."""
        cur = c.execute(
            "UPDATE deliveries SET status = 'dead', next_attempt_at = NULL, "
            "last_error = ?, updated_at = ? "
            f"WHERE endpoint = ? AND status IN ('pending', 'failed') {where}",
            (reason, now, name, *params),
        )
        return int(cur.rowcount)

    @call
    def stored_endpoints(self) -> list[StoredEndpoint]:
        """Every live endpoint created through the API, with its secrets, by name."""
        rows = self._db.conn.execute(
            f"SELECT {_STORED} FROM endpoints WHERE {_LIVE_API} ORDER BY name"
        ).fetchall()
        return [_stored(r) for r in rows]

    @call
    def endpoint_changes(self, since: int) -> EndpointChanges:
        """The endpoints created through the API whose definition changed after revision
        ``since`` (read by the revision's index), live or deleted; ``since`` 0: every live
        one."""
        deleted = "" if since else " AND deleted_at IS NULL"
        rows = self._db.conn.execute(
            f"SELECT {_STORED}, deleted_at FROM endpoints "
            f"WHERE revision > ? AND source = 'api'{deleted} ORDER BY revision",
            (since,),
        ).fetchall()
        return EndpointChanges(
            live=[_stored(r) for r in rows if r["deleted_at"] is None],
            gone=[str(r["name"]) for r in rows if r["deleted_at"] is not None],
            revision=max((int(r["revision"]) for r in rows), default=since),
        )

    @call
    def stored_endpoint(self, name: str) -> StoredEndpoint | None:
        """The live endpoint created through the API ``name``, with its secrets."""
        row = self._db.conn.execute(
            f"SELECT {_STORED} FROM endpoints WHERE name = ? AND {_LIVE_API}",
            (name,),
        ).fetchone()
        return None if row is None else _stored(row)

    def _unknown_unless(self, rowcount: int, name: str) -> None:
        if rowcount == 0:
            raise StoreError(
                f"no endpoint created through the API named {name!r}", path=self._db.path
            )

    @call
    def subscribers(
        self, account: str | None = None
    ) -> list[tuple[str, list[str], dict[str, list[str]]]]:
        """The active endpoints an event goes to: name, globs, payload conditions; with
        ``account``, only those taking that account's events (``endpoints[].accounts``).
        The ingest's read (not a role method)."""
        rows = self._db.conn.execute(
            f"SELECT name, events, filter, accounts FROM endpoints WHERE {ACTIVE} ORDER BY name"
        ).fetchall()
        return [
            (r["name"], json.loads(r["events"]), json.loads(r["filter"]))
            for r in rows
            if r["accounts"] is None or account is None or account in json.loads(r["accounts"])
        ]


#: The ``meta`` key that counts the live endpoints created through the API: kept by
#: create and delete in their transactions, so that a create's limit is checked without
#: counting the rows (one row read, however many endpoints there are).
_LIVE_COUNT = "api_endpoints"


def _live_count(c: Connection) -> int:
    """The live endpoints created through the API (counted once, by a store that never
    kept the count: one written by a version before it)."""
    value = first_value(c, "SELECT value FROM meta WHERE key = ?", (_LIVE_COUNT,))
    if value is None:
        value = first_value(c, f"SELECT COUNT(*) FROM endpoints WHERE {_LIVE_API}")
        c.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (_LIVE_COUNT, str(value)))
    return int(value)


def _set_live_count(c: Connection, count: int) -> None:
    c.execute("UPDATE meta SET value = ? WHERE key = ?", (str(count), _LIVE_COUNT))


def _next_revision(c: Connection) -> int:
    """The next revision of a definition (one sequence over all rows: a name deleted and
    created again never gets a revision it had)."""
    return int(first_value(c, "SELECT COALESCE(MAX(revision), 0) + 1 FROM endpoints"))


def _spec_values(spec: EndpointSpec) -> tuple[Any, ...]:
    """url, events, filter, accounts, spec, description: the columns of a definition."""
    return (
        spec.url,
        json.dumps(list(spec.events)),
        json.dumps({k: list(v) for k, v in spec.filter.items()}),
        None if spec.accounts is None else json.dumps(list(spec.accounts)),
        json.dumps(dict(spec.spec), sort_keys=True),
        spec.description,
    )


#: The columns of an :class:`EndpointState`.
_STATE = (
    "name, url, events, configured, enabled, disabled_reason, disabled_at, last_success_at, "
    "failing_since, last_error, last_error_at, created_at, source, description, updated_at"
)


def _state(r: Any) -> EndpointState:
    return from_row(
        EndpointState,
        r,
        events=tuple(json.loads(r["events"])),
        configured=bool(r["configured"]),
        enabled=bool(r["enabled"]),
    )


#: The columns of a :class:`StoredEndpoint`.
_STORED = "name, spec, description, secret, previous_secret, previous_until, revision, enabled"


def _stored(r: Any) -> StoredEndpoint:
    return from_row(
        StoredEndpoint,
        r,
        spec=json.loads(r["spec"]),
        revision=int(r["revision"]),
        enabled=bool(r["enabled"]),
    )
