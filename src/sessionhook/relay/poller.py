"""Discovery and per-session activity polling: the relay's only reader of the Sessions API.

Two loops share one request budget (the :class:`~sessionhook.relay.ratelimit.RateLimiter`
installed on the upstream HTTP client):

* **Discovery** walks every page of the session list each ``discovery_interval``. A new
  session is fetched whole, archived and announced (``session.discovered``); if that GET
  fails (404 right after creation, 5xx...) the session is asked again on a short backoff of
  its own, without failing the pass or holding up the others.
  A session whose state or ``updateTime`` moved is scheduled for an activity poll; an
  unchanged idle session costs nothing more.
* **The scheduler** starts activity polls most overdue session first, so dozens of sessions
  share the budget fairly, in a pool large enough (``concurrency``) that a session whose
  upstream answers slowly holds up only itself. Working sessions (QUEUED, PLANNING,
  IN_PROGRESS) are polled every ``active_interval``; the others only when discovery saw
  their ``updateTime`` move, at most once per ``idle_interval``, and at once after a state
  change.

An activity poll walks every page of the session's activities from its cursor (the newest
archived ``createTime``, minus a small overlap); the store archives each activity name
once, so a server that treats the ``createTime`` bound inclusively, exclusively or ignores
it are all safe, and so are repeated pages. After new activities that can come with a
change of the session (anything but progress updates), or a change seen by discovery, the
session is fetched once: a new state gives ``session.state_changed``, a new pull request
in ``outputs`` gives ``session.pull_request_opened``.

``backfill = false``: the first discovery records the first start in the store; events
whose upstream time is older (the history of sessions created before it) are archived but
not delivered. Sessions created after it are delivered whole, even when a failing upstream
delayed their discovery.

Failures never skip anything: the cursor only moves over archived activities, so a failed
poll is simply tried again. A full disk pauses polling: the writes in progress wait for space
(:class:`~sessionhook.relay.store.AsyncStore`), no new poll or discovery pass starts until a
write succeeds again. 429/5xx/timeouts/malformed answers back that session (or
discovery) off, exponentially and capped, never sooner than ``Retry-After``; the other
sessions go on. A 404 on a session first seen less than 30 s ago is the service's eventual
consistency and is retried; a later 404 means the session was deleted and it is dropped.
A rejected API key (401) is logged loudly and retried slowly.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

import anyio
import anyio.abc

from sessionhook.api.client import SessionsClient
from sessionhook.api.errors import (
    ApiError,
    ApiStatusError,
    InvalidArgumentError,
    MalformedResponseError,
    NotFoundError,
    UnauthenticatedError,
)
from sessionhook.api.models import Activity, Session, format_timestamp, parse_timestamp

from . import events, lifecycle
from .config import Config
from .logging import get_logger
from .metrics import Metrics
from .store import AsyncStore, Ingested, SessionRow

__all__ = ["ACTIVE_STATES", "EPOCH_KEY", "OnceReport", "PollSettings", "Poller", "backoff_delay"]

#: ``meta`` key of the first start (Unix seconds): what came before is not delivered unless
#: ``poll.backfill``.
EPOCH_KEY = "first_started_at"

#: States in which the agent works and new activities are expected any moment.
ACTIVE_STATES: frozenset[str] = frozenset({"QUEUED", "PLANNING", "IN_PROGRESS"})

_log = get_logger()


@dataclass(frozen=True)
class PollSettings:
    """The poller's knobs; :meth:`from_config` takes them from the ``[poll]`` section."""

    active_interval: float = 2.0
    idle_interval: float = 30.0
    discovery_interval: float = 10.0
    backfill: bool = False
    max_media_bytes: int = 262144
    #: Session polls running at once. The request budget is the real bound; this only
    #: caps tasks, and is large so that sessions whose upstream answers slowly hold their
    #: own slot, not everybody's.
    concurrency: int = 32
    page_size: int = 100
    #: Backoff after an upstream failure: ``base * 2**(n-1)``, capped, +-20 % jitter.
    backoff_base: float = 1.0
    backoff_cap: float = 30.0
    #: The slower pace after the API key was rejected.
    unauthenticated_delay: float = 60.0
    #: How far before the cursor the activity list is asked from (equal createTimes on a
    #: page boundary, late commits); duplicates are dropped by name.
    cursor_overlap: float = 1.0
    #: A 404 on a session first seen less recently than this means it was deleted.
    young_session: float = 30.0
    #: Backoff (base, cap) of the one GET that announces a new session: short, since it
    #: is asked once per session and everything about the session waits for it.
    announce_backoff: tuple[float, float] = (0.25, 1.0)

    @classmethod
    def from_config(cls, config: Config) -> PollSettings:
        """Settings from a loaded config; the rest keep their defaults."""
        return cls().with_config(config)

    def with_config(self, config: Config) -> PollSettings:
        """These settings with the values the config sets (a reload keeps the others)."""
        return replace(
            self,
            active_interval=config.poll.active_interval,
            idle_interval=config.poll.idle_interval,
            discovery_interval=config.poll.discovery_interval,
            backfill=config.poll.backfill,
            max_media_bytes=config.delivery.max_media_bytes,
        )


def _unix(text: str) -> float | None:
    try:
        return parse_timestamp(text).timestamp() if text else None
    except ValueError:
        return None


def _may_change_session(activity: Activity, cursor: str | None) -> bool:
    """Whether ``activity`` is past ``cursor`` and of a kind that comes with a state change
    or a new output (anything but a progress update: plans, messages, completion...)."""
    if activity.event_member == "progressUpdated":
        return False
    if not cursor:
        return True
    try:
        return parse_timestamp(activity.create_time) > parse_timestamp(cursor)
    except ValueError:
        return True


def backoff_delay(
    errors: int,
    retry_after: float | None,
    *,
    base: float,
    cap: float,
    rng: random.Random,
) -> float:
    """Seconds to wait after the ``errors``-th consecutive failure (pure).

    ``base * 2**(errors-1)`` capped at ``cap``, spread +-20 %; never less than the server's
    ``Retry-After`` (which is honoured even above the cap).
    """
    exponent = min(max(errors, 1) - 1, 32)
    delay = min(cap, base * 2.0**exponent) * rng.uniform(0.8, 1.2)
    if retry_after is not None and math.isfinite(retry_after):
        delay = max(delay, retry_after)
    return delay


@dataclass
class _Tracked:
    """What the scheduler knows about one session (the store keeps the durable part)."""

    name: str
    state: str
    first_seen: float  # monotonic
    #: ``updateTime`` of the last completed poll (the store's ``polled_update_time``).
    polled_update_time: str | None
    #: ``updateTime`` the session list showed last.
    listed_update_time: str | None = None
    due_at: float | None = None  # monotonic; None = idle, wait for discovery
    refresh: bool = False  # fetch the session after the next poll even if nothing new
    #: Walk the next poll from the first activity, not from the cursor (see ``_on_listed``).
    sweep: bool = False
    last_polled: float | None = None  # monotonic
    errors: int = 0
    last_error: ApiError | None = None
    backoff_until: float = 0.0
    running: bool = False
    gone_at_update_time: str | None = None  # set when a 404 said the session was deleted


@dataclass
class _Pending:
    """A new session whose first GET failed; announced once a GET succeeds."""

    listed: Session
    first_seen: float  # monotonic
    errors: int = 0
    retry_at: float = 0.0  # monotonic


@dataclass
class OnceReport:
    """What :meth:`Poller.run_once` achieved."""

    sessions_polled: int = 0
    failed: list[str] = field(default_factory=list)
    #: The 401 that stopped the pass, when the API key was rejected.
    unauthenticated: UnauthenticatedError | None = None


class Poller:
    """Discovery plus the per-session scheduler; see the module docstring.

    ``on_enqueued`` is called whenever an ingest enqueued deliveries (the dispatcher's
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
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._store = store
        self.settings = settings
        self._on_enqueued = on_enqueued
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

    # ------------------------------------------------------------------ public loops

    async def run(self) -> None:
        """Discovery and the scheduler, forever (until cancelled)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._discovery_loop)
            await self._schedule_loop(tg)

    async def run_once(self, *, max_attempts: int = 4) -> OnceReport:
        """One full pass: discovery, then every new, changed or working session polled.

        Transient failures are retried up to ``max_attempts`` times each (honouring
        backoff). A rejected API key ends the pass (``report.unauthenticated``).
        """
        report = OnceReport()
        for attempt in range(1, max_attempts + 1):
            try:
                await self.discover()
            except UnauthenticatedError as exc:
                self._discovery_failed(exc)
                report.unauthenticated = exc
                return report
            except ApiError as exc:
                delay = self._discovery_failed(exc)
                if attempt == max_attempts:
                    report.failed.append("discovery")
                    return report
                await anyio.sleep(delay)
            else:
                break
        # New sessions whose GET failed: give the service a moment, then ask again.
        for _ in range(max_attempts):
            if not self._pending:
                break
            due = min(p.retry_at for p in self._pending.values())
            await anyio.sleep(max(0.0, due - self._mono()))
            try:
                await self._retry_pending()
            except UnauthenticatedError as exc:
                report.unauthenticated = exc
                return report
        report.failed.extend(sorted(self._pending))
        todo = [self._tracked[name] for name in self.due(math.inf)]
        limiter = anyio.CapacityLimiter(self.settings.concurrency)

        async def poll_until_done(tracked: _Tracked) -> None:
            for attempt in range(1, max_attempts + 1):
                if report.unauthenticated is not None:
                    return
                async with limiter:
                    outcome = await self._poll_guarded(tracked)
                if outcome == "auth" and isinstance(tracked.last_error, UnauthenticatedError):
                    report.unauthenticated = tracked.last_error
                    return
                if outcome in ("ok", "gone"):
                    report.sessions_polled += 1
                    return
                if attempt < max_attempts:
                    await anyio.sleep(max(0.0, tracked.backoff_until - self._mono()))
            report.failed.append(tracked.name)

        async with anyio.create_task_group() as tg:
            for tracked in todo:
                tg.start_soon(poll_until_done, tracked)
        return report

    async def poll_due(self) -> dict[str, str]:
        """Poll every session due now, once, ``concurrency`` at a time (tests, tools).

        Returns each polled session's outcome: ``ok``, ``retry``, ``gone`` or ``auth``.
        """
        outcomes: dict[str, str] = {}
        limiter = anyio.CapacityLimiter(self.settings.concurrency)

        async def poll(tracked: _Tracked) -> None:
            async with limiter:
                outcomes[tracked.name] = await self._poll_guarded(tracked)

        async with anyio.create_task_group() as tg:
            for name in self.due(self._mono()):
                tg.start_soon(poll, self._tracked[name])
        return outcomes

    # ------------------------------------------------------------------ discovery

    async def discover(self) -> None:
        """Walk the session list once; announce new sessions and schedule changed ones."""
        await self._load_epoch()
        listed = 0
        async for session in self._client.iter_sessions(page_size=self.settings.page_size):
            if not listed:
                # A page came: a later failure of this pass is no reason to back off longer.
                self._discovery_errors = 0
            listed += 1
            await self._on_listed(session)
        if not await self._store.is_baseline_complete():
            await self._store.mark_baseline_complete()
        self._discovery_errors = 0
        self.last_success = self._clock()
        await self._store.mark_poll(True, self.last_success)
        if self._metrics is not None:
            self._metrics.poll_succeeded(self.last_success)
        _log.debug("discovery.done", sessions=listed, tracked=len(self._tracked))

    async def _on_listed(self, listed: Session) -> None:
        now = self._mono()
        tracked = self._tracked.get(listed.name)
        if tracked is None:
            row = await self._store.get_session(listed.name)
            if row is None:
                pending = self._pending.setdefault(listed.name, _Pending(listed, first_seen=now))
                pending.listed = listed
                if pending.retry_at <= now:  # else it waits for its own backoff
                    await self._retry_pending([listed.name])
                return
            # Known from an earlier run. Announcing it again is a no-op (same event id)
            # unless the previous run died between archiving the session and announcing it.
            await self._announce(row.to_session(), deliver=not row.baseline)
            tracked = _Tracked(
                name=row.name,
                state=row.state,
                first_seen=now - max(0.0, self._clock() - row.first_seen_at),
                polled_update_time=row.polled_update_time,
            )
            self._tracked[listed.name] = tracked
        tracked.listed_update_time = listed.update_time
        if tracked.gone_at_update_time is not None:
            if listed.update_time == tracked.gone_at_update_time:
                return
            tracked.gone_at_update_time = None  # it changed since: try again
        active = listed.state in ACTIVE_STATES
        if listed.state != tracked.state:
            # Immediate, and fetch the session afterwards for the state_changed event.
            self._schedule(tracked, now, refresh=True)
        elif listed.update_time != tracked.polled_update_time:
            # Working sessions are polled for their activities anyway; an idle one that
            # moved may also have a new output (pull request), so it is fetched too.
            last = tracked.last_polled
            at = now if active or last is None else max(now, last + self.settings.idle_interval)
            self._schedule(tracked, at, refresh=not active)
        elif active and tracked.due_at is None and not tracked.running:
            self._schedule(tracked, now)

    async def _retry_pending(self, names: Sequence[str] | None = None) -> None:
        """GET new sessions (``names``, or every pending one that is due) and announce
        those that answer. A failure leaves the session pending with a backoff of its own
        (honouring ``Retry-After``), so it neither fails nor slows the discovery pass.
        After ``young_session`` seconds the list item is announced instead, so that a
        session is never held back for long (its url and source come with the next fetch).
        A rejected key (401) propagates: the whole pass failed.
        """
        now = self._mono()
        if names is None:
            names = [n for n, p in self._pending.items() if p.retry_at <= now]
        for name in names:
            pending = self._pending[name]
            try:
                session = await self._client.get_session(name)
            except UnauthenticatedError:
                raise
            except ApiError as exc:
                pending.errors += 1
                delay = self._failure_delay(exc, pending.errors, self.settings.announce_backoff)
                pending.retry_at = self._mono() + delay
                if self._mono() - pending.first_seen < self.settings.young_session:
                    self._log_failure(
                        "discovery.get_failed", exc, delay, session=name, attempt=pending.errors
                    )
                    continue
                session = pending.listed
            del self._pending[name]
            await self._discovered(session, pending)

    async def _discovered(self, session: Session, pending: _Pending) -> None:
        """A session seen for the first time: archive, announce, poll it now."""
        baseline = self._is_baseline(session)
        await self._store.upsert_session(session, baseline=baseline)
        await self._announce(session, deliver=not baseline)
        _log.info(
            "session.discovered", session=session.name, state=session.state, baseline=baseline
        )
        tracked = _Tracked(
            name=session.name,
            state=session.state,
            first_seen=pending.first_seen,
            polled_update_time=None,
            listed_update_time=pending.listed.update_time,
        )
        self._tracked[session.name] = tracked
        self._schedule(tracked, self._mono())

    async def _announce(self, session: Session, *, deliver: bool) -> None:
        event = events.session_discovered(session, now=self._clock())
        await self._ingest_session_events(session.name, [event], deliver=lambda _: deliver)

    async def _load_epoch(self) -> float:
        """The first start of this store (Unix seconds), recorded at the first discovery."""
        if self._epoch is None:
            raw = await self._store.call(self._store.store.get_meta, EPOCH_KEY)
            if raw is None:
                self._epoch = self._clock()
                await self._store.write(self._store.store.set_meta, EPOCH_KEY, repr(self._epoch))
            else:
                self._epoch = float(raw)
        return self._epoch

    def _is_baseline(self, session: Session) -> bool:
        """Whether ``session`` existed before the first start (and backfill is off)."""
        if self.settings.backfill or self._epoch is None:
            return False
        created = _unix(session.create_time)
        return created is not None and created < self._epoch

    def _deliverable(self, baseline: bool) -> Callable[[events.Event], bool]:
        """Which events of a session to deliver: all, unless the session is from before
        the first start; then only what happened upstream since."""
        epoch = self._epoch
        if not baseline or epoch is None:
            return lambda _: True
        return lambda event: event.occurred_ts >= epoch

    async def _discovery_loop(self) -> None:
        while True:
            if self._store.unwritable is not None:
                # A full disk: nothing polled could be archived. Pause (the store probes
                # itself with growing delays) instead of spending the request budget.
                self.first_pass_done.set()  # readiness then reports the full store
                await self._store.wait_writable()
            started = self._mono()
            try:
                await self.discover()
                wait = self.settings.discovery_interval - (self._mono() - started)
            except ApiError as exc:
                wait = self._discovery_failed(exc)
                await self._store.mark_poll(False, self._clock())
            finally:
                self.first_pass_done.set()
                self.heartbeat = self._mono()
            self._changed.set()
            next_pass = self._mono() + max(0.0, wait)
            # Between passes, new sessions whose GET failed are asked again when due.
            while self._pending:
                due = min(p.retry_at for p in self._pending.values())
                if due >= next_pass:
                    break
                await anyio.sleep(max(0.0, due - self._mono()))
                try:
                    await self._retry_pending()
                except UnauthenticatedError as exc:
                    next_pass = self._mono() + self._discovery_failed(exc)
                    break
            await anyio.sleep(max(0.0, next_pass - self._mono()))

    def _discovery_failed(self, exc: ApiError) -> float:
        self._discovery_errors += 1
        delay = self._failure_delay(exc, self._discovery_errors)
        self._log_failure("discovery.failed", exc, delay, attempt=self._discovery_errors)
        return delay

    # ------------------------------------------------------------------ scheduling

    def _schedule(self, tracked: _Tracked, at: float, *, refresh: bool = False) -> None:
        at = max(at, tracked.backoff_until)
        tracked.due_at = at if tracked.due_at is None else min(tracked.due_at, at)
        tracked.refresh = tracked.refresh or refresh
        self._changed.set()

    def due(self, now: float) -> list[str]:
        """Names of the sessions due for a poll at ``now``, most overdue first."""
        ready = [
            t
            for t in self._tracked.values()
            if t.due_at is not None and t.due_at <= now and not t.running
        ]
        ready.sort(key=lambda t: (t.due_at, t.name))
        return [t.name for t in ready]

    async def _schedule_loop(self, tg: anyio.abc.TaskGroup) -> None:
        running = 0

        async def poll(tracked: _Tracked) -> None:
            nonlocal running
            try:
                await self._poll_guarded(tracked)
            finally:
                tracked.running = False
                running -= 1
                self._changed.set()

        while True:
            self._changed = anyio.Event()
            now = self._mono()
            self.heartbeat = now
            # While the store is full no new poll starts (see _discovery_loop); the loop
            # keeps going round for the watchdog.
            due = [] if self._store.unwritable is not None else self.due(now)
            for name in due[: max(0, self.settings.concurrency - running)]:
                tracked = self._tracked[name]
                tracked.running = True
                running += 1
                tg.start_soon(poll, tracked)
            upcoming = [
                t.due_at for t in self._tracked.values() if t.due_at is not None and not t.running
            ]
            # Wake at the next due time, on a change, and at least every second (watchdog).
            wait = min([1.0, *(max(0.0, due - now) for due in upcoming)])
            if running >= self.settings.concurrency:
                wait = 1.0  # a finishing poll sets _changed
            with anyio.move_on_after(wait):
                await self._changed.wait()

    # ------------------------------------------------------------------ one session

    async def _poll_guarded(self, tracked: _Tracked) -> str:
        """Poll one session; turn upstream failures into a backoff. Returns the outcome.

        ``ok``, ``gone`` (deleted upstream), ``retry`` (backing off) or ``auth`` (key
        rejected). Anything that is not an upstream failure propagates: a bug or a broken
        store must stop the daemon loudly, not be retried forever.
        """
        tracked.due_at = None
        tracked.last_error = None
        try:
            await self._poll_session(tracked)
        except NotFoundError as exc:
            if self._mono() - tracked.first_seen < self.settings.young_session:
                self._backoff(tracked, exc)
                return "retry"
            tracked.gone_at_update_time = tracked.listed_update_time or ""
            tracked.refresh = False
            _log.warning("poll.session_gone", session=tracked.name, error=str(exc))
            return "gone"
        except InvalidArgumentError as exc:
            if self._time_filter:
                # A server that refuses the createTime parameter: walk everything instead
                # (dedupe by name keeps that correct) rather than never progress.
                self._time_filter = False
                _log.warning("poll.time_filter_refused", session=tracked.name, error=str(exc))
                self._schedule(tracked, self._mono())
                return "retry"
            self._backoff(tracked, exc)
            return "retry"
        except UnauthenticatedError as exc:
            self._backoff(tracked, exc)
            return "auth"
        except ApiError as exc:
            self._backoff(tracked, exc)
            return "retry"
        tracked.errors = 0
        tracked.backoff_until = 0.0
        return "ok"

    async def _poll_session(self, tracked: _Tracked) -> None:
        """One activity poll of a session (raises :class:`ApiError` on upstream failure)."""
        started = self._mono()
        row = await self._store.get_session(tracked.name)
        if row is None:  # pragma: no cover - tracked sessions are always archived first
            raise RuntimeError(f"{tracked.name} is tracked but not in the store")
        # Taken before the walk: anything that changes the session later moves updateTime
        # past it, so discovery schedules another poll.
        update_time = tracked.listed_update_time or row.update_time
        deliver = self._deliverable(row.baseline)
        session = row.to_session()
        since = None if tracked.sweep else self._since(row.activity_cursor)
        new = 0
        batch: list[Activity] = []
        # Whether an activity past the cursor may come with a state change or an output.
        telling = False
        try:
            async for activity in self._client.iter_activities(
                tracked.name, page_size=self.settings.page_size, create_time=since
            ):
                batch.append(activity)
                telling = telling or _may_change_session(activity, row.activity_cursor)
                if len(batch) >= self.settings.page_size:
                    new += await self._ingest(session, batch, deliver)
                    batch = []
        except ApiError:
            # Keep what arrived before the failure: the cursor only moves over archived
            # activities (oldest first), so the retry resumes without a gap.
            await self._ingest(session, batch, deliver)
            raise
        new += await self._ingest(session, batch, deliver)
        tracked.sweep = False  # stays set if the walk failed: the retry sweeps again
        # Progress updates, most of a session's activities, change neither its state nor
        # its outputs: fetching the session after them would double the request count.
        tracked.refresh = tracked.refresh or bool(new and telling)
        if tracked.refresh:  # stays set if the fetch fails: the next poll tries again
            fresh = await self._client.get_session(row.name)
            await self._session_changes(row, fresh, deliver)
            await self._store.upsert_session(fresh, baseline=row.baseline)
            if fresh.state != tracked.state and fresh.state not in ACTIVE_STATES:
                # A session that settles (waits, pauses, ends) is read once more from its
                # first activity: one committed late, with a createTime behind the cursor's
                # overlap, is archived before the session goes quiet. About a page each.
                tracked.sweep = True
                self._schedule(tracked, self._mono())
            tracked.state = fresh.state
            tracked.refresh = False
        elif row.last_polled_at is None:
            # The first poll of a session archived as it was discovered: pull requests it
            # already had are announced now, after its activities.
            await self._session_changes(row, session, deliver)
        tracked.last_polled = self._mono()
        if tracked.state in ACTIVE_STATES:
            self._schedule(tracked, started + self.settings.active_interval)
        tracked.polled_update_time = update_time
        wall = self._clock()
        next_wall = None if tracked.due_at is None else wall + (tracked.due_at - self._mono())
        await self._store.schedule_poll(tracked.name, next_wall, polled_update_time=update_time)
        if new:
            _log.info("poll.ingested", session=tracked.name, new=new)

    def _since(self, cursor: str | None) -> str | None:
        if not cursor or not self._time_filter:
            return None
        try:
            moment = parse_timestamp(cursor) - timedelta(seconds=self.settings.cursor_overlap)
        except ValueError:
            return None  # an unreadable cursor: walk everything, dedupe keeps it correct
        return format_timestamp(moment)

    async def _ingest(
        self,
        session: Session,
        batch: Sequence[Activity],
        deliver: Callable[[events.Event], bool],
    ) -> int:
        """Archive a batch; returns how many activities were new.

        Oldest first, the batch splits into at most a few runs of equal ``deliver`` (the
        history before the first start, then what came after), one transaction each.
        """
        built = [
            events.activity_event(
                session, a, max_media_bytes=self.settings.max_media_bytes, now=self._clock()
            )
            for a in batch
        ]
        new = 0
        start = 0
        while start < len(built):
            flag = deliver(built[start])
            end = start + 1
            while end < len(built) and deliver(built[end]) == flag:
                end += 1
            chunk = built[start:end]
            added = await self._store.ingest_activities(
                session.name, list(batch[start:end]), chunk, flag
            )
            self._count_ingested(added, enqueued=flag)
            new += added.activities
            start = end
        return new

    async def _session_changes(
        self, row: SessionRow, fresh: Session, deliver: Callable[[events.Event], bool]
    ) -> None:
        """Compare the archived session with a fresh copy: a pull request not announced yet
        (at a session's first poll: any) gives ``session.pull_request_opened``, a new state
        ``session.state_changed``, in that order (a session opens its pull request, then
        completes: a consumer that acts on COMPLETED has seen the pull request)."""
        found: list[events.Event] = []
        first_poll = row.last_polled_at is None
        # Event ids make a repeat harmless, so the first poll can announce them all.
        announced = set() if first_poll else {pr.url for pr in row.to_session().pull_requests}
        for pr in fresh.pull_requests:
            if pr.url and pr.url not in announced:
                found.append(events.pull_request_opened(fresh, pr, now=self._clock()))
                _log.info("session.pull_request_opened", session=row.name, url=pr.url)
        if row.state and fresh.state and fresh.state != row.state:
            found.append(events.session_state_changed(fresh, row.state, now=self._clock()))
            _log.info(
                "session.state_changed", session=row.name, previous=row.state, state=fresh.state
            )
        # Waiting for the user, completed, failed: keyed by the activity behind it (stable
        # per wait, new per completion), so deriving it again on every refresh is harmless.
        member = lifecycle.awaited_member(fresh.state)
        if member is not None:
            activity = await self._store.latest_activity(row.name, member)
            entered = first_poll or fresh.state != row.state
            found += lifecycle.lifecycle_events(
                fresh, activity, entered=entered, seen_until=row.update_time, now=self._clock()
            )
        if found:
            await self._ingest_session_events(row.name, found, deliver=deliver)

    async def _ingest_session_events(
        self, name: str, found: list[events.Event], *, deliver: Callable[[events.Event], bool]
    ) -> None:
        for flag in (False, True):
            chosen = [e for e in found if deliver(e) == flag]
            if chosen:
                added = await self._store.ingest_session_events(name, chosen, flag)
                self._count_ingested(added, enqueued=flag)

    # ------------------------------------------------------------------ failures

    def _backoff(self, tracked: _Tracked, exc: ApiError) -> None:
        tracked.errors += 1
        tracked.last_error = exc
        delay = self._failure_delay(exc, tracked.errors)
        tracked.backoff_until = self._mono() + delay
        # Overrides a sooner time that discovery set while this poll ran: Retry-After wins.
        tracked.due_at = tracked.backoff_until
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
                error=str(exc),
                body=exc.body[:200],
                retry_in=round(delay, 2),
                **fields,
            )
            return
        _log.warning(event, error=str(exc), retry_in=round(delay, 2), **fields)

    def _count_ingested(self, added: Ingested, *, enqueued: bool) -> None:
        """Count the newly archived events by type; wake the dispatcher if they were queued."""
        if not added.event_types:
            return
        if self._metrics is not None:
            for event_type in added.event_types:
                self._metrics.event_ingested(event_type)
        if enqueued:
            self._on_enqueued()
