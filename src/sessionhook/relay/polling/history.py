"""The history walk: sessions that existed before the first start, archived in the
background (``backfill = false``; docs/polling.md).

The sessions found idle at the first start are queued here, newest first, and polled one at
a time only when no other session is due and within ``history_share`` of
``requests_per_minute``. A session whose ``updateTime`` or state moves leaves the history for
the ordinary schedule. Each archived one is marked in the store (``finish_history``), so a
restart resumes with what is left.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import anyio

from ..telemetry.logs import get_logger
from .scheduling import Scheduler
from .session_poll import SessionPoll
from .state import PollState

_log = get_logger()

#: Upstream requests of one history session, about: its activities (one page) and a GET.
REQUESTS_PER_SESSION = 2.0
#: How long the walk waits while other sessions are due (they go first).
_YIELD = 0.05


class HistoryWalk:
    """The background history walk and its queue: discovery queues the sessions
    (:meth:`enqueue`), each polled when ``scheduler`` has nothing due."""

    def __init__(self, state: PollState, *, scheduler: Scheduler, sessions: SessionPoll) -> None:
        self._state, self._store, self._mono = state, state.store, state.monotonic
        self._scheduler = scheduler
        self._sessions = sessions
        #: Sessions found at the first start, newest first, not archived yet.
        self._queue: deque[str] = deque()
        self._wake = anyio.Event()

    @property
    def queued(self) -> int:
        """How many sessions are queued."""
        return len(self._queue)

    def enqueue(self, names: Iterable[str]) -> None:
        """Queue sessions of the history (after those queued already)."""
        self._queue.extend(names)
        self._wake.set()

    def drop(self) -> None:
        """Empty the queue (``run_once`` polls the history with the rest at once)."""
        self._queue.clear()

    def _pace(self) -> float:
        """Seconds per history session at the walk's share of the budget."""
        s = self._state.settings
        per_second = max(1e-6, s.history_share * s.requests_per_minute / 60.0)
        return REQUESTS_PER_SESSION / per_second

    async def run(self) -> None:
        """Walk the queued history, forever (the queue grows if a pass finds more)."""
        await self._state.first_pass_done.wait()
        while True:
            if self._store.unwritable is not None:
                await self._store.wait_writable()  # a full disk pauses polling (see run)
            if not self._queue:
                self._wake = anyio.Event()
                if not self._queue:
                    await self._wake.wait()
                continue
            if self._scheduler.due(self._mono()):
                await anyio.sleep(_YIELD)  # new and working sessions first
                continue
            started = self._mono()
            walked = await self.walk_history_once()
            if walked:
                await anyio.sleep(max(0.0, self._pace() - (self._mono() - started)))

    async def walk_history_once(self) -> bool:
        """Archive the next session of the history queue; returns whether one was polled
        (``False``: the one at the head was archived or is being polled already)."""
        name = self._queue.popleft()
        tracked = self._state.tracked.get(name)
        if tracked is None or not tracked.history:
            return False  # archived meanwhile (it moved, and its own poll archived it)
        if tracked.running or tracked.due_at is not None:
            return False  # scheduled like any session now: that poll archives it
        tracked.refresh = True  # the list item lacks url, source and outputs
        tracked.running = True
        try:
            outcome = await self._sessions.poll(tracked)
        finally:
            tracked.running = False
        if outcome == "auth":
            self._queue.appendleft(name)  # the key is rejected: try it again later
            await anyio.sleep(max(0.0, tracked.backoff_until - self._mono()))
        elif outcome == "ok":
            _log.debug("history.archived", session=name, left=len(self._queue))
        # "retry": the session backs off and the scheduler retries it like any other.
        return True
