"""Scheduling: when each session is polled next, which sessions are due, and the loop
that starts their polls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from ..store import MetaQueries
from ..telemetry.logs import get_logger
from .learning import UpdateTimeLearning
from .settings import ACTIVE_STATES, VERDICT_KEY
from .state import PollState, Tracked

_log = get_logger()


class Scheduler:
    """Due times of the tracked sessions (most overdue first), list or timer mode, and the
    loop that starts the due polls."""

    def __init__(self, state: PollState) -> None:
        self._state, self._store, self._mono = state, state.store, state.monotonic
        #: Whether the server moves updateTime on new activities (list or timer mode).
        self.learning = UpdateTimeLearning(mode=state.settings.mode)
        #: Set when a schedule changed or a poll ended: the loop looks again.
        self._changed = anyio.Event()
        #: The sessions given a due time (by name), so that a round looks at these, not at
        #: every session tracked (100,000 and more, nearly all idle). An entry whose
        #: ``due_at`` went back to ``None`` (its poll began) is dropped by :meth:`due`.
        self._scheduled: dict[str, Tracked] = {}

    def wake(self) -> None:
        """Make the loop look at the schedule again (something changed)."""
        self._changed.set()

    def schedule(
        self, tracked: Tracked, at: float, *, refresh: bool = False, timer: bool = False
    ) -> None:
        """Poll ``tracked`` at ``at`` (or sooner, when it is due sooner already); ``timer``:
        a working session's next poll without news (:meth:`active_interval`)."""
        at = max(at, tracked.backoff_until)
        if tracked.due_at is None or at < tracked.due_at:
            tracked.due_at = at
            tracked.timer_due = timer
        elif at == tracked.due_at:
            tracked.timer_due = tracked.timer_due and timer
        tracked.refresh = tracked.refresh or refresh
        self._scheduled[tracked.name] = tracked
        self._changed.set()

    def postpone(self, tracked: Tracked, at: float) -> None:
        """Poll ``tracked`` at ``at``, even when it was due sooner (a failed poll's
        backoff: ``Retry-After`` wins over what discovery set while the poll ran)."""
        tracked.due_at = at
        tracked.timer_due = False
        self._scheduled[tracked.name] = tracked
        self._changed.set()

    def due(self, now: float) -> list[str]:
        """Names of the sessions due for a poll at ``now``, most overdue first."""
        return [t.name for t in self._due(now)[0]]

    def _due(self, now: float) -> tuple[list[Tracked], float | None]:
        """The sessions due at ``now`` (most overdue first), and the soonest due time of
        the others not polling; drops what is no longer scheduled."""
        ready: list[Tracked] = []
        soonest: float | None = None
        tracked = self._state.tracked
        for name, t in list(self._scheduled.items()):
            at = t.due_at
            if at is None or tracked.get(name) is not t:
                del self._scheduled[name]
            elif t.running:
                continue
            elif at <= now:
                ready.append(t)
            elif soonest is None or at < soonest:
                soonest = at
        ready.sort(key=lambda t: (t.due_at, t.name))
        return ready, soonest

    async def run(
        self, tg: anyio.abc.TaskGroup, poll: Callable[[Tracked], Awaitable[object]]
    ) -> None:
        """Forever: start ``poll`` for each due session, most overdue first, at most
        ``concurrency`` at once and one per session; ``tg`` holds the polls."""
        state = self._state
        running = 0

        async def one(tracked: Tracked) -> None:
            nonlocal running
            try:
                await poll(tracked)
            finally:
                tracked.running = False
                running -= 1
                self._changed.set()

        while True:
            self._changed = anyio.Event()
            now = self._mono()
            state.heartbeat = now
            # While the store is full no new poll starts (see Discovery.loop); the loop
            # keeps going round for the watchdog.
            due, soonest = self._due(now)
            if self._store.unwritable is not None:
                due = []
            for tracked in due[: max(0, state.settings.concurrency - running)]:
                tracked.running = True
                running += 1
                tg.start_soon(one, tracked)
            # Wake at the next due time, on a change, and at least every second (watchdog).
            wait = 1.0 if soonest is None else min(1.0, max(0.0, soonest - now))
            if running >= state.settings.concurrency:
                wait = 1.0  # a finishing poll sets _changed
            with anyio.move_on_after(wait):
                await self._changed.wait()

    # ------------------------------------------------------------------ list or timer

    @property
    def list_driven(self) -> bool:
        """Whether working sessions are polled when the list shows them move (list mode)."""
        return self.learning.list_driven

    def active_interval(self, tracked: Tracked) -> float:
        """How soon a working session is polled again without news from the list: the safety
        poll in list mode when the head showed it lately, else the timer."""
        s = self._state.settings
        if self.learning.list_driven and self._in_head(tracked):
            return s.safety_interval
        return s.active_interval

    def _in_head(self, tracked: Tracked) -> bool:
        """Whether the list's head showed the session lately (its reads will show it)."""
        seen = tracked.head_seen
        limit = 3 * self._state.settings.list_interval + 1.0
        return seen is not None and self._mono() - seen <= limit

    def wants_head(self) -> bool:
        """Whether the head of the list (read in every mode: new sessions show there) tells
        working sessions' news: in list mode, and in ``auto`` before the verdict while some
        session works (the evidence comes in seconds). Its reads then go down to the oldest
        working session, and a state change it is to show needs no read of the session."""
        learning = self.learning
        if learning.list_driven:
            return True
        if learning.mode != "auto" or learning.verdict is not None:
            return False
        return any(t.state in ACTIVE_STATES for t in self._state.tracked.values())

    def list_tells(self, tracked: Tracked) -> bool:
        """Whether the next change of the session's state shows in the list within about
        ``list_interval`` (its head is read and showed it lately): then no read is needed."""
        return self.wants_head() and self._in_head(tracked)

    def restore_verdict(self, verdict: str | None) -> None:
        """The verdict a previous run learned (kept in the store), unless one is known."""
        if verdict in ("moves", "still") and self.learning.verdict is None:
            self.learning.verdict = verdict

    async def observe(self, moved: bool, name: str) -> None:
        """One piece of evidence on ``updateTime`` (see :mod:`.learning`)."""
        learning = self.learning
        was_list = learning.list_driven
        was_read = self.wants_head()
        if not learning.observe(moved):
            return
        verdict = learning.verdict or ""
        _log.info(
            "poll.update_time_learned",
            verdict=verdict,
            mode="list" if learning.list_driven else "timer",
            evidence=name,
        )
        await self._store.run(MetaQueries.set_meta, VERDICT_KEY, verdict)
        now = self._mono()
        tracked_sessions = self._state.tracked.values()
        if not was_list and learning.list_driven:
            # List mode from now on: working sessions the list's head shows wait for their
            # safety poll, not for the timer of the learning (the list tells their news).
            for tracked in tracked_sessions:
                if tracked.timer_due and tracked.due_at is not None and not tracked.running:
                    last = now if tracked.last_polled is None else tracked.last_polled
                    at = max(last + self.active_interval(tracked), tracked.backoff_until)
                    tracked.due_at = max(tracked.due_at, at)
        if was_list and not learning.list_driven:
            # Back to the timer: working sessions waiting for their slow safety poll are
            # polled now, and on the timer from then on.
            for tracked in tracked_sessions:
                if tracked.state in ACTIVE_STATES and not tracked.running:
                    self.schedule(tracked, now)
        if was_read and not self.wants_head():
            # The head is no longer read: a change the list was to show is read now.
            for tracked in tracked_sessions:
                if tracked.untold:
                    self.schedule(tracked, now, refresh=True)
