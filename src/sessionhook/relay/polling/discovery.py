"""Discovery: walk the session list, announce new sessions, schedule the changed ones."""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import aclosing

import anyio

from sessionhook.api.client import ARCHIVED_FILTER
from sessionhook.api.errors import (
    ApiError,
    InvalidArgumentError,
    PageLimitError,
    UnauthenticatedError,
)
from sessionhook.api.models import Session
from sessionhook.wording import counted

from ..config import DEFAULT_ACCOUNT
from ..domain import events
from ..store import ArchivedSession, Economy, Ingest, MetaQueries
from ..telemetry.logs import get_logger
from .archive import Archive
from .failures import Failures
from .history import HistoryWalk
from .learning import judge
from .scheduling import Scheduler
from .screening import SessionScreen
from .settings import ACTIVE_STATES, VERDICT_KEY
from .state import Pending, PollState, Tracked

_log = get_logger()


class Discovery:
    """The session list's readers (the full pass and the head); see the package docstring.

    A new session is archived and announced through ``archive`` and scheduled on
    ``scheduler``; one of the history is queued on ``history``. ``clock`` is wall time,
    ``monotonic`` drives the schedule (both injectable for tests).
    """

    def __init__(
        self,
        state: PollState,
        *,
        scheduler: Scheduler,
        archive: Archive,
        failures: Failures,
        history: HistoryWalk,
        screen: SessionScreen,
    ) -> None:
        self._state, self._client, self._store = state, state.client, state.store
        self._clock, self._mono = state.clock, state.monotonic
        self._metrics, self._account = state.metrics, state.account
        self._scheduler = scheduler
        self._archive = archive
        self._failures = failures
        self._history = history
        self._screen = screen
        #: Consecutive failed passes (the pass's own backoff).
        self._errors = 0
        #: Untracked sessions of the page being read that are archived already (see
        #: ``_look_up``), and whether the history walk's queue was loaded (``_load_history``).
        self._archived: dict[str, ArchivedSession] = {}
        self._history_loaded = False
        #: New sessions being announced by one list reader (the other skips them).
        self._announcing: set[str] = set()
        #: The history sessions listed and not written yet, and their names (not polled
        #: before their row exists).
        self._history_batch: list[Session] = []
        self._unrecorded: set[str] = set()
        #: Whether the server lists archived sessions apart (``filter=archived = true``);
        #: ``False`` once it refused or ignored the filter (this process asks no more).
        self._archived_list = True
        #: When (monotonic) the last full pass began, and whether it read the list's first
        #: page: the head loop skips a read it covers, and waits while it failed.
        self._pass_began = -math.inf
        self._head_listed = False
        #: Set once a full pass read a page of the list (or the first one ended): the head
        #: is read from then on, during a first pass that takes long too (a restart over a
        #: large archive), so a session created meanwhile is found within a second.
        self._head_open = anyio.Event()
        #: The lists (``sessions``, ``archived sessions``) whose last full walk stopped at
        #: ``poll.max_pages`` with sessions still coming: warned once while it lasts.
        self._cut_lists: set[str] = set()
        #: Pages of the session lists the current (or last) full pass read.
        self._pages = 0

    async def discover(self) -> None:
        """Walk the session list once; announce new sessions and schedule changed ones."""
        await self._archive.load_epoch()
        await self._load_history()
        listed = self._pages = 0
        read_at = self._pass_began = self._mono()
        self._head_listed = False
        try:
            async for page in self._client.walk_sessions(
                page_size=self._state.settings.page_size,
                max_pages=self._state.settings.max_pages,
                kept=self._kept,
            ):
                self._pages += 1
                self._head_listed = True  # (see head_loop)
                self._head_open.set()
                for session in await self._look_up(self._screen.accepted(page)):
                    if not listed:
                        # A page came: a later failure of this pass is no reason to back off.
                        self._errors = 0
                    listed += 1
                    await self.on_listed(session, read_at=read_at)
        except PageLimitError as exc:
            self._cut("sessions", exc, listed)
        else:
            self._cut_lists.discard("sessions")
        listed += await self._discover_archived(read_at)
        await self._flush_history()
        if not await self._store.run(MetaQueries.is_baseline_complete):
            await self._store.run(MetaQueries.mark_baseline_complete)
        self._errors = 0
        done = self._clock()
        self._state.last_success = done
        cut = listed if self._cut_lists else None
        await self._store.run(Economy.mark_poll, True, done, cut, account=self._account)
        if self._metrics is not None:
            self._metrics.poll_succeeded(done)
        _log.debug("discovery.done", sessions=listed, tracked=len(self._state.tracked))

    async def _discover_archived(self, read_at: float) -> int:
        """The archived sessions, which the default list leaves out (beyond the interface
        spec): listed with ``filter=archived = true``, each item judged as the default
        list's are, so that an archived session is discovered, and one still working (or
        resumed by a message) is followed to its end. A server that refuses the filter (400)
        or ignores it (an item not marked archived) is not asked again by this process."""
        if not self._archived_list:
            return 0
        settings = self._state.settings
        listed = 0
        label = "archived sessions"
        try:
            async with aclosing(
                self._client.walk_sessions(
                    page_size=settings.page_size,
                    max_pages=settings.max_pages,
                    filter=ARCHIVED_FILTER,
                    kept=self._kept,
                )
            ) as pages:
                async for page in pages:
                    self._pages += 1
                    accepted = self._screen.accepted(page)
                    if any(session.archived is not True for session in accepted):
                        self._no_archived_list("it ignores the filter")
                        return listed
                    for session in await self._look_up(accepted):
                        listed += 1
                        await self.on_listed(session, read_at=read_at)
        except InvalidArgumentError as exc:
            self._no_archived_list(f"it refuses the filter ({exc.message[:200]})")
        except PageLimitError as exc:
            self._cut(label, exc, listed)
        else:
            self._cut_lists.discard(label)
        return listed

    def _cut(self, label: str, exc: PageLimitError, listed: int) -> None:
        """A full walk of a session list stopped at ``poll.max_pages`` pages. A list that
        brought fewer sessions than pages is paginating without end: the pass fails (and
        backs off). Otherwise the account is larger than the bound: the pass goes on with
        the newest ``max_pages`` pages of sessions (the list is newest first; the older
        ones are not followed), warned once while it lasts. Failing that pass would help
        nothing: the next one starts from the first page again, and meets the same bound."""
        if listed < exc.max_pages:
            raise exc
        if label in self._cut_lists:
            return
        self._cut_lists.add(label)
        _log.warning(
            "discovery.list_cut",
            account=self._account,
            list=label,
            pages=exc.max_pages,
            sessions=listed,
            message=(
                f"the list of {label} goes on past poll.max_pages "
                f"({counted(exc.max_pages, 'page')}): followed are the newest "
                f"{counted(listed, 'session')}, not older ones; raise poll.max_pages if the "
                "account really holds more"
            ),
        )

    def _no_archived_list(self, why: str) -> None:
        self._archived_list = False
        _log.info(
            "discovery.no_archived_list",
            account=self._account,
            detail=f"{why}: archived sessions are found by their polls only",
        )

    def _kept(self, name: str) -> str:
        """The name as the tracked session holds it (for the list's walk to remember)."""
        tracked = self._state.tracked.get(name)
        return name if tracked is None else tracked.name

    async def _look_up(self, page: list[Session]) -> list[Session]:
        """The items of a page, once it is known which of the untracked ones are archived
        already (``_archived``, for :meth:`on_listed`): one store call, none when every item
        is tracked. (No index of the whole archive is kept: 100,000 sessions and more.) After
        a restart, a page of sessions is followed again at this one call, not one a session."""
        tracked = self._state.tracked
        names = [listed.name for listed in page if listed.name not in tracked]
        if names:
            self._archived.update(
                await self._store.run(Economy.archived_among, names, account=self._account)
            )
        return page

    async def on_listed(self, listed: Session, *, read_at: float | None = None) -> None:
        """One list item (its page looked up: :meth:`_look_up`): track, announce or schedule
        its session. ``read_at`` (monotonic) is when the list read began: the learning
        judges polls that ended before it."""
        now = self._mono()
        # (Popped whether tracked or not: the other list reader may have tracked it since
        # this one's look-up.)
        known = self._archived.pop(listed.name, None)
        tracked = self._state.tracked.get(listed.name)
        if tracked is None:
            if listed.name in self._announcing:
                return  # the other list reader (head or full pass) is announcing it
            if known is None and self._is_history(listed):
                self._record_history(listed, now)
                await self._maybe_flush_history()
                return
            if known is None:
                pending = self._state.pending.setdefault(
                    listed.name, Pending(listed, first_seen=now)
                )
                pending.listed = listed
                if pending.retry_at <= now:  # else it waits for its own backoff
                    await self.retry_pending([listed.name])
                return
            if not known.announced:
                # Archived by an earlier run that died before announcing it.
                self._announcing.add(listed.name)
                try:
                    row = await self._store.run(Ingest.get_session, listed.name)
                    if row is not None:
                        await self._archive.announce(row.to_session(), deliver=not known.baseline)
                finally:
                    self._announcing.discard(listed.name)
            tracked = Tracked(
                name=listed.name,  # the walk remembers this string (see _kept)
                state=known.state,
                first_seen=now - max(0.0, self._clock() - known.first_seen_at),
                polled_update_time=known.polled_update_time,
            )
            self._state.tracked[listed.name] = tracked
        tracked.listed(listed.update_time)
        if tracked.check is not None and read_at is not None and tracked.check[1] < read_at:
            moved = judge(listed.update_time, tracked.check[0], tracked.check[2])
            tracked.check = None
            if moved is not None:
                await self._scheduler.observe(moved, tracked.name)
        if tracked.history and listed.name in self._unrecorded:
            return  # its row is written with the next batch; nothing to poll before that
        if tracked.gone_at_update_time is not None:
            if listed.update_time == tracked.gone_at_update_time:
                return
            tracked.gone_at_update_time = None  # it changed since: try again
        active = listed.state in ACTIVE_STATES
        # Waiting for the activity behind a state already read: its own retries read the
        # session again (the list shows that state meanwhile); a move is news (the activity?).
        waiting = tracked.awaiting is not None
        if listed.state != tracked.state and not waiting:
            # Immediate, and fetch the session afterwards for the state_changed event. One
            # that settles is walked from its first activity (the sweep, see SessionPoll.poll).
            # (Not while a poll runs: its read shows the state, and it sweeps after it.)
            self._scheduler.schedule(tracked, now, refresh=True)
            tracked.sweep = tracked.sweep or not (active or tracked.running)
        elif listed.update_time != tracked.polled_update_time:
            # Working sessions are polled for their activities anyway; an idle one that
            # moved may also have a new output (pull request), so it is fetched too.
            last = tracked.last_polled
            at = now
            if last is not None and not (active or waiting):
                at = max(now, last + self._state.settings.idle_interval)
            self._scheduler.schedule(tracked, at, refresh=not active)
        elif active and tracked.due_at is None and not tracked.running:
            last = tracked.last_polled
            at = now if last is None else last + self._scheduler.active_interval(tracked)
            self._scheduler.schedule(tracked, at, timer=last is not None)

    async def retry_pending(self, names: Sequence[str] | None = None) -> None:
        """GET new sessions (``names``, or every pending one that is due) and announce those
        that answer. A failure keeps the session pending with its own backoff; past
        ``young_session`` seconds its list item is announced instead. A 401 propagates.
        """
        now = self._mono()
        if names is None:
            names = [n for n, p in self._state.pending.items() if p.retry_at <= now]
        for name in names:
            pending = self._state.pending.get(name)
            if pending is None or name in self._announcing:
                continue  # the other list reader (head or full pass) is on it
            self._announcing.add(name)
            try:
                try:
                    session = await self._client.get_session(name)
                    self._screen.note_repairs(session)
                    self._screen.note_values(session)
                except UnauthenticatedError:
                    raise
                except ApiError as exc:
                    self._failures.count("announce", exc)
                    pending.errors += 1
                    delay = self._failures.delay(
                        exc, pending.errors, self._state.settings.announce_backoff
                    )
                    pending.retry_at = self._mono() + delay
                    if self._mono() - pending.first_seen < self._state.settings.young_session:
                        self._failures.log(
                            "discovery.get_failed",
                            exc,
                            delay,
                            session=name,
                            attempt=pending.errors,
                        )
                        continue
                    session = pending.listed
                del self._state.pending[name]
                await self._discovered(session, pending, read=session is not pending.listed)
            finally:
                self._announcing.discard(name)

    async def adopt(self, session: Session) -> None:
        """A session this relay created (its answer to ``POST /sessions``): archived and
        announced now, and polled at once, as a new session of the list is, rather than when
        the list shows it. A session known already is left as it is."""
        if session.name in self._state.tracked or session.name in self._announcing:
            return
        self._state.pending.pop(session.name, None)
        await self._discovered(session, Pending(session, first_seen=self._mono()), read=True)

    async def _discovered(self, session: Session, pending: Pending, *, read: bool) -> None:
        """A session seen for the first time: archive, announce, poll it now. ``read``: the
        ``session`` is the answer of its own GET (not the list item announced instead)."""
        baseline = self._archive.is_baseline(session)
        # Archived and announced in one store call (see Ingest.archive_discovered).
        event = self._archive.stamp(events.session_discovered(session, now=self._clock()))
        added = await self._store.run(
            Ingest.archive_discovered,
            session,
            event,
            baseline=baseline,
            account=None if self._account == DEFAULT_ACCOUNT else self._account,
        )
        self._archive.count_ingested(added)
        _log.info(
            "session.discovered", session=session.name, state=session.state, baseline=baseline
        )
        tracked = Tracked(
            name=session.name,
            state=session.state,
            first_seen=pending.first_seen,
            polled_update_time=None,
            listed_update_time=pending.listed.update_time,
            read_at_discovery=read,
        )
        self._state.tracked[session.name] = tracked
        self._scheduler.schedule(tracked, self._mono())

    # ------------------------------------------------------------------ the history

    def _is_history(self, listed: Session) -> bool:
        """Whether a session seen for the first time is left to the history walk: it existed
        before the first start (not backfilled) and is not working."""
        return listed.state not in ACTIVE_STATES and self._archive.is_baseline(listed)

    def _record_history(self, listed: Session, now: float) -> None:
        """Track a session of the history (no request): its row is written in a batch."""
        self._state.tracked[listed.name] = Tracked(
            name=listed.name,
            state=listed.state,
            first_seen=now,
            polled_update_time=listed.update_time,
            listed_update_time=listed.update_time,
            history=True,
        )
        self._history_batch.append(listed)
        self._unrecorded.add(listed.name)

    async def _maybe_flush_history(self) -> None:
        if len(self._history_batch) >= self._state.settings.page_size:
            await self._flush_history()

    async def _flush_history(self) -> None:
        """Write the batch of history sessions (one transaction) and queue them, newest first."""
        batch, self._history_batch = self._history_batch, []
        if not batch:
            return
        await self._store.run(Economy.record_history, batch, account=self._account)
        for listed in batch:
            self._unrecorded.discard(listed.name)
        self._history.enqueue(listed.name for listed in batch)
        _log.debug("history.recorded", sessions=len(batch), queued=self._history.queued)

    async def _load_history(self) -> None:
        """Once: the history walk's queue as a previous run left it (its sessions tracked
        again), and the learning's verdict."""
        if self._history_loaded:
            return
        pending = await self._store.run(Economy.history_pending, account=self._account)
        now = self._mono()
        for k in pending:
            self._state.tracked[k.name] = Tracked(
                name=k.name,
                state=k.state,
                first_seen=now - max(0.0, self._clock() - k.first_seen_at),
                polled_update_time=k.polled_update_time,
                history=True,
            )
        self._history.enqueue(k.name for k in pending)
        verdict = await self._store.run(MetaQueries.get_meta, VERDICT_KEY)
        self._scheduler.restore_verdict(verdict)
        self._history_loaded = True

    # ------------------------------------------------------------------ the list's head

    async def head_loop(self) -> None:
        """Read the head of the list every ``list_interval``, forever, in every mode: a new
        session is found within about that interval; in list mode (and while learning),
        working sessions whose ``updateTime`` moved are polled at once. It starts once the
        first full pass read a page (``_head_open``), not when that pass ends."""
        await self._head_open.wait()
        errors = 0
        while True:
            if self._store.unwritable is not None:
                await self._store.wait_writable()  # a full disk pauses polling (see run)
            started = self._mono()
            wait = self._state.settings.list_interval
            # A full pass that began within the interval read the head already; one that
            # could not read it (a rejected key, a failing list) backs off: the head waits.
            fresh = started - self._pass_began < wait
            if self._head_listed and not fresh:
                try:
                    await self.read_head()
                    errors = 0
                except UnauthenticatedError as exc:
                    errors += 1
                    wait = self._failures.delay(exc, errors)
                except ApiError as exc:
                    errors += 1
                    wait = self._failures.delay(exc, errors)
                    self._failures.log("discovery.head_failed", exc, wait, attempt=errors)
            self._state.heartbeat = self._mono()
            await anyio.sleep(max(0.0, wait - (self._mono() - started)))

    async def read_head(self) -> int:
        """Read the head of the session list: its first page (new sessions show there), and
        while the head tells working sessions' news (:meth:`Scheduler.wants_head`) down to
        the oldest working session tracked, at most ``head_pages``; the number of pages
        read."""
        await self._archive.load_epoch()
        await self._load_history()
        read_at = self._mono()
        working: set[str] = set()
        if self._scheduler.wants_head():
            working = {t.name for t in self._state.tracked.values() if t.state in ACTIVE_STATES}
        pages = 0
        walk = self._client.walk_sessions(page_size=self._state.settings.page_size)
        async with aclosing(walk):
            async for page in walk:
                pages += 1
                for listed in await self._look_up(self._screen.accepted(page)):
                    working.discard(listed.name)
                    await self.on_listed(listed, read_at=read_at)
                    tracked = self._state.tracked.get(listed.name)
                    if tracked is not None:
                        tracked.head_seen = read_at
                if pages >= self._state.settings.head_pages or not working:
                    break
        await self._flush_history()
        return pages

    async def loop(self) -> None:
        """A full pass every ``discovery_interval``, further apart for a list too long for
        ``list_share`` of the budget at that pace (backing off after a failure), forever;
        between passes, new sessions whose GET failed are asked again when due."""
        while True:
            if self._store.unwritable is not None:
                # A full disk: nothing polled could be archived. Pause (the store probes
                # itself with growing delays) instead of spending the request budget.
                self._state.first_pass_done.set()  # readiness then reports the full store
                await self._store.wait_writable()
            started = self._mono()
            try:
                await self.discover()
                spacing = self._state.settings.pass_spacing(self._pages)
                wait = spacing - (self._mono() - started)
            except ApiError as exc:
                wait = self.failed(exc)
                await self._store.run(
                    Economy.mark_poll, False, self._clock(), account=self._account
                )
            finally:
                self._state.first_pass_done.set()
                self._head_open.set()  # (a first pass that failed: the head waits on its own)
                self._state.heartbeat = self._mono()
            self._scheduler.wake()
            next_pass = self._mono() + max(0.0, wait)
            # Between passes, new sessions whose GET failed are asked again when due.
            while self._state.pending:
                due = min(p.retry_at for p in self._state.pending.values())
                if due >= next_pass:
                    break
                await anyio.sleep(max(0.0, due - self._mono()))
                try:
                    await self.retry_pending()
                except UnauthenticatedError as exc:
                    next_pass = self._mono() + self.failed(exc)
                    break
            await anyio.sleep(max(0.0, next_pass - self._mono()))

    def failed(self, exc: ApiError) -> float:
        """Count and log a failed pass; returns the wait before the next one."""
        self._failures.count("discovery", exc)
        self._errors += 1
        delay = self._failures.delay(exc, self._errors)
        self._failures.log("discovery.failed", exc, delay, attempt=self._errors)
        return delay
