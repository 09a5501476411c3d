"""Scheduling: when each session is polled next, and which sessions are due."""

from __future__ import annotations

from ..logging import get_logger
from .base import PollerBase
from .settings import _Tracked

_log = get_logger()


class Scheduling(PollerBase):
    """Due times of the tracked sessions (most overdue first)."""

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
