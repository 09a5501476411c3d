"""The delivery log and the archive, read: deliveries, attempts, events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from ..domain.delivery_states import DELIVERY_STATUSES
from ..domain.rows import AttemptRow, DeliveryRow, EventRow
from ..store import StoreCore
from .errors import OperatorError

#: At most this many deliveries of one event are shown by :func:`attempts`.
EVENT_DELIVERIES: Final = 1000


def check_status(status: str | None) -> None:
    """An :class:`OperatorError` unless ``status`` is ``None`` or a delivery's status."""
    if status is not None and status not in DELIVERY_STATUSES:
        raise OperatorError(f"status must be one of {', '.join(DELIVERY_STATUSES)}")


def deliveries(
    store: StoreCore,
    *,
    endpoint: str | None = None,
    status: str | None = None,
    session: str | None = None,
    limit: int = 100,
) -> list[DeliveryRow]:
    """The delivery log, newest first, filtered."""
    check_status(status)
    return store.operator.list_deliveries(endpoint, status, session, limit)


def attempts(
    store: StoreCore, target: str
) -> tuple[EventRow | None, list[tuple[DeliveryRow, list[AttemptRow]]]]:
    """Every attempt of one delivery (``12``, ``#12``) or of every delivery of one event
    (``evt_...``, the webhook-id): ``(event or None, [(delivery, attempts)])``."""
    key = target.strip().removeprefix("#")
    if key.isdigit():
        delivery = store.operator.get_delivery(int(key))
        if delivery is None:
            raise OperatorError(f"no delivery {key}", hint="see `sessionhook deliveries`")
        return None, [(delivery, store.operator.list_attempts(delivery.id))]
    event = store.operator.get_event(key)
    if event is None:
        raise OperatorError(
            f"no delivery or event {target!r}",
            hint="give a delivery id (see `sessionhook deliveries`) or an event id "
            "(evt_…, see `sessionhook events`)",
        )
    rows = store.operator.list_deliveries(event_id=key, limit=EVENT_DELIVERIES)
    return event, [
        (d, store.operator.list_attempts(d.id)) for d in sorted(rows, key=lambda d: d.id)
    ]


def events(
    store: StoreCore,
    *,
    session: str | None = None,
    type_glob: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int | None = None,
) -> Iterator[EventRow]:
    """Archived events in ingest order, streamed (never all in memory)."""
    rows = store.operator.iter_events(session, type_glob, since, until=until)
    for i, row in enumerate(rows):
        if limit is not None and i >= limit:
            return
        yield row
