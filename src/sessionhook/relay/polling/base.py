"""What every part of the poller shares: its state, ingesting, and upstream failures."""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence

import anyio
import anyio.abc

from sessionhook.api.client import SessionsClient
from sessionhook.api.errors import (
    ApiError,
    ApiStatusError,
    MalformedResponseError,
    UnauthenticatedError,
)
from sessionhook.api.models import Activity, Session

from ..config import DEFAULT_ACCOUNT
from ..domain import events
from ..store import AsyncStore, Ingested, KnownSession
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics
from .learning import UpdateTimeLearning
from .screening import SessionScreen
from .settings import PollSettings, _Pending, _Tracked, backoff_delay

_log = get_logger()


class PollerBase:
    """The poller's shared state and helpers; :class:`~.poller.Poller` is the whole.

    ``on_enqueued`` is called whenever an ingest enqueued deliveries (the dispatcher's
    wake-up), ``on_ingested`` whenever an ingest archived events (the event streams'
    wake-up). ``clock`` is wall time for the store's bookkeeping, ``monotonic`` drives the
    schedule; both and ``rng`` (backoff jitter) are injectable for tests.
    """

    def __init__(
        self,
        client: SessionsClient,
        store: AsyncStore,
        settings: PollSettings,
        *,
        on_enqueued: Callable[[], None] = lambda: None,
        on_ingested: Callable[[], None] = lambda: None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        account: str = DEFAULT_ACCOUNT,
    ) -> None:
        #: The account this poller follows (``[[accounts]]`` name): ``data.account``.
        self.account = account
        self._client = client
        self._store = store
        self.settings = settings
        self._on_enqueued = on_enqueued
        self._on_ingested = on_ingested
        self._metrics = metrics
        self._clock = clock
        self._mono = monotonic
        self._rng = rng if rng is not None else random.Random()
        self._tracked: dict[str, _Tracked] = {}
        self._changed = anyio.Event()
        self._time_filter = True  # cleared if the server rejects the createTime parameter
        self._epoch: float | None = None  # see _load_epoch
        #: Listed, but their first GET failed (404 right after creation, 5xx...): retried
        #: between discovery passes with a backoff of their own.
        self._pending: dict[str, _Pending] = {}
        self._discovery_errors = 0
        #: Set once the first discovery pass was tried (successfully or not): readiness.
        self.first_pass_done = anyio.Event()
        #: Monotonic time the loops last made progress (for the systemd watchdog).
        self.heartbeat = monotonic()
        #: Wall time of the last complete discovery pass (readiness, poll lag).
        self.last_success: float | None = None
        #: Whether the server moves updateTime on new activities (list or timer mode).
        self._learning = UpdateTimeLearning(mode=settings.mode)
        #: Archived sessions not tracked yet (loaded once; see ``_load_known``).
        self._known: dict[str, KnownSession] = {}
        self._known_loaded = False
        #: New sessions being announced by one list reader (the other skips them).
        self._announcing: set[str] = set()
        #: The history walk: sessions found at the first start, newest first; the batch
        #: not written yet, and its names (not polled before their row exists).
        self._history_queue: deque[str] = deque()
        self._history_batch: list[Session] = []
        self._unrecorded: set[str] = set()
        self._history_wake = anyio.Event()
        #: Judges the session list's items (and notes sessions the client mended).
        self._screen = SessionScreen(metrics, account)

    def _stamp(self, event: events.Event) -> events.Event:
        """The event with ``data.account``: which account's session it is about."""
        return events.with_account(event, self.account)

    async def _announce(self, session: Session, *, deliver: bool) -> None:
        """Archive ``session.discovered`` (delivered when ``deliver``)."""
        event = events.session_discovered(session, now=self._clock())
        await self._ingest_session_events(session.name, [event], deliver=lambda _: deliver)

    def _deliverable(self, baseline: bool) -> Callable[[events.Event], bool]:
        """Which events of a session to deliver: all, unless the session is from before
        the first start; then only what happened upstream since."""
        epoch = self._epoch
        if not baseline or epoch is None:
            return lambda _: True
        return lambda event: event.occurred_ts >= epoch

    async def _ingest(
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
            max_media_bytes=self.settings.max_media_bytes,
            now=self._clock(),
            account=self.account,
        )
        new = 0
        start = 0
        while start < len(built):
            flag = deliver(built[start])
            end = start + 1
            while end < len(built) and deliver(built[end]) == flag:
                end += 1
            chunk = built[start:end]
            added = await self._store.ingest_activities(
                session.name,
                list(batch[start:end]),
                chunk,
                flag,
                cursor_limit=cursor_limit,
                raws=raws[start:end],
            )
            self._count_ingested(added)
            for name in added.conflicts:
                await self._refuse(
                    session.name, name, "duplicate_name", detail="archived under another session"
                )
            new += added.activities
            start = end
        return new

    async def _ingest_session_events(
        self, name: str, found: list[events.Event], *, deliver: Callable[[events.Event], bool]
    ) -> None:
        found = [self._stamp(e) for e in found]
        for flag in (False, True):
            chosen = [e for e in found if deliver(e) == flag]
            if chosen:
                added = await self._store.ingest_session_events(name, chosen, flag)
                self._count_ingested(added)

    async def _refuse(
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
        """Record, count and log one refused activity (loudly the first time it is met).

        Text that came from upstream and is not Unicode (a lone surrogate a scan let
        through) is kept with a replacement character: the store and the log take it."""
        name, create_time, detail = (_unicode(t) for t in (name, create_time, detail))
        first = await self._store.refuse_activity(
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
            self._metrics.activity_refused(reason)
        (_log.warning if first else _log.debug)(
            "poll.activity_refused",
            session=session,
            name=name[:200],
            reason=reason,
            create_time=create_time[:64],
            detail=detail,
        )

    def _count_failure(self, loop: str, exc: ApiError) -> None:
        if self._metrics is not None:
            self._metrics.upstream_failed(loop, exc.kind)

    def _backoff(self, tracked: _Tracked, exc: ApiError) -> None:
        self._count_failure("session", exc)
        tracked.errors += 1
        tracked.last_error = exc
        delay = self._failure_delay(exc, tracked.errors)
        tracked.backoff_until = self._mono() + delay
        # Overrides a sooner time that discovery set while this poll ran: Retry-After wins.
        tracked.due_at = tracked.backoff_until
        tracked.timer_due = False
        self._changed.set()
        self._log_failure("poll.failed", exc, delay, attempt=tracked.errors, session=tracked.name)

    def _failure_delay(
        self, exc: ApiError, errors: int, backoff: tuple[float, float] | None = None
    ) -> float:
        s = self.settings
        base, cap = backoff if backoff is not None else (s.backoff_base, s.backoff_cap)
        retry_after = exc.retry_after if isinstance(exc, ApiStatusError) else None
        delay = backoff_delay(errors, retry_after, base=base, cap=cap, rng=self._rng)
        if isinstance(exc, UnauthenticatedError):
            # Retrying a rejected key fast helps nobody; slowly, so a fixed key is noticed.
            delay = max(delay, s.unauthenticated_delay)
        return delay

    def _log_failure(self, event: str, exc: ApiError, delay: float, **fields: object) -> None:
        fields["account"] = self.account
        if isinstance(exc, UnauthenticatedError):
            _log.error(
                "upstream.unauthenticated",
                message="API key rejected by the Sessions API; check api.api_key_env/_file",
                error=str(exc),
                retry_in=round(delay, 2),
                **fields,
            )
            return
        if isinstance(exc, MalformedResponseError):
            _log.warning(
                event,
                reason="malformed response",
                kind=exc.kind,
                error=str(exc),
                body=exc.body[:200],
                retry_in=round(delay, 2),
                **fields,
            )
            return
        _log.warning(event, kind=exc.kind, error=str(exc), retry_in=round(delay, 2), **fields)

    def _count_ingested(self, added: Ingested) -> None:
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


def _unicode(text: str) -> str:
    """``text`` with any lone surrogate replaced (``?``), so that it can be encoded."""
    return text.encode("utf-8", "replace").decode("utf-8")
