"""One session's activity poll: walk its activities from the cursor, archive them, and
read the session again when it may have changed (state, pull requests)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import anyio

from sessionhook.api import RefusedItem
from sessionhook.api.errors import (
    ApiError,
    InvalidArgumentError,
    NotFoundError,
    UnauthenticatedError,
)
from sessionhook.api.models import Activity, Session, format_timestamp, parse_timestamp

from ..config import ConfigError
from ..domain import events, lifecycle
from ..domain.action_links import ActionLinks
from ..domain.rows import SessionRow
from ..store import Economy, Ingest, Leases, StoreUnwritableError
from ..telemetry.logs import get_logger
from .archive import Archive
from .failures import Failures
from .scheduling import Scheduler
from .screening import SessionScreen
from .settings import ACTIVE_STATES, name_problem
from .state import Awaiting, PollState, Tracked

_log = get_logger()

#: A session another replica is polling is asked again this many seconds later.
CLAIMED_RETRY = 1.0


class SessionPoll:
    """Polling one session; docs/polling.md has the rules. ``clock`` is wall time,
    ``monotonic`` drives the schedule."""

    def __init__(
        self,
        state: PollState,
        *,
        scheduler: Scheduler,
        archive: Archive,
        failures: Failures,
        screen: SessionScreen,
    ) -> None:
        self._state, self._client, self._store = state, state.client, state.store
        self._clock, self._mono = state.clock, state.monotonic
        self._scheduler = scheduler
        self._archive = archive
        self._failures = failures
        self._screen = screen
        self._time_filter = True  # cleared if the server rejects the createTime parameter

    async def poll(self, tracked: Tracked) -> str:
        """Poll one session; turn upstream failures into a backoff. Returns the outcome.

        ``ok``, ``gone`` (deleted upstream), ``retry`` (backing off) or ``auth`` (key
        rejected). Anything that is not an upstream failure propagates: a bug or a broken
        store must stop the daemon loudly, not be retried forever.
        """
        tracked.due_at = None
        tracked.last_error = None
        if not self._store.replica.claims:
            # Alone on the store (or not a replica): claims are no-ops, so the two thread
            # hand-offs they cost per poll are not made.
            return await self._poll_claimed(tracked)
        # One replica polls a session at a time (its claim; see store/leases.py).
        if not await self._store.run(Leases.claim_session_poll, tracked.name, self._clock()):
            _log.debug("poll.claimed_elsewhere", session=tracked.name)
            tracked.backoff_until = self._mono() + CLAIMED_RETRY
            self._scheduler.schedule(tracked, tracked.backoff_until)
            return "retry"
        try:
            return await self._poll_claimed(tracked)
        finally:
            # A store that cannot be written: the claim expires with the lease (or the
            # replica's clean stop frees it).
            with anyio.CancelScope(shield=True), contextlib.suppress(StoreUnwritableError):
                await self._store.run(Leases.release_session_poll, tracked.name)

    async def _poll_claimed(self, tracked: Tracked) -> str:
        """:meth:`poll` once the session's poll is this replica's."""
        try:
            await self._poll_session(tracked)
        except NotFoundError as exc:
            if self._mono() - tracked.first_seen < self._state.settings.young_session:
                self._back_off(tracked, exc)
                return "retry"
            tracked.gone_at_update_time = tracked.listed_update_time or ""
            tracked.refresh = False
            tracked.awaiting = None
            _log.warning("poll.session_gone", session=tracked.name, error=str(exc))
            await self._finish_history(tracked)
            return "gone"
        except InvalidArgumentError as exc:
            if self._time_filter:
                # A server that refuses the createTime parameter: walk everything instead
                # (dedupe by name keeps that correct) rather than never progress.
                self._time_filter = False
                _log.warning("poll.time_filter_refused", session=tracked.name, error=str(exc))
                self._scheduler.schedule(tracked, self._mono())
                return "retry"
            self._back_off(tracked, exc)
            return "retry"
        except UnauthenticatedError as exc:
            self._back_off(tracked, exc)
            return "auth"
        except ApiError as exc:
            self._back_off(tracked, exc)
            return "retry"
        tracked.errors = 0
        tracked.backoff_until = 0.0
        return "ok"

    def _back_off(self, tracked: Tracked, exc: ApiError) -> None:
        """A failed poll: the session waits (its own backoff), the others go on."""
        failures = self._failures
        failures.count("session", exc)
        tracked.errors += 1
        tracked.last_error = exc
        delay = failures.delay(exc, tracked.errors)
        tracked.backoff_until = self._mono() + delay
        # Overrides a sooner time that discovery set while this poll ran: Retry-After wins.
        self._scheduler.postpone(tracked, tracked.backoff_until)
        failures.log("poll.failed", exc, delay, attempt=tracked.errors, session=tracked.name)

    async def _poll_session(self, tracked: Tracked) -> None:
        """One activity poll of a session (raises :class:`ApiError` on upstream failure)."""
        started = self._mono()
        row = await self._store.run(Ingest.get_session, tracked.name)
        if row is None:  # pragma: no cover - tracked sessions are always archived first
            raise RuntimeError(f"{tracked.name} is tracked but not in the store")
        # Taken before the walk: anything that changes the session later moves updateTime
        # past it, so discovery schedules another poll.
        update_time = tracked.listed_update_time or row.update_time
        deliver = self._archive.deliverable(row.baseline)
        session = row.to_session()
        # A sweep walks from the first activity: this poll's, or one a wait (below) made.
        swept = tracked.sweep or (tracked.awaiting is not None and tracked.awaiting.swept)
        since = None if tracked.sweep else self._since(row.activity_cursor)
        new = 0
        announced = False  # session.discovered of a history session (see below)
        newest: datetime | None = None  # the newest createTime the walk saw (learning)
        # Whether an activity past the cursor may come with a state change or an output,
        # and whether one ends the run (sessionCompleted, sessionFailed).
        telling = ending = False
        # A first walk right after discovery's own GET: whether every activity it finds is
        # dated at or before that read (then the read already showed what they did).
        first_after_read = tracked.read_at_discovery and row.last_polled_at is None
        read = _moment(row.update_time) if first_after_read else None
        within_read = read is not None
        refreshed: Session | None = None  # the session read again after the walk
        read_first: Session | None = None  # a history session's read, before its walk
        if tracked.history and tracked.refresh:
            # Discovery recorded it from the list without announcing it: it is announced
            # now that the whole session is known (archived, not delivered), and before its
            # activities, as a new session is: a session's events are archived in the order
            # of their times (session.discovered is at the session's createTime). The read
            # the walk would make after it, made first.
            read_first = await self._client.get_session(row.name)
            self._screen.note_repairs(read_first)
            self._screen.note_values(read_first)
            await self._archive.announce(read_first, deliver=not row.baseline)
            announced = True
        # Page by page, oldest first: the cursor only moves over what is archived (or
        # refused), so a walk that fails half way resumes without a gap.
        async for page in self._client.walk_activities(
            tracked.name,
            page_size=self._state.settings.page_size,
            create_time=since,
            max_pages=self._state.settings.max_pages,
        ):
            limit = self._cursor_limit(page.server_time)
            if page.refused is not None:
                await self._refuse_oversize(tracked.name, page.refused, limit)
            for item in page.invalid:
                await self._archive.refuse(
                    tracked.name,
                    item.name,
                    "malformed",
                    create_time=item.create_time,
                    detail=item.detail,
                    size=item.size,
                )
            accepted = await self._screen_names(tracked.name, page.activities)
            for activity in accepted:
                telling = telling or _may_change_session(activity, row.activity_cursor)
                ending = ending or _ends_run(activity, row.activity_cursor)
                moment = _moment(activity.create_time)
                newest = _later(newest, moment)
                within_read = within_read and _not_after(moment, read)
            new += await self._archive.activities(session, accepted, deliver, cursor_limit=limit)
        tracked.sweep = False  # stays set if the walk failed: the retry sweeps again
        if within_read:
            # The archived row is what discovery's own GET read just before this first
            # walk, and no activity is newer than that read (nor undated): none of them
            # can come with a change it did not show. A change without one moves the
            # list's state or updateTime, which schedules a refresh like any later change.
            # (A backfill: 2 requests per session instead of 3.)
            telling = ending = False
        tracked.read_at_discovery = False
        if new and telling:
            self._read_after_walk(tracked, row, ending=ending)
        # The session's first changes: at its first poll, or a wait for the activity behind
        # its state that began there.
        first_poll = row.last_polled_at is None or (
            tracked.awaiting is not None and tracked.awaiting.first_poll
        )
        if tracked.refresh:  # stays set if the fetch fails: the next poll tries again
            fresh = read_first
            if fresh is None:
                fresh = await self._client.get_session(row.name)
                self._screen.note_values(fresh)
                self._screen.note_repairs(fresh)
            if await self._changes_or_wait(tracked, row, fresh, deliver, first_poll=first_poll):
                refreshed = fresh  # archived with the poll's schedule below (one store call)
                settles = fresh.state != tracked.state and fresh.state not in ACTIVE_STATES
                if settles and not swept:
                    # A session that settles (waits, pauses, ends) is read once more from
                    # its first activity: one committed late, with a createTime behind the
                    # cursor's overlap, is archived before the session goes quiet. About a
                    # page each. Not when this walk was that sweep already (the list showed
                    # the session settled before it began: see Discovery.on_listed).
                    tracked.sweep = True
                    self._scheduler.schedule(tracked, self._mono())
                tracked.moved_to(fresh.state)
                tracked.refresh = False
                tracked.untold = False
            elif tracked.awaiting is not None:
                tracked.awaiting.swept = tracked.awaiting.swept or swept
        elif first_poll:
            # The first poll of a session archived as it was discovered: pull requests it
            # already had are announced now, after its activities.
            await self._changes_or_wait(tracked, row, session, deliver, first_poll=True)
        tracked.last_polled = self._mono()
        if new and newest is not None and row.last_polled_at is not None:
            # Evidence for the learning, judged by the next list read: did the list show
            # updateTime move to (at least) this activity? Not from a session's first poll,
            # where the whole history is new.
            tracked.check = (newest, tracked.last_polled, tracked.polled_update_time)
        if tracked.state in ACTIVE_STATES and tracked.awaiting is None:
            # (A session waiting for the activity behind its new state is on that wait's
            # schedule: see _changes_or_wait.)
            self._scheduler.schedule(
                tracked, started + self._scheduler.active_interval(tracked), timer=True
            )
        tracked.polled_update_time = update_time
        wall = self._clock()
        next_wall = None if tracked.due_at is None else wall + (tracked.due_at - self._mono())
        await self._store.run(
            Ingest.finish_poll,
            tracked.name,
            refreshed,
            baseline=row.baseline,
            next_poll_at=next_wall,
            polled_update_time=update_time,
        )
        if tracked.history and not announced:
            await self._archive.announce(session, deliver=not row.baseline)
        await self._finish_history(tracked)
        if new:
            _log.info("poll.ingested", session=tracked.name, new=new)

    def _read_after_walk(self, tracked: Tracked, row: SessionRow, *, ending: bool) -> None:
        """A walk found activities that may come with a change of the session (not progress
        updates): read it now (``refresh``), unless the list's head is read and shows the
        session, where the change will show within a ``list_interval`` (``untold``). The end of
        a run (``ending``) is read at once; a first poll and the history walk's keep the read."""
        if tracked.refresh:
            return
        told = row.last_polled_at is not None and not tracked.history and not ending
        if told and self._scheduler.list_tells(tracked):
            tracked.untold = True
        else:
            tracked.refresh = True

    async def _finish_history(self, tracked: Tracked) -> None:
        """A session of the history walk is archived (or gone): not walked again."""
        if tracked.history:
            tracked.history = False
            await self._store.run(Economy.finish_history, tracked.name, self._clock())

    def _since(self, cursor: str | None) -> str | None:
        if not cursor or not self._time_filter:
            return None
        try:
            moment = parse_timestamp(cursor) - timedelta(
                seconds=self._state.settings.cursor_overlap
            )
        except (ValueError, OverflowError):
            return None  # an unreadable cursor: walk everything, dedupe keeps it correct
        return format_timestamp(moment)

    def _cursor_limit(self, server_time: datetime | None) -> str | None:
        """The latest time the cursor may move to: the service's clock plus a small skew
        (the local clock plus a larger one when the answer had no ``Date``)."""
        s = self._state.settings
        if server_time is None:
            base, skew = datetime.fromtimestamp(self._clock(), UTC), s.unsynced_clock_skew
        else:
            base, skew = server_time, s.clock_skew
        try:
            return format_timestamp(base + timedelta(seconds=skew))
        except OverflowError:  # a Date header at the end of time bounds nothing
            return None

    async def _screen_names(self, session: str, activities: Sequence[Activity]) -> list[Activity]:
        """The activities whose name is one of ``session``'s; the others are refused."""
        accepted = []
        for activity in activities:
            problem = name_problem(activity.name, session)
            if problem is None:
                accepted.append(activity)
            else:
                await self._archive.refuse(
                    session,
                    activity.name,
                    problem,
                    create_time=activity.create_time,
                    detail=f"listed under {session}",
                )
        return accepted

    async def _refuse_oversize(self, session: str, item: RefusedItem, limit: str | None) -> None:
        """A single activity too large to read: recorded, and the cursor moves past it when
        its name says it is this session's (else its time is not trusted either)."""
        own = bool(item.name) and name_problem(item.name, session) is None
        await self._archive.refuse(
            session,
            item.name,
            "too_large",
            create_time=item.create_time,
            detail=f"{item.size} bytes or more; api.max_response_bytes is {item.limit}",
            size=item.size,
            cursor_limit=limit,
            advance_cursor=own,
        )

    async def _changes_or_wait(
        self,
        tracked: Tracked,
        row: SessionRow,
        fresh: Session,
        deliver: Callable[[events.Event], bool],
        *,
        first_poll: bool,
    ) -> bool:
        """Announce what changed (:meth:`_session_changes`) and return ``True``; or, when
        ``fresh`` shows a waiting or final state whose activity is not archived yet, announce
        and archive nothing, walk the session again soon (0.5 s, doubling) and return ``False``,
        until ``lifecycle_wait`` has passed. (A session first seen in such a state is told at
        once: waiting for each would stall the history.)"""
        member = lifecycle.awaited_member(fresh.state)
        changed = fresh.state != row.state
        entered = first_poll or changed
        activity = (
            None
            if member is None
            else await self._store.run(Ingest.latest_activity, row.name, member)
        )
        if member is not None and changed and not lifecycle.explains(activity, row.update_time):
            now = self._mono()
            waiting = tracked.awaiting
            if waiting is None:  # (a first poll's wait: the state changed since discovery)
                waiting = Awaiting(now + self._state.settings.lifecycle_wait, first_poll=first_poll)
                tracked.awaiting = waiting
            if now < waiting.until:
                waiting.tries += 1
                delay = min(0.5 * 2.0 ** (waiting.tries - 1), waiting.until - now)
                tracked.refresh = True
                self._scheduler.schedule(tracked, now + delay)
                _log.debug(
                    "poll.lifecycle_waiting", session=row.name, state=fresh.state, member=member
                )
                return False
            _log.info("poll.lifecycle_unexplained", session=row.name, state=fresh.state)
        tracked.awaiting = None
        await self._session_changes(
            row, fresh, deliver, first_poll=first_poll, entered=entered, activity=activity
        )
        return True

    async def _session_changes(
        self,
        row: SessionRow,
        fresh: Session,
        deliver: Callable[[events.Event], bool],
        *,
        first_poll: bool,
        entered: bool,
        activity: Activity | None,
    ) -> None:
        """Compare the archived session with a fresh copy: ``session.pull_request_opened`` for a
        pull request not announced yet, then ``session.state_changed`` (so a consumer acting on
        COMPLETED has seen the pull request), then the lifecycle event of the state."""
        found: list[events.Event] = []
        # Event ids make a repeat harmless, so the first poll can announce them all.
        announced = set() if first_poll else {pr.url for pr in row.to_session().pull_requests}
        for pr in fresh.pull_requests:
            if pr.url and pr.url not in announced:
                found.append(events.pull_request_opened(fresh, pr, now=self._clock()))
                _log.info("session.pull_request_opened", session=row.name, url=pr.url)
        was_archived = bool(row.to_session().archived)
        if not first_poll and bool(fresh.archived) != was_archived:
            found.append(events.archived_changed(fresh, now=self._clock()))
            _log.info("session.archived_changed", session=row.name, archived=bool(fresh.archived))
        if row.state and fresh.state and fresh.state != row.state:
            found.append(events.session_state_changed(fresh, row.state, now=self._clock()))
            _log.info(
                "session.state_changed", session=row.name, previous=row.state, state=fresh.state
            )
        # Waiting for the user, completed, failed: keyed by the activity behind it (stable
        # per wait, new per completion), so deriving it again on every refresh is harmless.
        found += lifecycle.lifecycle_events(
            fresh,
            activity,
            entered=entered,
            seen_until=row.update_time,
            now=self._clock(),
            account=self._archive.account,
            links=self._action_links(fresh),
        )
        if found:
            await self._archive.session_events(row.name, found, deliver=deliver)

    def _action_links(self, session: Session) -> ActionLinks | None:
        """The signer of ``session``'s action links when it waits for its user; a key file that
        cannot be read now costs this event its links (logged), not the event."""
        make = self._state.settings.action_links
        if make is None or lifecycle.awaited_member(session.state) not in _WAITS:
            return None
        try:
            return make()
        except ConfigError as exc:
            _log.error("actions.key_unreadable", session=session.name, error=str(exc))
            return None


#: The activities a person answers (the waits that get action links).
_WAITS = frozenset({"planGenerated", "agentMessaged"})


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


#: Activities that end a run (the session completes or fails with them).
_ENDING = frozenset({"sessionCompleted", "sessionFailed"})


def _ends_run(activity: Activity, cursor: str | None) -> bool:
    """Whether ``activity`` is past ``cursor`` and ends the session's run."""
    return activity.event_member in _ENDING and _may_change_session(activity, cursor)


def _moment(text: str) -> datetime | None:
    """The timestamp ``text`` (``None``: unreadable)."""
    try:
        return parse_timestamp(text)
    except ValueError:
        return None


def _not_after(moment: datetime | None, bound: datetime | None) -> bool:
    """Whether both are known and ``moment`` is not later than ``bound``."""
    return moment is not None and bound is not None and moment <= bound


def _later(best: datetime | None, moment: datetime | None) -> datetime | None:
    """The later of the two (an unknown one is ignored)."""
    if moment is None or (best is not None and best >= moment):
        return best
    return moment
