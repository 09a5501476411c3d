"""What the MCP server learns from the archive, pushed: :class:`Watcher` reads every event
archived after it starts (one reader for every wait and subscription), wakes the waits it
answers and announces the resources it changed.

It reads as the event stream does (:class:`~...ops.Follower`: woken by the bell the
poller rings on every ingest, and on PostgreSQL by other replicas' notifications; the
store read at least every :data:`POLL_SECONDS` in any case), so a wait holds no thread and
spends no upstream request: an open wait is an :class:`anyio.Event` in a dict.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

import anyio

from ...domain.rows import EventRow
from ...ops import EventFilter, Follower
from ...ops import session_views as views
from ...store import AsyncStore, OperatorQueries, StoreError
from ...telemetry.logs import get_logger
from ..context import WebContext

_log = get_logger()

#: Seconds between two reads of the archive when no bell rings.
POLL_SECONDS: Final = 1.0
#: Seconds between two looks for the store before it is open.
STORE_WAIT: Final = 0.1
#: Reads without new events after which the waiting set is looked at again.
SETTLE_ROUNDS: Final = 3
#: Events read at most at once, and their bodies' bytes.
BATCH: Final = 200
PAGE_BYTES: Final = 256 * 1024
#: The resources (``sessionhook://sessions/{id}``, ``.../waiting``).
SESSION_URI: Final = "sessionhook://sessions/"
WAITING_URI: Final = SESSION_URI + "waiting"


def session_uri(name: str) -> str:
    """The resource of session ``name`` (``sessions/ID``)."""
    return SESSION_URI + name.removeprefix("sessions/")


class TooManyWaits(Exception):
    """``max_waits`` waits and subscriptions are open already."""


class Stopping(Exception):
    """The server stops: no wait opens, and open ones end."""


@dataclass(eq=False)
class Waiter:
    """One open wait: the first event of ``session`` of one of ``types`` with a position
    past ``after`` (:meth:`start`) sets ``found`` and ``done``. Events offered before the
    start is known are kept until it is (the watcher may read them in between)."""

    session: str
    types: frozenset[str]
    after: int | None = None
    found: EventRow | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    _early: list[EventRow] = field(default_factory=list)

    def start(self, after: int) -> None:
        """Answer with events past position ``after`` only."""
        self.after = after
        for event in self._early:
            self.offer(event)
        self._early.clear()

    def settle(self, event: EventRow) -> None:
        """Answer with ``event``, the phase the session is in now (what the wait's first
        look answers at once; its row took the phase after that look)."""
        if self.found is None:
            self.found = event
            self.done.set()

    def offer(self, event: EventRow) -> None:
        """Take ``event`` when it is the first that answers this wait."""
        if self.found is not None or event.type not in self.types:
            return
        if self.after is None:
            self._early.append(event)
        elif event.seq > self.after:
            self.found = event
            self.done.set()


#: Tells subscribers that a resource changed (its URI).
Announce = Callable[[str], Awaitable[None]]


class Watcher:
    """The one reader of new events for the MCP server (see the module docstring);
    ``max_waits`` bounds the waits and subscriptions open at once; ``announce`` tells the
    subscribers of a resource that it changed."""

    def __init__(self, ctx: WebContext, announce: Announce, *, max_waits: int) -> None:
        self._ctx = ctx
        self._announce = announce
        self.max_waits = max_waits
        self._waiters: dict[str, set[Waiter]] = {}
        self._open = ctx.metrics.mcp_open
        #: Open waits, and open subscriptions counted against the same bound.
        self.open_waits = 0
        self.subscriptions = 0
        self._waiting: frozenset[str] | None = None
        #: Sessions of the events read lately, and the looks at the archive left to each
        #: (until the reads settle): their rows may still take the phase their events tell.
        self._recent: dict[str, int] = {}
        #: Set when the server stops: open waits end, new ones are refused.
        self.closing = False
        #: Set once the reader has its starting position: a wait starts after it (an event
        #: archived before would be neither seen by the reader nor by the wait).
        self.ready = anyio.Event()

    def close(self) -> None:
        """The server stops: wake every open wait (each then answers that the relay is
        stopping) and refuse new ones."""
        self.closing = True
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.done.set()

    def subscribed(self, count: int) -> None:
        """``count`` subscriptions more (fewer when negative)."""
        self.subscriptions += count
        self._open.labels(kind="subscriptions").inc(count)

    def room(self) -> bool:
        """Whether one more wait or subscription may open."""
        return self.open_waits + self.subscriptions < self.max_waits

    @contextmanager
    def waiter(self, session: str, types: frozenset[str]) -> Iterator[Waiter]:
        """An open wait for the duration of the ``with``; :class:`TooManyWaits` at the
        bound. Leaving the block (an answer, a timeout, a client gone) frees it."""
        if self.closing:
            raise Stopping
        if not self.room():
            raise TooManyWaits
        waiter = Waiter(session, types)
        self._waiters.setdefault(session, set()).add(waiter)
        self.open_waits += 1
        self._open.labels(kind="waits").inc()
        try:
            yield waiter
        finally:
            self.open_waits -= 1
            self._open.labels(kind="waits").dec()
            waiting = self._waiters.get(session)
            if waiting is not None:
                waiting.discard(waiter)
                if not waiting:
                    del self._waiters[session]

    async def run(self) -> None:
        """Read new events until cancelled: wake the waits, announce the resources."""
        astore = self._ctx.store()
        while astore is None:  # the app is built before the store opens
            await anyio.sleep(STORE_WAIT)
            astore = self._ctx.store()
        failures: tuple[type[Exception], ...] = (StoreError, *self._ctx.store_errors)
        while True:  # the database away at start: the same pause as below
            try:
                start = await astore.run(OperatorQueries.last_event_seq)
                self._waiting = await astore.run(views.waiting_names)
                break
            except failures as exc:
                _log.warning("mcp.watch_failed", error=(str(exc) or type(exc).__name__)[:200])
                await anyio.sleep(POLL_SECONDS)
        follower = Follower(start, EventFilter())
        settling = 0
        self.ready.set()
        while True:
            rang = self._ctx.bell.current()  # before the read: a ring during it counts
            try:
                page = await astore.run(follower.read, limit=BATCH, max_bytes=PAGE_BYTES)
                if page.events:
                    await self._dispatch(page.events)
                    settling = SETTLE_ROUNDS
                elif settling:
                    # A session's row may take its new state just after its last event.
                    settling -= 1
                    await self._check_waiting(astore)
            except failures as exc:  # the database away: read again after the pause
                _log.warning("mcp.watch_failed", error=(str(exc) or type(exc).__name__)[:200])
            else:
                if page.more:
                    continue
            with anyio.move_on_after(POLL_SECONDS):
                await rang.wait()

    async def _dispatch(self, events: list[EventRow]) -> None:
        sessions: list[str] = []
        for event in events:
            for waiter in list(self._waiters.get(event.session_name, ())):
                waiter.offer(event)
            if event.session_name not in sessions:
                sessions.append(event.session_name)
        for name in sessions:  # the look after this read, then one per settling read
            self._recent[name] = SETTLE_ROUNDS + 1
        for name in sessions:
            await self._announce(session_uri(name))
        astore = self._ctx.store()
        if astore is not None:
            await self._check_waiting(astore)
        _log.debug("mcp.read", events=len(events), last=events[-1].seq, sessions=len(sessions))

    async def _check_waiting(self, astore: AsyncStore) -> None:
        """Announce the waiting set when it changed; answer the open waits of the sessions
        read lately whose phase is now one they wait for."""
        waiting = await astore.run(views.waiting_names)
        if waiting != self._waiting:
            self._waiting = waiting
            await self._announce(WAITING_URI)
        await self._look_again(astore)

    async def _look_again(self, astore: AsyncStore) -> None:
        """A wait opens after an event and looks at the session's row; on a loaded
        PostgreSQL with replicas the row may take the event's phase only after that look,
        and the event, older than the wait, would never be offered to it. So the waits of
        the sessions read lately look again while the reads settle (no call without one)."""
        for name in self._recent.keys() & self._waiters.keys():
            for waiter in list(self._waiters.get(name, ())):
                if waiter.found is None and waiter.after is not None:
                    event = await astore.run(views.phase_event, name, waiter.types)
                    if event is not None:
                        waiter.settle(event)
        for name, left in list(self._recent.items()):
            if left > 1:
                self._recent[name] = left - 1
            else:
                del self._recent[name]
