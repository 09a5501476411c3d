"""What the poller's collaborators share: the store, the client, the clocks, the tracked
sessions and the loops' liveness.

:class:`PollState` is one account's; the :class:`~.poller.Poller` builds it and hands it
to each collaborator (scheduler, session poll, discovery, history walk), which read and
write it in place. The durable part lives in the store; this is the in-process view.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import anyio

from sessionhook.api.client import SessionsClient
from sessionhook.api.errors import ApiError
from sessionhook.api.models import Session

from ..store import AsyncStore
from ..telemetry.metrics import Metrics
from .settings import PollSettings


class _Flag:
    """A boolean of :class:`Tracked`: one bit of its ``_flags`` (its seven in one slot)."""

    def __init__(self, bit: int) -> None:
        self._bit = bit

    def __get__(self, tracked: Tracked, owner: object = None) -> bool:
        return bool(tracked._flags & self._bit)

    def __set__(self, tracked: Tracked, value: bool) -> None:
        tracked._flags = tracked._flags | self._bit if value else tracked._flags & ~self._bit


class Tracked:
    """What the scheduler knows about one session (the store keeps the durable part).

    One for every session followed (100,000 and more): kept small, with slots and its
    booleans in one, and its strings shared where the values are: its state interned
    (:meth:`moved_to`), its name the key it is tracked under (:attr:`PollState.tracked`),
    :meth:`listed`."""

    __slots__ = (
        "_flags",
        "awaiting",
        "backoff_until",
        "check",
        "due_at",
        "errors",
        "first_seen",
        "gone_at_update_time",
        "head_seen",
        "last_error",
        "last_polled",
        "listed_update_time",
        "name",
        "polled_update_time",
        "state",
    )

    name: str
    state: str
    first_seen: float  # monotonic
    #: ``updateTime`` of the last completed poll (the store's ``polled_update_time``).
    polled_update_time: str | None
    #: ``updateTime`` the session list showed last.
    listed_update_time: str | None
    due_at: float | None  # monotonic; None = idle, wait for discovery
    last_polled: float | None  # monotonic
    errors: int
    last_error: ApiError | None
    backoff_until: float
    gone_at_update_time: str | None  # set when a 404 said the session was deleted
    #: Evidence for the learning: the newest activity ``createTime`` a poll found new, when
    #: (monotonic) that poll ended, and the ``updateTime`` of the poll before it; judged
    #: by the next list read after it.
    check: tuple[datetime, float, str | None] | None
    #: When (monotonic) the list's head last showed it: list mode needs a fresh sighting.
    head_seen: float | None
    #: Waiting for the activity behind the state a read showed (see ``lifecycle_wait``).
    awaiting: Awaiting | None
    _flags: int

    #: ``due_at`` is a working session's timer (``Scheduler.active_interval``), nothing
    #: sooner.
    timer_due = _Flag(1)
    #: Fetch the session after the next poll even if nothing new.
    refresh = _Flag(2)
    #: A poll found an activity that may come with a change and did not read the session,
    #: as the list's head was to show that change (see ``Scheduler.list_tells``).
    untold = _Flag(4)
    #: The archived row is the session as discovery's own GET read it, and no poll has
    #: ended since: the first poll reads it again only for activities newer than that.
    read_at_discovery = _Flag(8)
    #: Walk the next poll from the first activity, not from the cursor (see
    #: ``Discovery.on_listed``).
    sweep = _Flag(16)
    running = _Flag(32)
    #: Found at the first start and not archived yet: the history walk's, at low priority.
    history = _Flag(64)

    def __init__(
        self,
        name: str,
        state: str,
        first_seen: float,
        polled_update_time: str | None,
        *,
        listed_update_time: str | None = None,
        read_at_discovery: bool = False,
        history: bool = False,
    ) -> None:
        self.name = name
        self.state = sys.intern(state)  # one string for all the sessions in a state
        self.first_seen = first_seen
        self.polled_update_time = polled_update_time
        self.listed_update_time = listed_update_time
        self.due_at = None
        self.last_polled = None
        self.errors = 0
        self.last_error = None
        self.backoff_until = 0.0
        self.gone_at_update_time = None
        self.check = None
        self.head_seen = None
        self.awaiting = None
        self._flags = 0
        self.read_at_discovery = read_at_discovery
        self.history = history

    def __repr__(self) -> str:
        return f"Tracked({self.name!r}, {self.state!r}, due_at={self.due_at!r})"

    def listed(self, update_time: str) -> None:
        """The list showed ``updateTime``: kept as the string held already when it is the
        same (the last poll's, the last list's), so that a pass over the list leaves no
        copy of each session's."""
        if update_time == self.polled_update_time:
            self.listed_update_time = self.polled_update_time
        elif update_time != self.listed_update_time:
            self.listed_update_time = update_time

    def moved_to(self, state: str) -> None:
        """The session's state as read (interned, as at its creation)."""
        self.state = sys.intern(state)


@dataclass
class Awaiting:
    """A session read in a waiting or final state whose activity is not archived yet: its
    changes are announced once the activity is (or at ``until``), not before."""

    until: float  # monotonic
    #: The wait began at the session's first poll: its changes are announced as such then.
    first_poll: bool
    tries: int = 0
    #: A walk of the wait was a sweep (from the first activity): none is needed after it.
    swept: bool = False


@dataclass
class Pending:
    """A new session whose first GET failed; announced once a GET succeeds."""

    listed: Session
    first_seen: float  # monotonic
    errors: int = 0
    retry_at: float = 0.0  # monotonic


@dataclass
class PollState:
    """One account's poller state, shared by its collaborators: the handles they all use
    and the sessions they follow.

    ``settings`` is replaced on a reload (``Poller.settings``): collaborators read it here
    each time, never keep a copy.
    """

    settings: PollSettings
    #: The account followed (``[[accounts]]`` name: ``data.account``) and its API client.
    account: str
    client: SessionsClient
    store: AsyncStore
    metrics: Metrics | None
    #: Wall time for the store's bookkeeping; monotonic time drives the schedule.
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    #: Monotonic time the loops last made progress (for the systemd watchdog).
    heartbeat: float
    #: Every session the poller follows, by name.
    tracked: dict[str, Tracked] = field(default_factory=dict)
    #: Listed, but their first GET failed (404 right after creation, 5xx...): retried
    #: between discovery passes with a backoff of their own.
    pending: dict[str, Pending] = field(default_factory=dict)
    #: Set once the first discovery pass was tried (successfully or not): readiness.
    first_pass_done: anyio.Event = field(default_factory=anyio.Event)
    #: Wall time of the last complete discovery pass (readiness, poll lag).
    last_success: float | None = None
