"""The ingest role: the poller's archive. Sessions (their rows, poll schedule and cursor),
pages of activities and their events archived in one transaction per page, their deliveries
enqueued in the same transaction, and the archived activities read back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sessionhook.api.models import Activity, Session, parse_timestamp

from ..domain.events import Event, matches, payload_matches
from ..domain.rows import Ingested, SessionRow, from_row
from . import codec
from .bodies import Bodies, raw_hints
from .dialect import Connection, Database, first_value
from .endpoints import EndpointQueries
from .errors import StoreError
from .policy import call, read, write

_SESSION_COLUMNS = (
    "name, id, title, state, url, source, create_time, update_time, raw, first_seen_at, "
    "baseline, polled_update_time, activity_cursor, last_polled_at, next_poll_at, poll_errors"
)


def session_row(r: Any) -> SessionRow:
    """A ``sessions`` row (:data:`_SESSION_COLUMNS`) as a :class:`SessionRow`."""
    return from_row(SessionRow, r, raw=json.loads(r["raw"]), baseline=bool(r["baseline"]))


def get_session(conn: Connection, name: str) -> SessionRow | None:
    """The archived session ``name``, or ``None`` (shared by the roles that show one)."""
    row = conn.execute(
        f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE name = ?", (name,)
    ).fetchone()
    return None if row is None else session_row(row)


def list_sessions(conn: Connection, after: str | None, limit: int) -> list[SessionRow]:
    """Archived sessions in name order, after ``after`` (keyset paging), ``limit`` at most."""
    rows = conn.execute(
        f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE name > ? ORDER BY name LIMIT ?",
        (after or "", limit),
    ).fetchall()
    return [session_row(r) for r in rows]


def recent_sessions(
    conn: Connection,
    limit: int,
    *,
    states: Sequence[str] | None = None,
    other_than: Sequence[str] = (),
) -> list[SessionRow]:
    """Archived sessions, the latest upstream ``updateTime`` first, ``limit`` at most: those
    in ``states`` (when given) and in none of ``other_than``."""
    clauses: list[str] = []
    params: list[object] = []
    if states is not None:
        clauses.append(f"state IN ({', '.join('?' * len(states)) or 'NULL'})")
        params.extend(states)
    if other_than:
        clauses.append(f"state NOT IN ({', '.join('?' * len(other_than))})")
        params.extend(other_than)
    text = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    rows = conn.execute(
        f"SELECT {_SESSION_COLUMNS} FROM sessions {text}"
        "ORDER BY update_time DESC, name DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [session_row(r) for r in rows]


class Ingest:
    """The ingest role over one database: it encodes event
    bodies with ``bodies`` and enqueues deliveries for ``endpoints``' subscribers."""

    def __init__(self, db: Database, bodies: Bodies, endpoints: EndpointQueries) -> None:
        self._db = db
        self._bodies = bodies
        self._endpoints = endpoints

    @contextmanager
    def _archiving(self) -> Iterator[Connection]:
        """A write transaction that may create body references: if it does not commit,
        the references it cached must not be used again (the rows are gone)."""
        try:
            with self._db.tx() as c:
                yield c
        except BaseException:
            self._bodies.forget()
            raise

    # ----------------------------------------------------------------- sessions

    @read
    def get_session(self, name: str) -> SessionRow | None:
        """The archived session, or ``None``."""
        return get_session(self._db.conn, name)

    @write
    def upsert_session(self, session: Session, *, baseline: bool) -> SessionRow:
        """Archive a session (no events). A list item updates only the fields it carries: the
        stored JSON is merged (new keys win), and empty fields never erase known ones.
        ``baseline`` counts only when the session is new.
        """
        now = self._db.clock()
        wire = session.to_wire()
        with self._db.tx() as c:
            old = c.execute("SELECT raw FROM sessions WHERE name = ?", (session.name,)).fetchone()
            merged = {**json.loads(old["raw"]), **wire} if old else wire
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
            raise StoreError(f"session {session.name} vanished", path=self._db.path)
        return row

    @write
    def set_session_account(self, name: str, account: str) -> None:
        """Record which account lists the session (its events' ``data.account``, and the
        endpoints that take them)."""
        with self._db.tx() as c:
            c.execute("UPDATE sessions SET account = ? WHERE name = ?", (account, name))

    @read
    def session_account(self, name: str) -> str | None:
        """The account that lists the session (whose API key acts on it), or ``None`` for a
        session the archive does not know."""
        return _account(self._db.conn, name)

    @write
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
            polled_at = self._db.clock()
        with self._db.tx() as c:
            c.execute(
                "UPDATE sessions SET next_poll_at = ?, "
                "polled_update_time = COALESCE(?, polled_update_time), "
                "last_polled_at = COALESCE(?, last_polled_at), "
                "poll_errors = COALESCE(?, poll_errors) WHERE name = ?",
                (next_poll_at, polled_update_time, polled_at, poll_errors, name),
            )

    @write
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

    # ----------------------------------------------------------------- events

    def _insert_events(
        self,
        c: Connection,
        events: Iterable[Event],
        deliver: bool,
        now: float,
        raws: dict[str, bytes] | None = None,
    ) -> tuple[tuple[str, ...], int]:
        """Insert events (compressed, see :mod:`.codec`) and enqueue their deliveries; the
        types of the new events and how many deliveries were enqueued.

        ``raws``: the raw JSON of the activities archived in this transaction, by name (an
        activity event's body is compressed against it)."""
        batch = list(events)
        account = None
        if deliver and batch:  # endpoints may take the events of some accounts only
            account = _account(c, batch[0].session_name)
        endpoints = self._endpoints.subscribers(account) if deliver else []
        known = {
            row["id"]
            for row in c.execute(
                "SELECT id FROM events WHERE id IN (SELECT value FROM json_each(?))",
                (json.dumps([e.id for e in batch]),),
            )
        }
        fresh: dict[str, Event] = {}
        for event in batch:
            event.body.decode("utf-8")  # a body is JSON text: refuse anything else
            if event.id not in known and event.id not in fresh:
                fresh[event.id] = event  # an archived one: its deliveries were enqueued then
        rows = []
        for event in fresh.values():
            context = b""
            if raws is not None and event.activity_name is not None:
                context = raws.get(event.activity_name, b"")
            ref_id, stored = self._bodies.encode(c, event, context)
            rows.append(
                (
                    event.id,
                    event.session_name,
                    *codec.coded(codec.EVENT_TYPES, event.type),
                    *codec.split_activity_name(event.session_name, event.activity_name),
                    event.occurred_at,
                    event.occurred_ts,
                    now,
                    stored,
                    ref_id,
                )
            )
        c.executemany(
            # ``type`` and ``activity_name`` are derived from these (see codec.coded and
            # codec.split_activity_name).
            "INSERT INTO events (id, session_name, type_code, type_other, activity_id, "
            "activity_other, occurred_at, occurred_ts, created_at, body, body_ref) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        wanted: dict[tuple[str, str], bool] = {}
        deliveries = []
        for event in fresh.values():
            payload: object = None  # parsed once, only for an endpoint with conditions
            for endpoint, globs, conditions in endpoints:
                key = (endpoint, event.type)
                if key not in wanted:
                    wanted[key] = matches(globs, event.type)
                if not wanted[key]:
                    continue
                if conditions:
                    if payload is None:
                        payload = event.payload()
                    if not payload_matches(conditions, payload):
                        continue
                deliveries.append((event.id, endpoint, event.session_name, now, now, now))
        # Queue by queue in (endpoint, session) order, each queue's in event order: the
        # heads' trigger takes each queue's key as its first delivery is inserted, and a
        # replica recording attempts takes its keys in that order too (docs/replicas.md).
        deliveries.sort(key=lambda d: (d[1], d[2]))
        c.executemany(
            "INSERT INTO deliveries (event_id, endpoint, session_name, status, "
            "next_attempt_at, created_at, updated_at) VALUES (?, ?, ?, 'pending', ?, ?, ?)",
            deliveries,
        )
        inserted = [event.type for event in fresh.values()]
        return tuple(inserted), len(deliveries)

    @call
    def activity_raw(self, name: str) -> bytes | None:
        """The archived raw JSON of an activity, byte for byte as serialized at ingest."""
        row = self._db.conn.execute(
            "SELECT raw, create_time FROM activities WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            return None
        return codec.decode_raw(row["raw"], raw_hints(name, row["create_time"]))

    @write
    def ingest_session_events(
        self, session_name: str, events: Sequence[Event], deliver: bool
    ) -> Ingested:
        """Append session-level events (discovered, state changed, pull request) and, when
        ``deliver``, enqueue them for every active endpoint whose globs match. One
        transaction; events already archived (same id) are skipped. Returns what was new.
        """
        now = self._db.clock()
        with self._archiving() as c:
            types, deliveries = self._insert_events(c, events, deliver, now)
            return Ingested(0, types, deliveries=deliveries)

    @write
    def archive_discovered(
        self, session: Session, event: Event, *, baseline: bool, account: str | None = None
    ) -> Ingested:
        """A session seen for the first time, in one call: :meth:`upsert_session`, then
        :meth:`set_session_account` when ``account`` is given, then ``event`` (its
        ``session.discovered``) as :meth:`ingest_session_events` archives it, delivered
        unless ``baseline``. Each step commits as it does when called alone (a repeat after
        a failure is harmless: the upsert merges, the event's id is known); the poller
        makes one hand-off to the store's thread instead of two or three, on the path that
        paces a backfill (new sessions are announced one after the other)."""
        self.upsert_session(session, baseline=baseline)
        if account is not None:
            self.set_session_account(session.name, account)
        return self.ingest_session_events(session.name, [event], not baseline)

    @write
    def ingest_activities(
        self,
        session_name: str,
        activities: Sequence[Activity],
        events: Sequence[Event],
        deliver: bool,
        *,
        cursor_limit: str | None = None,
        raws: Sequence[bytes] | None = None,
    ) -> Ingested:
        """Archive a page of activities with their events, in ONE transaction.

        Activities already archived (by name) are skipped, and so are their events: they
        produce no delivery. A name archived under ANOTHER session is skipped too and
        reported in ``Ingested.conflicts``. New events get a delivery per active, matching
        endpoint when ``deliver``. The session's ``activity_cursor`` advances to the newest
        ``createTime`` of the page (compared as instants, never as strings) that is not
        later than ``cursor_limit`` (the upstream's clock: a time in the future must not
        carry the cursor past activities still to come). Returns how many activities were
        new and the types of the new events. If anything fails, nothing of the page is
        written. ``raws``: each activity's raw JSON as :func:`~..events.archived_page`
        made it along with the events (the same bytes this method would make; given, each
        activity is serialized once per ingest, not twice).
        """
        if raws is not None and len(raws) != len(activities):
            raise ValueError(f"{len(raws)} raw activities for {len(activities)} activities")
        now = self._db.clock()
        with self._archiving() as c:
            if not c.execute("SELECT 1 FROM sessions WHERE name = ?", (session_name,)).fetchone():
                raise StoreError(f"unknown session {session_name!r}", path=self._db.path)
            names = list(dict.fromkeys(a.name for a in activities))
            owners = dict(
                c.execute(
                    "SELECT name, session_name FROM activities "
                    "WHERE name IN (SELECT value FROM json_each(?))",
                    (json.dumps(names),),
                ).fetchall()
            )
            known = set(owners)
            conflicts = tuple(n for n, owner in owners.items() if owner != session_name)
            fresh: dict[str, Activity] = {}
            given: dict[str, bytes] = {}
            for i, activity in enumerate(activities):
                if activity.name not in known and activity.name not in fresh:
                    fresh[activity.name] = activity
                    if raws is not None:
                        given[activity.name] = raws[i]
            by_name: dict[str, bytes] = {}
            rows = []
            for activity in fresh.values():
                raw = given.get(activity.name)
                if raw is None:
                    raw = json.dumps(
                        activity.to_wire(), separators=(",", ":"), ensure_ascii=False
                    ).encode("utf-8")
                by_name[activity.name] = raw
                hints = raw_hints(activity.name, activity.create_time)
                rows.append(
                    (
                        activity.name,
                        codec.session_ref(activity.name, session_name),
                        activity.create_time,
                        *codec.coded(codec.KINDS, activity.event_member or "unknown"),
                        codec.encode_raw(raw, hints),
                        now,
                    )
                )
            # ``id`` is left empty: it is the last segment of ``name`` (and in ``raw``);
            # ``session_name`` is derived from ``name`` (``session_ref``), ``kind`` from
            # its code (see codec.py).
            c.executemany(
                "INSERT INTO activities (name, session_ref, create_time, kind_code, "
                "kind_other, raw, ingested_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            wanted = [e for e in events if e.activity_name is None or e.activity_name in fresh]
            types, deliveries = self._insert_events(c, wanted, deliver, now, by_name)
            times = [a.create_time for a in activities if a.name not in conflicts]
            advance_cursor(c, session_name, times, cursor_limit)
            return Ingested(len(fresh), types, conflicts, deliveries)

    @read
    def latest_activity(self, session_name: str, member: str) -> Activity | None:
        """The newest archived activity of ``session_name`` whose event member is ``member``
        (by ``createTime`` as an instant; the last archived wins a tie), or ``None``."""
        # Times only (cheap), then the one raw activity chosen. The session's activities
        # are a range of the primary key (``<session>/activities/...``; '0' follows '/'),
        # or, named otherwise, found by ``session_ref`` (see codec.session_ref).
        rows = self._db.conn.execute(
            "SELECT rowid AS position, create_time FROM activities "
            "WHERE ((name >= ? AND name < ?) OR session_ref = ?) "
            "AND session_name = ? AND kind = ? ORDER BY rowid",
            (
                session_name + "/activities/",
                session_name + "/activities0",
                session_name,
                session_name,
                member,
            ),
        ).fetchall()
        best: tuple[float, int] | None = None
        for r in rows:
            try:
                moment = parse_timestamp(r["create_time"]).timestamp()
            except ValueError:
                moment = 0.0
            if best is None or moment >= best[0]:
                best = (moment, r["position"])
        if best is None:
            return None
        row = self._db.conn.execute(
            "SELECT raw, name, create_time FROM activities WHERE rowid = ?", (best[1],)
        ).fetchone()
        raw = codec.decode_raw(row["raw"], raw_hints(row["name"], row["create_time"]))
        return Activity.model_validate_json(raw)


def _account(conn: Connection, name: str) -> str | None:
    value = first_value(conn, "SELECT account FROM sessions WHERE name = ?", (name,))
    return None if value is None else str(value)


def advance_cursor(
    c: Connection, session_name: str, times: Sequence[str], limit: str | None
) -> None:
    """In the write transaction ``c``: move the session's cursor to the newest of ``times``
    not later than ``limit`` (the ingest's, and a refusal's that lets polling go on)."""
    cursor = first_value(c, "SELECT activity_cursor FROM sessions WHERE name = ?", (session_name,))
    newest = _newest([cursor, *times], limit=limit)
    if newest is not None and newest != cursor:
        c.execute("UPDATE sessions SET activity_cursor = ? WHERE name = ?", (newest, session_name))


def _newest(times: Iterable[str | None], *, limit: str | None = None) -> str | None:
    """The latest of upstream timestamps, compared as instants; unparsable ones, and those
    later than ``limit``, are ignored."""
    best: tuple[datetime, str] | None = None
    bound = parse_timestamp(limit) if limit else None
    for text in times:
        if not text:
            continue
        try:
            instant = parse_timestamp(text)
        except ValueError:
            continue
        if bound is not None and instant > bound:
            continue
        if best is None or instant > best[0]:
            best = (instant, text)
    return None if best is None else best[1]
