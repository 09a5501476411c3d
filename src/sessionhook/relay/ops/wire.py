"""The operator's rows as the management API's models (:mod:`..domain.api_models`): one
spelling for the CLI's ``--json``, the API's answers and what the CLI's ``--url`` mode reads
back; and :func:`parse_moment`, the times an operator types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Final

from sessionhook.api.models import parse_timestamp

from ..domain.api_models import (
    ApiAction,
    ApiDelivery,
    ApiDeliveryAttempts,
    ApiEndpointState,
    ApiEvent,
    ApiEventAttempts,
    ApiHistoryWalk,
    ApiReplica,
    ApiSession,
    ApiStatus,
)
from ..domain.replica import replica_health
from ..domain.rows import AttemptRow, DeliveryRow, EndpointState, EventRow, SessionRow
from ..store.actions import ActionRow
from .overview import Overview

_AGE: Final = re.compile(r"^\s*(\d{1,9}(?:\.\d{1,6})?)\s*(s|m|h|d|w)\s*$", re.IGNORECASE)
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: 9999-12-31T23:59:59Z: the last moment a wire moment can spell.
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


def event_answer(row: EventRow) -> ApiEvent:
    """An archived event, its body parsed."""
    return ApiEvent(
        seq=row.seq,
        id=row.id,
        type=row.type,
        session=row.session_name,
        activity=row.activity_name,
        occurred_at=row.occurred_at,
        archived_at=row.created_at,
        body=row.payload(),
    )


def status_answer(overview: Overview, now: float) -> ApiStatus:
    """What ``status --json`` prints and ``GET /v1/status`` answers."""
    history = overview.history
    walk = ApiHistoryWalk(
        total=history.total,
        done=history.done,
        remaining=history.remaining,
        sessions_per_second=round(history.rate, 3),
        eta_seconds=None if history.eta_seconds is None else round(history.eta_seconds),
    )
    replicas = [
        ApiReplica(**asdict(r), health=replica_health(r.heartbeat_at, r.lease, r.stopped_at, now))
        for r in overview.replicas
    ]
    return ApiStatus(
        **asdict(overview.summary),
        history_walk=walk,
        accounts=overview.accounts,
        replicas=replicas,
    )


def delivery_answer(row: DeliveryRow, claim: tuple[str, float] | None = None) -> ApiDelivery:
    """A delivery, with the live replica attempting it (``claimed_by``/``claimed_at``)."""
    by, at = claim if claim is not None else (None, None)
    return ApiDelivery(**asdict(row), claimed_by=by, claimed_at=at)


def endpoint_state_answer(
    state: EndpointState, pending: int, in_flight: Mapping[str, int] | None = None
) -> ApiEndpointState:
    """An endpoint's state, its open deliveries and how many each replica has in flight."""
    return ApiEndpointState(**asdict(state), pending=pending, in_flight=dict(in_flight or {}))


def attempts_answer(
    event: EventRow | None, found: Sequence[tuple[DeliveryRow, Sequence[AttemptRow]]]
) -> ApiDeliveryAttempts | ApiEventAttempts:
    """One delivery with its attempts, or every delivery of ``event`` with theirs."""
    blocks = [
        ApiDeliveryAttempts.model_validate({"delivery": d, "attempts": rows}, from_attributes=True)
        for d, rows in found
    ]
    return blocks[0] if event is None else ApiEventAttempts(event=event.id, deliveries=blocks)


def session_answer(row: SessionRow) -> ApiSession:
    """A session as the API shows it (the archived fields, not the poller's bookkeeping)."""
    return ApiSession.model_validate(row, from_attributes=True)


def action_answer(row: ActionRow) -> ApiAction:
    """One action (``token_hash``: the SHA-256 of the link's token, never the token)."""
    return ApiAction.model_validate(row, from_attributes=True)
