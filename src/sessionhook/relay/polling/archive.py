"""Archiving what the poller read: activities, session events, refusals; what is delivered.

:class:`Archive` is the poller's one writer of what it found: a page of activities (split
into runs of equal delivery, one transaction each), session events, refused activities.
It counts what it archived and wakes the dispatcher (deliveries queued) and the event
streams (events archived). It also keeps the first start (``backfill = false``): events
of a session created before it are archived, and delivered only when they happened after.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from sessionhook.api.models import Activity, Session, parse_timestamp

from ..domain import events
from ..domain.rows import Ingested
from ..store import Ingest, MetaQueries, Refusals
from ..telemetry.logs import get_logger
from .settings import EPOCH_KEY
from .state import PollState

_log = get_logger()


class Archive:
    """Archives one account's findings (see the module docstring); ``on_enqueued`` and
    ``on_ingested`` are the wake-ups of the dispatcher and the event streams."""

    def __init__(
        self,
        state: PollState,
        *,
        on_enqueued: Callable[[], None],
        on_ingested: Callable[[], None],
    ) -> None:
        self._state, self._store, self._clock = state, state.store, state.clock
        self._metrics, self._account = state.metrics, state.account
        self._on_enqueued = on_enqueued
        self._on_ingested = on_ingested
        #: The first start of this store (Unix seconds); see :meth:`load_epoch`.
        self.epoch: float | None = None

    # ------------------------------------------------------------------ the first start

    async def load_epoch(self) -> float:
        """The first start of this store (Unix seconds), recorded at the first discovery."""
        if self.epoch is None:
            raw = await self._store.run(MetaQueries.get_meta, EPOCH_KEY)
            if raw is None:
                self.epoch = self._clock()
                await self._store.run(MetaQueries.set_meta, EPOCH_KEY, repr(self.epoch))
            else:
                self.epoch = float(raw)
        return self.epoch

    def is_baseline(self, session: Session) -> bool:
        """Whether ``session`` existed before the first start (and backfill is off)."""
        if self._state.settings.backfill or self.epoch is None:
            return False
        created = _unix(session.create_time)
        return created is not None and created < self.epoch

    def deliverable(self, baseline: bool) -> Callable[[events.Event], bool]:
        """Which events of a session to deliver: all, or what happened upstream since the first
        start for a session from before it."""
        epoch = self.epoch
        if not baseline or epoch is None:
            return lambda _: True
        return lambda event: event.occurred_ts >= epoch

    @property
    def account(self) -> str:
        """The account whose findings this archives (``data.account``)."""
        return self._account

    # ------------------------------------------------------------------ archiving

    def stamp(self, event: events.Event) -> events.Event:
        """The event with ``data.account``: which account's session it is about."""
        return events.with_account(event, self._account)

    async def announce(self, session: Session, *, deliver: bool) -> None:
        """Archive ``session.discovered`` (delivered when ``deliver``)."""
        event = events.session_discovered(session, now=self._clock())
        await self.session_events(session.name, [event], deliver=lambda _: deliver)

    async def activities(
        self,
        session: Session,
        batch: Sequence[Activity],
        deliver: Callable[[events.Event], bool],
        *,
        cursor_limit: str | None = None,
    ) -> int:
        """Archive a batch; returns how many activities were new.

        Oldest first, the batch splits into at most a few runs of equal ``deliver`` (the
        history before the first start, then what came after), one transaction each. The
        cursor does not move past ``cursor_limit``; a name archived under another session
        is refused (``duplicate_name``).
        """
        built, raws = events.archived_page(
            session,
            batch,
            max_media_bytes=self._state.settings.max_media_bytes,
            now=self._clock(),
            account=self._account,
        )
        new = 0
        start = 0
        while start < len(built):
            flag = deliver(built[start])
            end = start + 1
            while end < len(built) and deliver(built[end]) == flag:
                end += 1
            chunk = built[start:end]
            added = await self._store.run(
                Ingest.ingest_activities,
                session.name,
                list(batch[start:end]),
                chunk,
                flag,
                cursor_limit=cursor_limit,
                raws=raws[start:end],
            )
            self.count_ingested(added)
            for name in added.conflicts:
                await self.refuse(
                    session.name, name, "duplicate_name", detail="archived under another session"
                )
            new += added.activities
            start = end
        return new

    async def session_events(
        self, name: str, found: list[events.Event], *, deliver: Callable[[events.Event], bool]
    ) -> None:
        """Archive events about session ``name`` (stamped with the account)."""
        found = [self.stamp(e) for e in found]
        for flag in (False, True):
            chosen = [e for e in found if deliver(e) == flag]
            if chosen:
                added = await self._store.run(Ingest.ingest_session_events, name, chosen, flag)
                self.count_ingested(added)

    async def refuse(
        self,
        session: str,
        name: str,
        reason: str,
        *,
        create_time: str = "",
        detail: str = "",
        size: int | None = None,
        cursor_limit: str | None = None,
        advance_cursor: bool = False,
    ) -> None:
        """Record, count and log one refused activity (loudly the first time); upstream text
        that is not Unicode is kept with a replacement character."""
        name, create_time, detail = (_unicode(t) for t in (name, create_time, detail))
        first = await self._store.run(
            Refusals.refuse_activity,
            session,
            name,
            reason,
            create_time=create_time,
            detail=detail,
            size=size,
            cursor_limit=cursor_limit,
            advance_cursor=advance_cursor,
        )
        if first and self._metrics is not None:
            self._metrics.activities_refused.labels(reason=reason).inc()
        (_log.warning if first else _log.debug)(
            "poll.activity_refused",
            session=session,
            name=name[:200],
            reason=reason,
            create_time=create_time[:64],
            detail=detail,
        )

    def count_ingested(self, added: Ingested) -> None:
        """Count the newly archived events by type; wake the dispatcher if deliveries were
        queued (not for events no endpoint takes: a round would find nothing new)."""
        if not added.event_types:
            return
        if self._metrics is not None:
            # One increment per type and batch (a page's events are mostly of two types).
            for event_type, count in Counter(added.event_types).items():
                self._metrics.event_ingested(event_type, count)
        if added.deliveries:
            self._on_enqueued()
        self._on_ingested()


def _unix(text: str) -> float | None:
    try:
        return parse_timestamp(text).timestamp() if text else None
    except ValueError:
        return None


def _unicode(text: str) -> str:
    """``text`` with any lone surrogate replaced (``?``), so that it can be encoded."""
    return text.encode("utf-8", "replace").decode("utf-8")
