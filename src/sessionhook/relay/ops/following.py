"""Following the archive: :class:`Follower`, the cursor read of the event stream and
``events --follow``, and where one starts."""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ..domain.rows import EventRow
from ..store import StoreCore
from .errors import OperatorError


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events a follower wants: any of ``types`` (fnmatch globs; none: all) and
    ``session``."""

    types: tuple[str, ...] = ()
    session: str | None = None

    def matches(self, event_type: str) -> bool:
        """Whether an event of ``event_type`` passes the type globs (pure)."""
        return not self.types or any(fnmatch.fnmatchcase(event_type, g) for g in self.types)


@dataclass(frozen=True, slots=True)
class EventPage:
    """One cursor read: the events that passed the filter, the new position (past every
    row accepted, matching or not, so a rare type never rescans), and whether more rows are
    waiting (read again at once)."""

    events: list[EventRow]
    cursor: int
    more: bool


#: Seconds a hole in the events' order may stay open before a follower moves past it.
GAP_SETTLE: Final = 5.0


class Follower:
    """Reads the events after a position, in the events table's order, for the event stream
    and ``events --follow``: :meth:`read` again and again.

    Nothing missed: on PostgreSQL ``seq`` values are taken when a row is inserted but become
    visible when its transaction commits, so a reader can see 12 while 11 is still being
    written (several ingests at once, or several relays). A follower therefore stops at a
    hole in ``seq`` and reads again, until the hole fills or has stayed open for ``settle``
    seconds (a value a rolled-back or conflicting insert consumed never appears; SQLite
    leaves no holes). Filters are applied here, never in SQL, so holes stay visible.
    """

    def __init__(
        self,
        start: int,
        wanted: EventFilter,
        *,
        settle: float = GAP_SETTLE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: The position: the last event accepted (sent, or skipped by the filter).
        self.cursor = start
        self.wanted = wanted
        self._settle = settle
        self._clock = clock
        #: First seen, for each hole still ahead: where it starts -> when.
        self._holes: dict[int, float] = {}
        #: The largest body of the last read (bytes).
        self._largest = 0

    def read(
        self, store: StoreCore, *, limit: int = 100, max_bytes: int | None = None
    ) -> EventPage:
        """The next events (runs in the store's thread; one caller at a time): at most
        ``limit``, and with ``max_bytes`` no more once their bodies add up to it (one at
        least). ``more`` says whether a next read may find more at once."""
        if max_bytes is not None and self._largest:
            # PostgreSQL's driver fetches a whole result at once: ask for about as many
            # rows as the last read's largest body says fit.
            limit = max(1, min(limit, max_bytes // self._largest))
        rows = store.operator.events_after(self.cursor, limit=limit, max_bytes=max_bytes)
        full = len(rows) == limit
        if rows and max_bytes is not None:
            self._largest = max(len(r.body) for r in rows)
            full = full or sum(len(r.body) for r in rows) >= max_bytes
        accepted: list[EventRow] = []
        now = self._clock()
        for row in rows:
            if row.seq != self.cursor + 1:
                seen = self._holes.setdefault(self.cursor + 1, now)
                if now - seen < self._settle:
                    # Every hole of this read starts its clock now: they settle together.
                    self._note_holes(rows, now)
                    return EventPage(accepted, self.cursor, False)
            self.cursor = row.seq
            if self.wanted.matches(row.type) and self.wanted.session in (None, row.session_name):
                accepted.append(row)
        self._holes = {k: v for k, v in self._holes.items() if k > self.cursor}
        return EventPage(accepted, self.cursor, full)

    def _note_holes(self, rows: list[EventRow], now: float) -> None:
        previous = self.cursor
        for row in rows:
            if row.seq > previous + 1:
                self._holes.setdefault(previous + 1, now)
            previous = max(previous, row.seq)
        self._holes = {k: v for k, v in self._holes.items() if k > self.cursor}


def resume_position(store: StoreCore, event_id: str | None) -> int:
    """Where a follower starts: right after the event ``event_id`` (a webhook-id), or after
    the newest event when ``None``. An unknown id is an :class:`OperatorError`, never a
    silent restart from somewhere else."""
    if event_id is None:
        return store.operator.last_event_seq()
    seq = store.operator.event_seq(event_id)
    if seq is None:
        raise OperatorError(f"unknown event id {event_id!r}: no such event in the archive")
    return seq
