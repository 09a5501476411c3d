"""Reading the event archive and the delivery log: the column lists, the row builders and the
filtered delivery list that the operator's queries (:mod:`.ops_queries`) and the console's
(:mod:`.console_queries`) share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..domain.rows import DeliveryRow, EventRow, from_row
from .bodies import BODY_COLUMNS, Bodies
from .dialect import Connection

__all__ = [
    "DELIVERY_COLUMNS",
    "EVENT_COLUMNS",
    "EVENT_FROM",
    "deliveries_where",
    "delivery_row",
    "event_row",
    "where",
]

# waiting_on: the oldest open delivery of the same (endpoint, session), when it is an
# earlier one: the dispatcher sends only that one (store.due_deliveries), so this row
# waits for it whatever its own next_attempt_at says. Served by deliveries_open.
DELIVERY_COLUMNS = (
    "d.id, d.event_id, e.type AS event_type, d.endpoint, d.session_name, d.status, d.attempts, "
    "d.next_attempt_at, d.created_at, d.updated_at, d.delivered_at, d.last_status_code, "
    "d.last_error, d.replayed, "
    "CASE WHEN d.status IN ('pending', 'failed') THEN (SELECT MIN(o.id) FROM deliveries o "
    "WHERE o.endpoint = d.endpoint AND o.session_name = d.session_name "
    "AND o.status IN ('pending', 'failed') AND o.id < d.id) END AS waiting_on"
)

# The body is stored compressed against its reference and activity (see codec.py).
EVENT_COLUMNS = (
    "e.seq, e.id, e.session_name, e.type, e.activity_name, e.occurred_at, e.occurred_ts, "
    "e.created_at, " + BODY_COLUMNS
)
EVENT_FROM = "FROM events e LEFT JOIN activities a ON a.name = e.activity_name"


def delivery_row(r: Any) -> DeliveryRow:
    """A row of :data:`DELIVERY_COLUMNS` as a :class:`DeliveryRow`."""
    return from_row(DeliveryRow, r, replayed=bool(r["replayed"]))


def event_row(bodies: Bodies, r: Any) -> EventRow:
    """A row of :data:`EVENT_COLUMNS` as an :class:`EventRow`, its body decoded."""
    return from_row(EventRow, r, body=bodies.decode_row(r))


def where(*clauses: tuple[str, object | None]) -> tuple[str, list[object]]:
    """``WHERE`` and its parameters for the clauses whose value is not ``None`` (empty text
    and no parameter when there is none)."""
    used = [(sql, value) for sql, value in clauses if value is not None]
    if not used:
        return "", []
    return "WHERE " + " AND ".join(sql for sql, _ in used), [value for _, value in used]


def deliveries_where(
    conn: Connection,
    clauses: Sequence[tuple[str, object | None]],
    limit: int,
    by_session: bool = False,
) -> list[DeliveryRow]:
    """Deliveries matching every clause whose value is not ``None``, newest first.

    ``by_session``: a session's deliveries are reached through its events
    (``events_by_session``, then ``deliveries_by_event``), whatever else filters: SQLite
    joins in the written order after ``CROSS JOIN`` (without it the planner, which has
    no statistics, walked the endpoint's whole index; since 0008 no index holds
    (endpoint, session)). PostgreSQL plans it as any inner join."""
    text, params = where(*clauses)
    source = (
        "events e CROSS JOIN deliveries d"
        if by_session
        else "deliveries d JOIN events e ON e.id = d.event_id"
    )
    text = f"{text} AND e.id = d.event_id" if by_session else text
    rows = conn.execute(
        f"SELECT {DELIVERY_COLUMNS} FROM {source} {text} ORDER BY d.id DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [delivery_row(r) for r in rows]
