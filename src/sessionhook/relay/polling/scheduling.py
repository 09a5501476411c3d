"""Scheduling: when each session is polled next, and which sessions are due."""

from __future__ import annotations

from ..telemetry.logs import get_logger
from .base import PollerBase
from .settings import ACTIVE_STATES, VERDICT_KEY, _Tracked

_log = get_logger()


class Scheduling(PollerBase):
    """Due times of the tracked sessions (most overdue first)."""

    def _schedule(
        self, tracked: _Tracked, at: float, *, refresh: bool = False, timer: bool = False
    ) -> None:
        """Poll ``tracked`` at ``at`` (or sooner, when it is due sooner already); ``timer``:
        a working session's next poll without news (``_active_interval``)."""
        at = max(at, tracked.backoff_until)
        if tracked.due_at is None or at < tracked.due_at:
            tracked.due_at = at
            tracked.timer_due = timer
        elif at == tracked.due_at:
            tracked.timer_due = tracked.timer_due and timer
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

    # ------------------------------------------------------------------ list or timer

    @property
    def list_driven(self) -> bool:
        """Whether working sessions are polled when the list shows them move (list mode),
        rather than every ``active_interval`` (timer mode)."""
        return self._learning.list_driven

    def _active_interval(self, tracked: _Tracked) -> float:
        """How soon a working session is polled again without news from the list: the
        slow safety poll in list mode (when the list's head showed it lately), else the
        timer."""
        s = self.settings
        if self._learning.list_driven and self._in_head(tracked):
            return s.safety_interval
        return s.active_interval

    def _in_head(self, tracked: _Tracked) -> bool:
        """Whether the list's head showed the session lately (its reads will show it)."""
        seen = tracked.head_seen
        return seen is not None and self._mono() - seen <= 3 * self.settings.list_interval + 1.0

    def _wants_head(self) -> bool:
        """List mode reads the head of the list; so does ``auto`` before the verdict, while
        some session works (its polls and these reads are the evidence: learned in seconds,
        not at the next full pass)."""
        learning = self._learning
        if learning.list_driven:
            return True
        if learning.mode != "auto" or learning.verdict is not None:
            return False
        return any(t.state in ACTIVE_STATES for t in self._tracked.values())

    def _list_tells(self, tracked: _Tracked) -> bool:
        """Whether the next change of the session's state shows in the list within about
        ``list_interval``: its head is read (list mode, or learning) and showed it lately.
        Then an activity that may come with a change needs no read of the session: the list
        says when there is one to read."""
        return self._wants_head() and self._in_head(tracked)

    async def _observe(self, moved: bool, name: str) -> None:
        """One piece of evidence on ``updateTime`` (see :mod:`.learning`)."""
        was_list = self._learning.list_driven
        was_read = self._wants_head()
        if not self._learning.observe(moved):
            return
        verdict = self._learning.verdict or ""
        _log.info(
            "poll.update_time_learned",
            verdict=verdict,
            mode="list" if self._learning.list_driven else "timer",
            evidence=name,
        )
        await self._store.write(self._store.store.set_meta, VERDICT_KEY, verdict)
        now = self._mono()
        if not was_list and self._learning.list_driven:
            # List mode from now on: working sessions the list's head shows wait for their
            # safety poll, not for the timer of the learning (the list tells their news).
            for tracked in self._tracked.values():
                if tracked.timer_due and tracked.due_at is not None and not tracked.running:
                    last = now if tracked.last_polled is None else tracked.last_polled
                    at = max(last + self._active_interval(tracked), tracked.backoff_until)
                    tracked.due_at = max(tracked.due_at, at)
        if was_list and not self._learning.list_driven:
            # Back to the timer: working sessions waiting for their slow safety poll are
            # polled now, and on the timer from then on.
            for tracked in self._tracked.values():
                if tracked.state in ACTIVE_STATES and not tracked.running:
                    self._schedule(tracked, now)
        if was_read and not self._wants_head():
            # The head is no longer read: a change the list was to show is read now.
            for tracked in self._tracked.values():
                if tracked.untold:
                    self._schedule(tracked, now, refresh=True)
