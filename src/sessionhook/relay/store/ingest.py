"""The ingest queries of the :class:`~.core.StoreCore`: archiving activities and events in
one transaction per page, enqueueing their deliveries, the compressed bodies (references
cached per session, see :mod:`.codec`), and reading them back.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessionhook.api.models import Activity, Session, parse_timestamp

from ..domain.events import Event, matches, payload_matches
from . import codec
from .dialect import Connection
from .rows import Ingested, SessionRow, StoreError

#: Reference bodies kept decoded in memory (one per recently active session).
_REF_CACHE = 512


class IngestQueries:
    """Mixed into :class:`~.core.StoreCore`, which provides what is declared below."""

    if TYPE_CHECKING:
        _conn: Connection
        _clock: Callable[[], float]
        path: Path | None
        _refs: dict[int, bytes]
        _session_refs: dict[str, tuple[int, bytes]]
        _refs_lock: threading.Lock

        def _tx(self, serialized: bool = True) -> AbstractContextManager[Connection]: ...
        def _one(self, sql: str, params: Sequence[Any] = ()) -> Any: ...
        def _active_endpoints(
            self, account: str | None = None
        ) -> list[tuple[str, list[str], dict[str, list[str]]]]: ...
        def upsert_session(self, session: Session, *, baseline: bool) -> SessionRow: ...
        def set_session_account(self, name: str, account: str) -> None: ...

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
            row = c.execute(
                "SELECT account FROM sessions WHERE name = ?", (batch[0].session_name,)
            ).fetchone()
            account = None if row is None else row[0]
        endpoints = self._active_endpoints(account) if deliver else []
        known = {
            row[0]
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
            ref_id, stored = self._encode_body(c, event, context)
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
        c.executemany(
            "INSERT INTO deliveries (event_id, endpoint, session_name, status, "
            "next_attempt_at, created_at, updated_at) VALUES (?, ?, ?, 'pending', ?, ?, ?)",
            deliveries,
        )
        inserted = [event.type for event in fresh.values()]
        return tuple(inserted), len(deliveries)

    def _encode_body(
        self, c: Connection, event: Event, context: bytes
    ) -> tuple[int, bytes]:
        """(reference id, stored body): the body compressed against its session's current
        reference; a body that no longer shares enough with it becomes the new reference."""
        current = self._session_refs.get(event.session_name)
        if current is None:
            row = c.execute(
                "SELECT id, data FROM body_refs WHERE session_name = ? ORDER BY id DESC LIMIT 1",
                (event.session_name,),
            ).fetchone()
            if row is not None:
                current = (row[0], self._reference(row[0], row[1]))
        if current is not None:
            stored = codec.encode_body(event.body, current[1], context)
            if len(stored) <= codec.REF_THRESHOLD:
                return current[0], stored
        ref_id = int(
            c.execute(
                "INSERT INTO body_refs (session_name, data) VALUES (?, ?) RETURNING id",
                (event.session_name, codec.encode_body(event.body, b"", b"")),
            ).fetchall()[0][0]
        )
        with self._refs_lock:
            self._refs[ref_id] = event.body
        self._session_refs[event.session_name] = (ref_id, event.body)
        if len(self._session_refs) > _REF_CACHE:
            self._session_refs.pop(next(iter(self._session_refs)))
        return ref_id, codec.encode_body(event.body, event.body, context)

    def activity_raw(self, name: str) -> bytes | None:
        """The archived raw JSON of an activity, byte for byte as serialized at ingest."""
        row = self._conn.execute(
            "SELECT raw, create_time FROM activities WHERE name = ?", (name,)
        ).fetchone()
        return None if row is None else codec.decode_raw(row[0], _raw_hints(name, row[1]))

    def _reference(self, ref_id: int, data: bytes | None = None) -> bytes:
        """A reference body, decoded (cached: a session's events share one)."""
        body = self._refs.get(ref_id)
        if body is None:
            if data is None:
                data = self._one("SELECT data FROM body_refs WHERE id = ?", (ref_id,))
                if data is None:
                    raise StoreError(f"missing body reference {ref_id}", path=self.path)
            body = codec.decode_body(data, b"", b"")
            with self._refs_lock:  # readers in other threads fill it too (PostgreSQL)
                if len(self._refs) >= _REF_CACHE:
                    self._refs.pop(next(iter(self._refs)), None)
                self._refs[ref_id] = body
        return body

    def _decode_body(
        self,
        stored: str | bytes,
        ref_id: int | None,
        raw: str | bytes | None,
        name: str | None,
        created: str | None,
    ) -> bytes:
        """The exact bytes of a stored event body, given the row's ``body_ref`` and, for an
        activity event, its activity's stored ``raw``, ``name`` and ``create_time``."""
        if isinstance(stored, str):
            return stored.encode("utf-8")
        reference = self._reference(ref_id) if ref_id is not None else b""
        context = b""
        if codec.needs_context(stored):
            if raw is None:
                raise StoreError("an event body's activity is missing", path=self.path)
            context = codec.decode_raw(raw, _raw_hints(name or "", created or ""))
        return codec.decode_body(stored, reference, context)

    def ingest_session_events(
        self, session_name: str, events: Sequence[Event], deliver: bool
    ) -> Ingested:
        """Append session-level events (discovered, state changed, pull request) and, when
        ``deliver``, enqueue them for every active endpoint whose globs match. One
        transaction; events already archived (same id) are skipped. Returns what was new.
        """
        now = self._clock()
        with self._tx() as c:
            types, deliveries = self._insert_events(c, events, deliver, now)
            return Ingested(0, types, deliveries=deliveries)

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
        now = self._clock()
        with self._tx() as c:
            if not c.execute("SELECT 1 FROM sessions WHERE name = ?", (session_name,)).fetchone():
                raise StoreError(f"unknown session {session_name!r}", path=self.path)
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
                hints = _raw_hints(activity.name, activity.create_time)
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
            self._advance_cursor(c, session_name, times, cursor_limit)
            return Ingested(len(fresh), types, conflicts, deliveries)

    def _advance_cursor(
        self, c: Connection, session_name: str, times: Sequence[str], limit: str | None
    ) -> None:
        """Move the session's cursor to the newest of ``times`` not later than ``limit``."""
        cursor = self._one("SELECT activity_cursor FROM sessions WHERE name = ?", (session_name,))
        newest = _newest([cursor, *times], limit=limit)
        if newest is not None and newest != cursor:
            c.execute(
                "UPDATE sessions SET activity_cursor = ? WHERE name = ?", (newest, session_name)
            )

    def save_rendered(self, delivery_id: int, body: bytes, content_type: str) -> None:
        """Keep the bytes a delivery's first attempt sends (a format or a template made
        them); the first ones saved win, so every retry sends the same bytes."""
        with self._tx() as c:
            c.execute(
                "INSERT INTO rendered_bodies (delivery_id, content_type, body) "
                "VALUES (?, ?, ?) ON CONFLICT (delivery_id) DO NOTHING",
                (delivery_id, content_type, body),
            )

    def rendered_body(self, delivery_id: int) -> tuple[bytes, str] | None:
        """``(body, content_type)`` saved by :meth:`save_rendered`, or ``None``."""
        row = self._conn.execute(
            "SELECT body, content_type FROM rendered_bodies WHERE delivery_id = ?",
            (delivery_id,),
        ).fetchone()
        return None if row is None else (bytes(row[0]), row[1])

    def latest_activity(self, session_name: str, member: str) -> Activity | None:
        """The newest archived activity of ``session_name`` whose event member is ``member``
        (by ``createTime`` as an instant; the last archived wins a tie), or ``None``."""
        # Times only (cheap), then the one raw activity chosen. The session's activities
        # are a range of the primary key (``<session>/activities/...``; '0' follows '/'),
        # or, named otherwise, found by ``session_ref`` (see codec.session_ref).
        rows = self._conn.execute(
            "SELECT rowid, create_time FROM activities "
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
        for rowid, create_time in rows:
            try:
                moment = parse_timestamp(create_time).timestamp()
            except ValueError:
                moment = 0.0
            if best is None or moment >= best[0]:
                best = (moment, rowid)
        if best is None:
            return None
        raw, name, created = self._conn.execute(
            "SELECT raw, name, create_time FROM activities WHERE rowid = ?", (best[1],)
        ).fetchone()
        return Activity.model_validate_json(codec.decode_raw(raw, _raw_hints(name, created)))


def _raw_hints(name: str, create_time: str) -> bytes:
    """What an activity's compressed raw JSON is coded against (its own columns)."""
    return (name + create_time).encode("utf-8")

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
