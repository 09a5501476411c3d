"""The operator role: ``sessionhook status``, the delivery and attempt history, replay, and
the event archive. They work on a read-only connection too (except
:meth:`OperatorQueries.replay`), e.g. while the daemon runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import closing
from fnmatch import fnmatchcase

from ..domain.events import matches, payload_matches
from ..domain.rows import (
    AccountPoll,
    AttemptRow,
    DeliveryRow,
    EndpointState,
    EndpointSummary,
    EventRow,
    SessionRow,
    StatusSummary,
    UpstreamSummary,
    from_row,
)
from .bodies import BODY_COLUMNS, Bodies
from .dialect import Database, batches, first_value, refuse_readonly
from .endpoints import EndpointQueries
from .errors import StoreError
from .ingest import get_session, list_sessions, recent_sessions
from .log_rows import (
    DELIVERY_COLUMNS,
    EVENT_COLUMNS,
    EVENT_FROM,
    delivery_row,
    event_row,
    find_attempts,
    find_deliveries,
    where,
)
from .meta import MetaQueries
from .outbox import Outbox
from .policy import call, write
from .refusals import Refusals

_FETCH = 500
_HOUR = 3600.0
#: The last hour's upstream figures of ``status_summary`` (its query's columns).
_UPSTREAM_COUNTS = (
    "requests_last_hour",
    "throttled_last_hour",
    "errors_last_hour",
    "rejected_last_hour",
    "malformed_last_hour",
)


def _selection(
    since: float | None,
    until: float | None,
    event_ids: Sequence[str] | None,
    session: str | None,
) -> tuple[tuple[str, object | None], ...]:
    """The clauses of a replay's selection of events (``e``), for :func:`.log_rows.where`."""
    return (
        ("e.occurred_ts >= ?", since),
        ("e.occurred_ts < ?", until),
        (
            "e.id IN (SELECT value FROM json_each(?))",
            None if event_ids is None else json.dumps(list(event_ids)),
        ),
        ("e.session_name = ?", session),
    )


class OperatorQueries:
    """The operator role over one database; its status
    reads the other roles' figures (the outbox, the endpoints, the meta, the refusals)."""

    def __init__(
        self,
        db: Database,
        bodies: Bodies,
        *,
        endpoints: EndpointQueries,
        outbox: Outbox,
        meta: MetaQueries,
        refusals: Refusals,
    ) -> None:
        self._db = db
        self._bodies = bodies
        self._endpoints = endpoints
        self._outbox = outbox
        self._meta = meta
        self._refusals = refusals

    @call
    def status_summary(self, now: float) -> StatusSummary:
        """Figures for ``sessionhook status``: per endpoint and upstream, at ``now``."""
        hour_ago = now - _HOUR
        open_rows = self._outbox.outbox_stats()
        conn = self._db.conn
        final = {
            (r["endpoint"], r["status"]): r["n"]
            for r in conn.execute(
                "SELECT endpoint, status, COUNT(*) AS n FROM deliveries "
                # The predicate of the partial index deliveries_by_update, spelt alike.
                "WHERE (status = 'delivered' OR status = 'dead') AND updated_at >= ? "
                "GROUP BY endpoint, status",
                (hour_ago,),
            )
        }
        dead_total = {
            r["endpoint"]: r["n"]
            for r in conn.execute(
                "SELECT endpoint, COUNT(*) AS n FROM deliveries WHERE status = 'dead' "
                "GROUP BY endpoint"
            )
        }
        failed = {
            r["endpoint"]: r["n"]
            for r in conn.execute(
                "SELECT d.endpoint, COUNT(*) AS n FROM attempts a JOIN deliveries d "
                "ON d.id = a.delivery_id WHERE a.started_at >= ? "
                "AND (a.status_code IS NULL OR a.status_code NOT BETWEEN 200 AND 299) "
                "GROUP BY d.endpoint",
                (hour_ago,),
            )
        }
        summaries = []
        for st in self._endpoints.endpoint_states():
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
                    failing_since=self._failing_since(st),
                )
            )
        # status: the HTTP status, -1 no answer, -2 a malformed 2xx answer. An error is
        # anything but a 2xx and a 429 (throttling has its own figure).
        upstream = conn.execute(
            "SELECT COALESCE(SUM(count), 0) AS requests_last_hour, "
            "COALESCE(SUM(CASE WHEN status = 429 THEN count END), 0) AS throttled_last_hour, "
            "COALESCE(SUM(CASE WHEN status < 0 OR (status >= 300 AND status != 429) "
            "THEN count END), 0) AS errors_last_hour, "
            "COALESCE(SUM(CASE WHEN status IN (401, 403) THEN count END), 0) "
            "AS rejected_last_hour, "
            "COALESCE(SUM(CASE WHEN status = -2 THEN count END), 0) AS malformed_last_hour "
            "FROM upstream_requests WHERE minute >= ?",
            (int(hour_ago // 60),),
        ).fetchone()
        polls = conn.execute(
            "SELECT account, last_poll_at, last_ok_poll_at, list_cut FROM account_polls "
            "ORDER BY account"
        ).fetchall()
        return StatusSummary(
            now=now,
            endpoints=tuple(summaries),
            upstream=UpstreamSummary.of_accounts(
                [from_row(AccountPoll, p) for p in polls],
                **{name: int(upstream[name]) for name in _UPSTREAM_COUNTS},
            ),
            sessions=int(first_value(conn, "SELECT COUNT(*) FROM sessions")),
            activities=int(first_value(conn, "SELECT COUNT(*) FROM activities")),
            events=int(first_value(conn, "SELECT COUNT(*) FROM events")),
            baseline_complete=self._meta.is_baseline_complete(),
            refused=self._refusals.refused_summary(hour_ago),
        )

    def _failing_since(self, st: EndpointState) -> float | None:
        """When the endpoint's current run of failures began: its first failed attempt
        since its last success, or ``None`` when its latest answer was a success.

        The endpoint's own ``failing_since`` is the clock of its automatic disabling, which
        enabling it again restarts; a person asking how long the consumer has been down
        wants the run, which only a success ends."""
        if st.last_error_at is None or (
            st.last_success_at is not None and st.last_success_at >= st.last_error_at
        ):
            return st.failing_since
        # The first attempt since the last success is a failure (a success would have moved
        # last_success_at): one probe of attempts_by_time, stopped at the first row.
        row = self._db.conn.execute(
            "SELECT a.started_at FROM attempts a JOIN deliveries d ON d.id = a.delivery_id "
            "WHERE a.started_at > ? AND d.endpoint = ? ORDER BY a.started_at LIMIT 1",
            (st.last_success_at if st.last_success_at is not None else 0.0, st.name),
        ).fetchone()
        # Pruned attempts (the delivery log's retention) leave the stored clock.
        first = None if row is None else row["started_at"]
        found = [float(v) for v in (first, st.failing_since) if v]
        return min(found, default=None)

    @call
    def list_deliveries(
        self,
        endpoint: str | None = None,
        status: str | None = None,
        session: str | None = None,
        limit: int = 100,
        *,
        event_id: str | None = None,
        before_id: int | None = None,
        event_type: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[DeliveryRow]:
        """Deliveries, newest first, filtered by any of endpoint, status, session, event
        (its id is the ``webhook-id``), event type and creation time (``since`` inclusive,
        ``until`` exclusive); ``before_id`` pages further back (ids below it).

        A session's deliveries (no event named) are reached through its events
        (``events_by_session``, then ``deliveries_by_event``), and the endpoint and status
        only sort out the rows found (``|| ''``: an expression no index serves): SQLite
        joins in the written order after ``CROSS JOIN`` (without it the planner, which has
        no statistics, walked the endpoint's whole index; no index holds (endpoint,
        session)). PostgreSQL plans it as any inner join."""
        by_session = session is not None and event_id is None
        no_index = " || ''" if by_session else ""
        text, params = where(
            (f"d.endpoint{no_index} = ?", endpoint),
            (f"d.status{no_index} = ?", status),
            ("d.created_at >= ?", since),
            ("d.created_at < ?", until),
            ("d.id < ?", before_id),
            ("e.session_name = ?", session),
            ("d.event_id = ?", event_id),
            ("e.type = ?", event_type),
        )
        source = (
            "events e CROSS JOIN deliveries d"
            if by_session
            else "deliveries d JOIN events e ON e.id = d.event_id"
        )
        text = f"{text} AND e.id = d.event_id" if by_session else text
        rows = self._db.conn.execute(
            f"SELECT {DELIVERY_COLUMNS} FROM {source} {text} ORDER BY d.id DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [delivery_row(r) for r in rows]

    @call
    def get_delivery(self, delivery_id: int) -> DeliveryRow | None:
        """One delivery, or ``None``."""
        found = find_deliveries(self._db.conn, "d.id = ?", (delivery_id,))
        return found[0] if found else None

    @call
    def list_attempts(self, delivery_id: int) -> list[AttemptRow]:
        """The attempts of a delivery, first to last."""
        return find_attempts(self._db.conn, "delivery_id = ?", (delivery_id,))

    @write
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
        types the endpoint subscribes to (and that meet its ``filter``) are queued, and
        events that already have an open delivery to it are skipped (they are on their way).
        In event order, a transaction per :data:`~.dialect.QUEUES_PER_TX` sessions (the
        queues' locks first, in key order): a replay met partway, by a crash, is finished
        by running it again (the events queued already are skipped).
        """
        if since is None and until is None and event_ids is None and not type_glob and not session:
            raise ValueError("replay needs at least one filter (since, until, ids, type, session)")
        now = self._db.clock()
        text, params = where(
            *_selection(since, until, event_ids, session),
            (
                "NOT EXISTS (SELECT 1 FROM deliveries o WHERE o.event_id = e.id AND o.endpoint = ? "
                "AND o.status IN ('pending', 'failed'))",
                endpoint,
            ),
        )
        refuse_readonly(self._db)
        c = self._db.conn
        row = c.execute(
            "SELECT events, filter FROM endpoints WHERE name = ?", (endpoint,)
        ).fetchone()
        if row is None:
            raise StoreError(f"unknown endpoint {endpoint!r}", path=self._db.path)
        globs, conditions = json.loads(row["events"]), json.loads(row["filter"] or "{}")
        # Globs and payload conditions are applied here, in Python (no SQL function of
        # ours, see dialect.py): first on the few distinct types of the range, then, for an
        # endpoint with conditions, on the bodies of those events.
        types = [
            r["type"]
            for r in c.execute(f"SELECT DISTINCT e.type FROM events e {text}", params)
            if (not type_glob or fnmatchcase(r["type"], type_glob)) and matches(globs, r["type"])
        ]
        # ``text`` is never empty: it holds the NOT EXISTS clause at least.
        text += " AND e.type IN (SELECT value FROM json_each(?))"
        params = [*params, json.dumps(types)]
        if conditions:
            kept = [
                r["id"]
                for r in c.execute(f"SELECT e.id, {BODY_COLUMNS} {EVENT_FROM} {text}", params)
                if payload_matches(conditions, json.loads(self._bodies.decode_row(r)))
            ]
            text += " AND e.id IN (SELECT value FROM json_each(?))"
            params = [*params, json.dumps(kept)]
        sessions = sorted(
            str(r["session_name"])
            for r in c.execute(f"SELECT DISTINCT e.session_name FROM events e {text}", params)
        )
        queued = 0
        for batch in batches(sessions):
            with self._db.tx() as tx:
                # The queues' locks in key order before the insert takes them in event
                # order (a replica recording attempts holds its keys, in key order, before
                # its rows).
                self._db.lock_queue_keys(tx, [(endpoint, session) for session in batch])
                cur = tx.execute(
                    "INSERT INTO deliveries (event_id, endpoint, session_name, status, "
                    "next_attempt_at, created_at, updated_at, replayed) "
                    "SELECT e.id, ?, e.session_name, 'pending', ?, ?, ?, 1 "
                    f"FROM events e {text} AND e.session_name IN "
                    f"({', '.join('?' * len(batch))}) ORDER BY e.seq",
                    (endpoint, now, now, now, *params, *batch),
                )
                queued += int(cur.rowcount)
        return queued

    @call
    def replay_census(
        self,
        endpoint: str,
        *,
        since: float | None = None,
        until: float | None = None,
        event_ids: Sequence[str] | None = None,
        session: str | None = None,
    ) -> tuple[int, int]:
        """Why a replay queued nothing: ``(events selected, of them with an open delivery
        to endpoint)`` for the selection of :meth:`replay` (types aside)."""
        text, params = where(*_selection(since, until, event_ids, session))
        row = self._db.conn.execute(
            "SELECT COUNT(*) AS selected, COALESCE(SUM(CASE WHEN EXISTS (SELECT 1 FROM "
            "deliveries o WHERE o.event_id = e.id AND o.endpoint = ? "
            f"AND o.status IN ('pending', 'failed')) THEN 1 ELSE 0 END), 0) AS open "
            f"FROM events e {text}",
            (endpoint, *params),
        ).fetchone()
        return int(row["selected"]), int(row["open"])

    @call
    def get_session(self, name: str) -> SessionRow | None:
        """The archived session, or ``None`` (the poller's own read waits out an unreachable
        store: :meth:`.ingest.Ingest.get_session`)."""
        return get_session(self._db.conn, name)

    @call
    def list_sessions(self, after: str | None = None, limit: int = 50) -> list[SessionRow]:
        """Archived sessions by name, those after ``after`` (a page), ``limit`` at most."""
        return list_sessions(self._db.conn, after, limit)

    @call
    def recent_sessions(
        self,
        limit: int = 20,
        *,
        states: Sequence[str] | None = None,
        other_than: Sequence[str] = (),
    ) -> list[SessionRow]:
        """Sessions by the latest upstream ``updateTime`` first, those in ``states`` (when
        given) and in none of ``other_than``; ``limit`` at most (the MCP tools' list)."""
        return recent_sessions(self._db.conn, limit, states=states, other_than=other_than)

    @call
    def last_events(
        self, session: str, limit: int, *, types: Sequence[str] | None = None
    ) -> list[EventRow]:
        """The newest ``limit`` events of ``session`` (of ``types`` only, when given), in
        ingest order."""
        type_clause = ""
        params: list[object] = [session]
        if types is not None:
            type_clause = f" AND e.type IN ({', '.join('?' * len(types)) or 'NULL'})"
            params.extend(types)
        rows = self._db.conn.execute(
            f"SELECT {EVENT_COLUMNS} {EVENT_FROM} WHERE e.session_name = ?{type_clause} "
            "ORDER BY e.seq DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [event_row(self._bodies, r) for r in reversed(rows)]

    @call
    def get_event(self, event_id: str) -> EventRow | None:
        """One archived event, or ``None``."""
        row = self._db.conn.execute(
            f"SELECT {EVENT_COLUMNS} {EVENT_FROM} WHERE e.id = ?", (event_id,)
        ).fetchone()
        return None if row is None else event_row(self._bodies, row)

    @call
    def iter_events(
        self,
        session: str | None = None,
        type_glob: str | None = None,
        since: float | None = None,
        *,
        until: float | None = None,
    ) -> Iterator[EventRow]:
        """Archived events in ingest order, streamed (never all in memory).

        ``since`` / ``until`` filter on the upstream time in Unix seconds (inclusive /
        exclusive). Rows are read :data:`_FETCH` at a time as the caller iterates, each
        page its own query from the last ``seq`` read (keyset paging): a cursor would not
        do, since PostgreSQL's client cursor holds a statement's whole result in memory.
        Each page sees what is committed when it is read, so a long iteration also yields
        the events archived meanwhile, in order.
        """
        last = 0
        while True:
            text, params = where(
                ("e.session_name = ?", session),
                ("e.occurred_ts >= ?", since),
                ("e.occurred_ts < ?", until),
                ("e.seq > ?", last),
            )
            rows = self._db.conn.execute(
                f"SELECT {EVENT_COLUMNS} {EVENT_FROM} {text} ORDER BY e.seq LIMIT ?",
                (*params, _FETCH),
            ).fetchall()
            for row in rows:
                # The type glob is matched here (no SQL function of ours, see dialect.py).
                if type_glob is None or fnmatchcase(row["type"], type_glob):
                    yield event_row(self._bodies, row)
            if len(rows) < _FETCH:
                return
            last = rows[-1]["seq"]

    @call
    def event_seq(self, event_id: str) -> int | None:
        """The position (``seq``) of the event ``event_id`` in ingest order, or ``None``."""
        seq = first_value(self._db.conn, "SELECT seq FROM events WHERE id = ?", (event_id,))
        return None if seq is None else int(seq)

    @call
    def last_event_seq(self) -> int:
        """The position of the newest archived event (0 when there is none)."""
        return int(first_value(self._db.conn, "SELECT MAX(seq) FROM events") or 0)

    @call
    def events_after(
        self,
        seq: int,
        *,
        limit: int = 200,
        max_bytes: int | None = None,
        session: str | None = None,
    ) -> list[EventRow]:
        """At most ``limit`` events after position ``seq``, in ingest order (the event
        stream's read; filters are applied by the caller, which must see every ``seq``);
        with ``max_bytes``, none after the one whose body brings the total to it; with
        ``session``, that session's only."""
        events: list[EventRow] = []
        size = 0
        text, params = where(("e.seq > ?", seq), ("e.session_name = ?", session))
        with closing(
            self._db.conn.execute(
                f"SELECT {EVENT_COLUMNS} {EVENT_FROM} {text} ORDER BY e.seq LIMIT ?",
                (*params, limit),
            )
        ) as rows:
            # Row by row: SQLite reads no further than this loop goes.
            for r in rows:
                events.append(event_row(self._bodies, r))
                size += len(events[-1].body)
                if max_bytes is not None and size >= max_bytes:
                    break
        return events

    @call
    def event_ids_after(
        self,
        seq: int,
        *,
        session: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 1000,
    ) -> list[tuple[int, str, str]]:
        """``(seq, id, type)`` of at most ``limit`` events after position ``seq``, in ingest
        order, from ``session`` and occurred in ``[since, until)`` (a replay's pages)."""
        text, params = where(
            ("seq > ?", seq),
            ("session_name = ?", session),
            ("occurred_ts >= ?", since),
            ("occurred_ts < ?", until),
        )
        rows = self._db.conn.execute(
            f"SELECT seq, id, type FROM events {text} ORDER BY seq LIMIT ?", [*params, limit]
        ).fetchall()
        return [(int(r["seq"]), str(r["id"]), str(r["type"])) for r in rows]
