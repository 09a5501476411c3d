"""The operator's rows as JSON: one spelling for ``--json`` of the CLI, the management API
and the CLI's ``--url`` mode, so a script reads the same fields from each.

Moments are RFC 3339 in UTC with microseconds and ``Z`` (the service's own spelling, as in
``occurred_at``); the store keeps them as Unix seconds in fields named ``*_at``,
``*_since`` and ``now``. Durations keep their names and units (``lease``,
``oldest_pending_age``, ``duration_ms``, ``eta_seconds``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from sessionhook.api.models import parse_timestamp

from ..domain.replica import replica_health
from ..domain.rows import (
    AttemptRow,
    DeliveryRow,
    EndpointState,
    EndpointSummary,
    EventRow,
    RefusedRow,
    RefusedSummary,
    SessionRow,
    StatusSummary,
    UpstreamSummary,
)
from ..store import HistoryProgress, ReplicaRow
from . import Overview

__all__ = [
    "attempts_from_json",
    "attempts_json",
    "delivery_from_json",
    "delivery_json",
    "endpoint_from_json",
    "endpoint_json",
    "event_json",
    "json_stamp",
    "json_times",
    "object_times",
    "overview_from_json",
    "parse_moment",
    "replica_json",
    "session_json",
    "status_json",
]

_Row = TypeVar("_Row")


def json_stamp(ts: float) -> str:
    """Unix seconds as RFC 3339, UTC, microseconds, ``Z``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_AGE: Final = re.compile(r"^\s*(\d{1,9}(?:\.\d{1,6})?)\s*(s|m|h|d|w)\s*$", re.IGNORECASE)
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: 9999-12-31T23:59:59Z: the last moment :func:`json_stamp` can spell.
_LAST: Final = 253_402_300_799.0


def parse_moment(text: str, now: float) -> float:
    """Unix seconds from what an operator types: RFC 3339 (``2026-11-22T12:00:00Z``), ``now``,
    or an age before ``now`` (``90s``, ``30m``, ``2h``, ``7d``, ``1w``). :class:`ValueError`
    (one line) for anything else, or a moment before 1970 or after 9999."""
    if text.strip().lower() == "now":
        return now
    if match := _AGE.match(text):
        value = now - float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    else:
        try:
            value = parse_timestamp(text).timestamp()
        except ValueError:
            shown = text if len(text) <= 40 else text[:40] + "..."
            raise ValueError(
                f"{shown!r} is neither RFC 3339 (2026-11-22T12:00:00Z) nor an age (30m, 2h, 7d)"
            ) from None
    if not 0.0 <= value <= _LAST:
        raise ValueError(f"{text.strip()[:40]!r} is before 1970 or after 9999")
    return value


def _is_moment(key: str) -> bool:
    return key == "now" or key.endswith(("_at", "_since"))


def json_times(data: Any) -> Any:
    """``data`` (rows as dicts, nested) with every moment as :func:`json_stamp` instead of
    Unix seconds; ``None`` stays ``null``."""
    if isinstance(data, dict):
        return object_times(data)
    if isinstance(data, list | tuple):
        return [json_times(value) for value in data]
    return data


def object_times(data: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`json_times` of one JSON object."""
    return {
        key: json_stamp(value)
        if _is_moment(key) and isinstance(value, int | float) and not isinstance(value, bool)
        else json_times(value)
        for key, value in data.items()
    }


def event_json(row: EventRow) -> dict[str, Any]:
    """An archived event: the body parsed, moments as RFC 3339."""
    return {
        "seq": row.seq,
        "id": row.id,
        "type": row.type,
        "session": row.session_name,
        "activity": row.activity_name,
        "occurred_at": row.occurred_at,
        "archived_at": json_stamp(row.created_at),
        "body": row.payload(),
    }


def replica_json(r: ReplicaRow, now: float) -> dict[str, Any]:
    """A replica: its row and its health at ``now`` (moments still Unix seconds)."""
    return {**asdict(r), "health": replica_health(r.heartbeat_at, r.lease, r.stopped_at, now)}


def status_json(overview: Overview, now: float) -> dict[str, Any]:
    """What ``status --json`` prints and ``GET /v1/status`` answers."""
    history = overview.history
    walk = {
        "total": history.total,
        "done": history.done,
        "remaining": history.remaining,
        "sessions_per_second": round(history.rate, 3),
        "eta_seconds": None if history.eta_seconds is None else round(history.eta_seconds),
    }
    return object_times(
        {
            **asdict(overview.summary),
            "history_walk": walk,
            "accounts": overview.accounts,
            "replicas": [replica_json(r, now) for r in overview.replicas],
        }
    )


def delivery_json(row: DeliveryRow, claim: tuple[str, float] | None = None) -> dict[str, Any]:
    """A delivery, with the live replica attempting it (``claimed_by``/``claimed_at``)."""
    by, at = claim if claim is not None else (None, None)
    return object_times({**asdict(row), "claimed_by": by, "claimed_at": at})


def endpoint_json(
    state: EndpointState, pending: int, in_flight: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """An endpoint's state, its open deliveries and how many each replica has in flight."""
    return object_times({**asdict(state), "pending": pending, "in_flight": dict(in_flight or {})})


def attempts_json(
    event: EventRow | None, found: Sequence[tuple[DeliveryRow, Sequence[AttemptRow]]]
) -> dict[str, Any]:
    """One delivery with its attempts, or every delivery of ``event`` with theirs."""
    blocks = [{"delivery": asdict(d), "attempts": [asdict(a) for a in rows]} for d, rows in found]
    return object_times(blocks[0] if event is None else {"event": event.id, "deliveries": blocks})


def session_json(row: SessionRow) -> dict[str, Any]:
    """A session as the API shows it (the archived fields, not the poller's bookkeeping)."""
    return object_times(
        {
            "name": row.name,
            "id": row.id,
            "title": row.title,
            "state": row.state,
            "url": row.url,
            "source": row.source,
            "create_time": row.create_time,
            "update_time": row.update_time,
            "first_seen_at": row.first_seen_at,
        }
    )


def _seconds(data: Any) -> Any:
    """The inverse of :func:`json_times`: every moment back to Unix seconds."""
    if isinstance(data, dict):
        return {
            key: datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            if _is_moment(key) and isinstance(value, str)
            else _seconds(value)
            for key, value in data.items()
        }
    if isinstance(data, list):
        return [_seconds(value) for value in data]
    return data


def _row(kind: type[_Row], data: Mapping[str, Any], **overrides: Any) -> _Row:
    """``kind`` from the fields of ``data`` it has (more fields are what a newer relay
    adds, and are left out); a missing one raises :class:`TypeError`."""
    names = {f.name for f in fields(kind)}  # type: ignore[arg-type]
    return kind(**{k: v for k, v in data.items() if k in names and k not in overrides}, **overrides)


def overview_from_json(data: Mapping[str, Any]) -> Overview:
    """The :class:`Overview` that :func:`status_json` spelled (what ``GET /v1/status``
    answers), for ``status --url`` to print as ``status`` does. Raises :class:`ValueError`
    (a moment that is not RFC 3339), :class:`TypeError` or :class:`KeyError` (a field
    missing or of another shape)."""
    raw = _seconds(dict(data))
    refused = raw.get("refused") or {}
    latest = refused.get("latest")
    summary = _row(
        StatusSummary,
        raw,
        endpoints=tuple(_row(EndpointSummary, e) for e in raw["endpoints"]),
        upstream=_row(UpstreamSummary, raw["upstream"]),
        refused=_row(
            RefusedSummary,
            refused,
            by_reason=dict(refused.get("by_reason") or {}),
            latest=None if latest is None else _row(RefusedRow, latest),
        ),
    )
    walk = raw["history_walk"]
    history = HistoryProgress(walk["total"], walk["done"], walk["sessions_per_second"])
    replicas = tuple(_row(ReplicaRow, r, leases=tuple(r["leases"])) for r in raw["replicas"])
    return Overview(summary, history, dict(raw["accounts"]), replicas)


def delivery_from_json(data: Mapping[str, Any]) -> tuple[DeliveryRow, tuple[str, float] | None]:
    """The row and claim :func:`delivery_json` spelled (a row of ``GET /v1/deliveries``),
    for the CLI's ``--url`` mode to print as the local command does; raises as
    :func:`overview_from_json`."""
    raw = _seconds(dict(data))
    by, at = raw.get("claimed_by"), raw.get("claimed_at")
    return _row(DeliveryRow, raw), None if by is None or at is None else (str(by), float(at))


def attempts_from_json(data: Mapping[str, Any]) -> tuple[DeliveryRow, list[AttemptRow]]:
    """One delivery and its attempts as :func:`attempts_json` spelled them (``GET
    /v1/deliveries/{id}``); raises as :func:`overview_from_json`."""
    raw = _seconds(dict(data))
    return _row(DeliveryRow, raw["delivery"]), [_row(AttemptRow, a) for a in raw["attempts"]]


def endpoint_from_json(data: Mapping[str, Any]) -> tuple[EndpointState, int, dict[str, int]]:
    """An endpoint's state, open deliveries and in flight per replica as
    :func:`endpoint_json` spelled them (a row of ``GET /v1/endpoints``); raises as
    :func:`overview_from_json`."""
    raw = _seconds(dict(data))
    state = _row(EndpointState, raw, events=tuple(raw["events"]))
    return state, int(raw["pending"]), {str(k): int(v) for k, v in raw["in_flight"].items()}
