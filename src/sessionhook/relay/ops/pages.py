"""Pages of the operator's rows for the management API: deliveries (newest first), events
(in ingest order), sessions (by name), one thing with what belongs to it.

Each page is read by key from where the previous one ended (``after``: the last delivery
id, event position or session name), so a page costs the same however deep it is, and a
row written meanwhile is neither skipped nor shown twice. Every read is bounded: a page
asks for one row more than it shows (to know whether there is more), and the event list,
whose type filter is applied here, reads at most :data:`EVENT_SCAN` rows per page.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from ..domain.rows import OPEN_STATUSES, DeliveryRow, EventRow, SessionRow
from ..store import StoreCore
from .endpoint_switches import find_endpoint
from .errors import OperatorError
from .overview import in_flight
from .records import check_status

#: Events read at most for one page of a type-filtered list (a page may come back short,
#: with a token to go on, rather than scan the whole archive for a rare type).
EVENT_SCAN: Final = 2000
#: Events shown with one session (more: ``GET /v1/events?session=``).
SESSION_EVENTS: Final = 200

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """Rows of one page and where the next starts (``None``: this is the last)."""

    items: list[T]
    after: str | None


def page_of(rows: list[T], size: int, key: Callable[[T], object]) -> Page[T]:
    """The first ``size`` of ``rows``, read one past a page: when that one is there, the
    next page starts after the ``key`` of this one's last."""
    return Page(rows[:size], str(key(rows[size - 1])) if len(rows) > size else None)


def delivery_page(
    store: StoreCore,
    now: float,
    *,
    size: int,
    before: int | None = None,
    endpoint: str | None = None,
    status: str | None = None,
    session: str | None = None,
    event: str | None = None,
) -> tuple[Page[DeliveryRow], dict[int, tuple[str, float]]]:
    """Deliveries, newest first, below id ``before``; and the live replica attempting each
    open one (``claimed_by``). An unknown endpoint is an :class:`OperatorError`."""
    if endpoint is not None:
        find_endpoint(store, endpoint)
    check_status(status)
    rows = store.operator.list_deliveries(
        endpoint, status, session, size + 1, event_id=event, before_id=before
    )
    page = page_of(rows, size, lambda r: r.id)
    claims = in_flight(store, now, (r.id for r in page.items if r.status in OPEN_STATUSES))
    return page, claims


def event_page(
    store: StoreCore,
    *,
    size: int,
    after: int = 0,
    type_glob: str | None = None,
    session: str | None = None,
) -> Page[EventRow]:
    """Events after position ``after`` in ingest order, of ``session`` and of types
    matching ``type_glob`` (fnmatch); at most :data:`EVENT_SCAN` rows are read."""
    found: list[EventRow] = []
    cursor, scanned = after, 0
    while scanned < EVENT_SCAN:
        batch = min(500, EVENT_SCAN - scanned)
        rows = store.operator.events_after(cursor, limit=batch, session=session)
        for row in rows:
            scanned += 1
            cursor = row.seq
            if type_glob is None or fnmatch.fnmatchcase(row.type, type_glob):
                found.append(row)
                if len(found) == size:
                    more = bool(store.operator.events_after(cursor, limit=1, session=session))
                    return Page(found, str(cursor) if more else None)
        if len(rows) < batch:
            return Page(found, None)
    return Page(found, str(cursor))  # scanned enough: the next page goes on from here


def session_page(store: StoreCore, *, size: int, after: str | None = None) -> Page[SessionRow]:
    """Archived sessions by name, after the name ``after``."""
    return page_of(store.operator.list_sessions(after, size + 1), size, lambda r: r.name)


def session_detail(store: StoreCore, name: str) -> tuple[SessionRow, list[EventRow], bool]:
    """The session ``name``, its first :data:`SESSION_EVENTS` events in ingest order, and
    whether it has more; :class:`OperatorError` when it is not archived."""
    row = store.operator.get_session(name)
    if row is None:
        raise OperatorError(f"no session {name} in the archive")
    rows = store.operator.events_after(0, limit=SESSION_EVENTS + 1, session=name)
    return row, rows[:SESSION_EVENTS], len(rows) > SESSION_EVENTS


def event_detail(store: StoreCore, event_id: str) -> tuple[EventRow, list[DeliveryRow]]:
    """The event ``event_id`` and its deliveries (oldest first);
    :class:`OperatorError` when there is no such event."""
    event = store.operator.get_event(event_id)
    if event is None:
        raise OperatorError(f"no event {event_id} in the archive")
    rows = store.operator.list_deliveries(event_id=event_id, limit=1000)
    return event, sorted(rows, key=lambda d: d.id)
