"""Reading the event archive and the delivery log: the column lists, the row builders and the
delivery and attempt lists that the operator's queries (:mod:`.ops_queries`) and the console's
(:mod:`.console_queries`) share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..domain.rows import AttemptRow, DeliveryRow, EventRow, from_row
from .bodies import BODY_COLUMNS, Bodies
from .dialect import Connection

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
    """``WHERE`` and its parameters for the clauses whose value is not ``None``, the value
    filling each ``?`` of its clause (empty text and no parameter when there is none)."""
    used = [(sql, value) for sql, value in clauses if value is not None]
    if not used:
        return "", []
    params = [value for sql, value in used for _ in range(sql.count("?"))]
    return "WHERE " + " AND ".join(sql for sql, _ in used), params


def find_deliveries(conn: Connection, clause: str, params: Sequence[Any]) -> list[DeliveryRow]:
    """The deliveries ``WHERE clause`` (``d``, their event ``e``), oldest first."""
    rows = conn.execute(
        f"SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN events e ON e.id = d.event_id "
        f"WHERE {clause} ORDER BY d.id",
        tuple(params),
    ).fetchall()
    return [delivery_row(r) for r in rows]


def find_attempts(conn: Connection, clause: str, params: Sequence[Any]) -> list[AttemptRow]:
    """The logged attempts ``WHERE clause``, in order (by delivery, then attempt)."""
    rows = conn.execute(
        "SELECT id, delivery_id, attempt, started_at, duration_ms, status_code, error, "
        f"response_body FROM attempts WHERE {clause} ORDER BY delivery_id, attempt, id",
        tuple(params),
    ).fetchall()
    return [from_row(AttemptRow, r) for r in rows]
