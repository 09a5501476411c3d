"""The console role: the web console's queries (read only, every one bounded).

Written once in the SQL that SQLite and PostgreSQL share (``?`` placeholders, no custom
functions): the console runs on either backend. Every list takes a ``limit`` (the pages
ask for a few hundred rows at most); lists of ids become ``IN (?, ?, ...)`` with one
placeholder per id, at most :data:`MAX_IDS` of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..domain.rows import AttemptRow, DeliveryRow, EventRow, from_row
from .bodies import Bodies
from .dialect import Database
from .ingest import get_session
from .log_rows import (
    EVENT_COLUMNS,
    EVENT_FROM,
    event_row,
    find_attempts,
    find_deliveries,
    where,
)
from .policy import call

#: Ids in one ``IN (...)`` list (a timeline page, the deliveries of a page of events).
MAX_IDS: Final = 500


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """A line of the console's session list."""

    name: str
    title: str
    state: str
    source: str
    account: str
    update_time: str
    events: int
    last_event_seq: int | None
    last_event_type: str | None
    last_event_at: str | None


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """What the console's live view shows of a newly ingested event (no body), with what
    a new row of the session list shows of its session."""

    seq: int
    id: str
    session_name: str
    type: str
    occurred_at: str
    title: str = ""
    state: str = ""
    source: str = ""
    account: str = ""


@dataclass(frozen=True, slots=True)
class ConsoleEvent:
    """A line of the console's event list (no body): the event and how many of its
    deliveries are in each status."""

    seq: int
    id: str
    session_name: str
    type: str
    occurred_at: str
    statuses: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class MinuteCounts:
    """Attempts that started in one minute: ``ok`` got a 2xx, ``failed`` did not."""

    minute: int  # index of the minute from the start of the window (0-based)
    ok: int
    failed: int


def _ids(values: Sequence[Any]) -> str:
    if not values or len(values) > MAX_IDS:
        raise ValueError(f"between 1 and {MAX_IDS} ids, got {len(values)}")
    return ", ".join("?" * len(values))


def _like(text: str) -> str:
    """``text`` as a LIKE pattern matching it anywhere, its wildcards escaped (``\\``)."""
    escaped = text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class ConsoleQueries:
    """The console role over one database: the lists and counts the pages of
    :mod:`sessionhook.relay.web.console` read (on a read-only store too); what they share
    with the operator (a session, the endpoints, the status, a delivery and its attempts,
    an event) they read from :class:`~.ops_queries.OperatorQueries` and
    :class:`~.endpoints.EndpointQueries`."""

    def __init__(self, db: Database, bodies: Bodies) -> None:
        self._db = db
        self._bodies = bodies

    # ----------------------------------------------------------------- sessions

    @call
    def console_sessions(
        self,
        *,
        state: str | None = None,
        account: str | None = None,
        text: str | None = None,
        limit: int = 200,
    ) -> list[ConsoleSession]:
        """Sessions, the most recently active first (by their last event), filtered by
        state, account, and ``text`` found in the title or name (case-insensitive)."""
        chosen, params = where(
            ("s.state = ?", state or None),
            ("s.account = ?", account or None),
            (
                "(LOWER(s.title) LIKE ? ESCAPE '\\' OR LOWER(s.name) LIKE ? ESCAPE '\\')",
                _like(text) if text else None,
            ),
        )
        limit = min(limit, MAX_IDS)
        # The newest event of each session is one probe of events_by_session; the count
        # and the last event's type are read for the page's sessions only.
        rows = self._db.conn.execute(
            "SELECT name, title, state, source, account, update_time, last_seq AS last_event_seq "
            "FROM ("
            "SELECT s.name, s.title, s.state, s.source, s.account, s.update_time, "
            "(SELECT MAX(e.seq) FROM events e WHERE e.session_name = s.name) AS last_seq "
            f"FROM sessions s {chosen}) x ORDER BY COALESCE(x.last_seq, 0) DESC, x.name LIMIT ?",
            (*params, limit),
        ).fetchall()
        names = [r["name"] for r in rows]
        counts: dict[str, int] = {}
        last: dict[int, Any] = {}
        if names:
            counts = {
                r["session_name"]: int(r["n"])
                for r in self._db.conn.execute(
                    "SELECT session_name, COUNT(*) AS n FROM events "
                    f"WHERE session_name IN ({_ids(names)}) GROUP BY session_name",
                    tuple(names),
                )
            }
            seqs = [r["last_event_seq"] for r in rows if r["last_event_seq"] is not None]
            if seqs:
                last = {
                    int(r["seq"]): r
                    for r in self._db.conn.execute(
                        f"SELECT seq, type, occurred_at FROM events WHERE seq IN ({_ids(seqs)})",
                        tuple(seqs),
                    )
                }
        sessions = []
        for r in rows:
            newest = last.get(r["last_event_seq"])
            sessions.append(
                from_row(
                    ConsoleSession,
                    r,
                    events=counts.get(r["name"], 0),
                    last_event_type=None if newest is None else newest["type"],
                    last_event_at=None if newest is None else newest["occurred_at"],
                )
            )
        return sessions

    @call
    def console_session_facets(self) -> tuple[list[str], list[str]]:
        """The distinct session states and accounts (the list's filter choices)."""
        conn = self._db.conn
        states = [r["state"] for r in conn.execute("SELECT DISTINCT state FROM sessions")]
        accounts = [r["account"] for r in conn.execute("SELECT DISTINCT account FROM sessions")]
        return sorted(s for s in states if s), sorted(a for a in accounts if a)

    @call
    def console_timeline(
        self, session: str, *, after_seq: int = 0, limit: int = 200
    ) -> list[EventRow]:
        """A session's events in time order (when they happened upstream, then archive
        order), those after the event ``after_seq`` (0: from the start), ``limit`` at most.

        The archive order is not the time order: a backfill, a late page or a baseline
        archives older activities after newer ones."""
        start = self._db.conn.execute(
            "SELECT occurred_ts FROM events WHERE seq = ? AND session_name = ?",
            (after_seq, session),
        ).fetchone()
        later, params = "", []
        if start is not None:
            later = "AND (e.occurred_ts > ? OR (e.occurred_ts = ? AND e.seq > ?)) "
            params = [start["occurred_ts"], start["occurred_ts"], after_seq]
        rows = self._db.conn.execute(
            f"SELECT {EVENT_COLUMNS} {EVENT_FROM} WHERE e.session_name = ? {later}"
            "ORDER BY e.occurred_ts, e.seq LIMIT ?",
            (session, *params, limit),
        ).fetchall()
        return [event_row(self._bodies, r) for r in rows]

    @call
    def console_events(
        self,
        *,
        session: str | None = None,
        event_id: str | None = None,
        event_type: str | None = None,
        status: str | None = None,
        before_seq: int | None = None,
        limit: int = 100,
    ) -> list[ConsoleEvent]:
        """Events, newest archived first, filtered by session, id, type, and ``status``
        (having a delivery in that status); ``before_seq`` pages further back."""
        text, params = where(
            ("e.session_name = ?", session),
            ("e.id = ?", event_id),
            ("e.type = ?", event_type),
            (
                "EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id AND d.status = ?)",
                status,
            ),
            ("e.seq < ?", before_seq),
        )
        rows = self._db.conn.execute(
            f"SELECT e.seq, e.id, e.session_name, e.type, e.occurred_at FROM events e {text} "
            "ORDER BY e.seq DESC LIMIT ?",
            (*params, min(limit, MAX_IDS)),
        ).fetchall()
        counts: dict[str, list[tuple[str, int]]] = {}
        if rows:
            for c in self._db.conn.execute(
                "SELECT event_id, status, COUNT(*) AS n FROM deliveries "
                f"WHERE event_id IN ({_ids(rows)}) GROUP BY event_id, status ORDER BY status",
                tuple(r["id"] for r in rows),
            ):
                counts.setdefault(c["event_id"], []).append((c["status"], int(c["n"])))
        return [from_row(ConsoleEvent, r, statuses=tuple(counts.get(r["id"], ()))) for r in rows]

    @call
    def find_session(self, text: str) -> str | None:
        """The archived session ``text`` names (``sessions/ID`` or the bare ``ID``)."""
        for name in (text, f"sessions/{text}"):
            if get_session(self._db.conn, name) is not None:
                return name
        return None

    # ----------------------------------------------------------------- deliveries

    @call
    def deliveries_of_events(self, event_ids: Sequence[str]) -> list[DeliveryRow]:
        """Every delivery of these events (at most :data:`MAX_IDS`), oldest first."""
        if not event_ids:
            return []
        return find_deliveries(self._db.conn, f"d.event_id IN ({_ids(event_ids)})", event_ids)

    @call
    def attempts_of_deliveries(self, delivery_ids: Sequence[int]) -> list[AttemptRow]:
        """Every logged attempt of these deliveries (at most :data:`MAX_IDS`), in order."""
        if not delivery_ids:
            return []
        return find_attempts(self._db.conn, f"delivery_id IN ({_ids(delivery_ids)})", delivery_ids)

    @call
    def get_attempt(self, attempt_id: int) -> AttemptRow | None:
        """One logged attempt, or ``None``."""
        found = find_attempts(self._db.conn, "id = ?", (attempt_id,))
        return found[0] if found else None

    # ----------------------------------------------------------------- overview

    @call
    def attempts_per_minute(self, since: int, minutes: int) -> list[MinuteCounts]:
        """Attempts per minute from ``since`` (whole Unix seconds) for ``minutes`` minutes,
        split into 2xx and the rest; minutes without attempts are left out.

        The minute index is computed on whole seconds (integer arithmetic is the same on
        both backends; a float's CAST rounds on PostgreSQL and truncates on SQLite, which
        can move an attempt by one second, never by a minute's worth).
        """
        until = since + 60 * minutes
        rows = self._db.conn.execute(
            "SELECT (CAST(started_at AS BIGINT) - ?) / 60 AS m, "
            "SUM(CASE WHEN status_code BETWEEN 200 AND 299 THEN 1 ELSE 0 END) AS ok, "
            "SUM(CASE WHEN status_code BETWEEN 200 AND 299 THEN 0 ELSE 1 END) AS failed "
            "FROM attempts WHERE started_at >= ? AND started_at < ? GROUP BY m ORDER BY m",
            (since, since, until),
        ).fetchall()
        return [
            MinuteCounts(int(r["m"]), int(r["ok"]), int(r["failed"]))
            for r in rows
            if 0 <= int(r["m"]) < minutes
        ]

    @call
    def budget_used(self, since: float) -> dict[str, int]:
        """Upstream request grants taken since ``since``, per budget (an account's name)."""
        rows = self._db.conn.execute(
            "SELECT budget, COUNT(*) AS n FROM request_budget WHERE at > ? GROUP BY budget",
            (since,),
        ).fetchall()
        return {str(r["budget"]): int(r["n"]) for r in rows}

    # ----------------------------------------------------------------- live

    @call
    def console_events_after(
        self, seq: int, *, session: str | None = None, limit: int = 100
    ) -> list[LiveEvent]:
        """Events ingested after ``seq`` (optionally of one session), oldest first, without
        their bodies (the live view shows type, session and time), with their session's
        title, state, source and account (a new row of the session list)."""
        text, params = where(("e.seq > ?", seq), ("e.session_name = ?", session))
        rows = self._db.conn.execute(
            "SELECT e.seq, e.id, e.session_name, e.type, e.occurred_at, "
            "COALESCE(s.title, '') AS title, COALESCE(s.state, '') AS state, "
            "COALESCE(s.source, '') AS source, COALESCE(s.account, '') AS account FROM events e "
            f"LEFT JOIN sessions s ON s.name = e.session_name {text} ORDER BY e.seq LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [from_row(LiveEvent, r) for r in rows]
