"""The send fence: a replica posts what it claimed only while its claims are sure to hold.

A claim on a queue's head lives as long as its replica heartbeats (``store/leases.py``).
On a loaded machine a heartbeat can come late; past ``heartbeat_at + lease`` a rival
takes the head over and posts it. Without a fence, the late replica could still be posting
the same delivery: two requests of one session at once, out of order at the consumer.

So a replica sends only until :attr:`~..store.ReplicaState.sending_until`, one heartbeat
interval before its claims lapse: no POST starts after it, and a POST in flight then is
cut (its delivery stays open, sent again under the same webhook-id). Each committed
heartbeat moves the line on (:meth:`SendFence.renewed`). A store without rivals (SQLite,
an operator's handle) never fences.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from types import TracebackType

import anyio

from ..store import ReplicaState
from ..telemetry.logs import get_logger

_log = get_logger()


class SendFence:
    """Whether this replica may post now, and the cancel scopes of the POSTs in flight,
    which one timer cuts at the fence's line (``clock`` is the clock heartbeats are
    stamped with)."""

    def __init__(self, replica: ReplicaState, clock: Callable[[], float] = time.time) -> None:
        self._replica = replica
        self._clock = clock
        self._posting: set[anyio.CancelScope] = set()
        self._closed = False
        #: Fires at the line while POSTs are in flight (armed by the first one): cuts them
        #: if no heartbeat moved the line on, else waits for the new line.
        self._timer: asyncio.TimerHandle | None = None

    @property
    def active(self) -> bool:
        """Whether this replica has rivals to fence against (it claims what it sends)."""
        return self._replica.claims

    def open(self) -> bool:
        """Whether a POST may start now; logs when the fence closes and opens again."""
        left = self._replica.sending_until - self._clock()
        if left > 0:
            if self._closed:
                self._closed = False
                _log.info("delivery.fence_opened", note="a heartbeat committed: sending again")
            return True
        if not self._closed:
            self._closed = True
            _log.warning(
                "delivery.fence_closed",
                silent_s=round(self._clock() - self._replica.confirmed_at, 1),
                note="no heartbeat of this replica committed for two thirds of its lease: "
                "it sends nothing until one does, as its claims may pass to another replica",
            )
        return False

    def posting(self) -> _Posting:
        """A cancel scope around one POST: cancelled at the fence's line unless a heartbeat
        moves it on first (``scope.cancelled_caught`` then says the POST was cut). The
        scopes have no deadline of their own: one timer of the fence cuts them all."""
        return _Posting(self)

    def renewed(self) -> bool:
        """A heartbeat committed: the POSTs in flight may run to the new line (the timer,
        when it fires, finds the line moved on). Whether the fence was closed (the
        dispatcher then has work to start again)."""
        return self._closed

    def _started(self, scope: anyio.CancelScope) -> None:
        self._posting.add(scope)
        if self._timer is None:
            self._arm()

    def _arm(self) -> None:
        left = self._replica.sending_until - self._clock()
        if left != math.inf:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, left), self._at_line)

    def _at_line(self) -> None:
        """The line as it was when the timer was armed: cut the POSTs in flight if it still
        is the line, else wait for the new one."""
        self._timer = None
        if not self._posting:
            return  # the next POST arms the timer again
        if self._replica.sending_until - self._clock() > 0:
            self._arm()
            return
        for scope in self._posting:
            scope.cancel()


class _Posting:
    """:meth:`SendFence.posting`'s context manager (a class: cheaper than a generator's,
    once per POST)."""

    __slots__ = ("_fence", "_scope")

    def __init__(self, fence: SendFence) -> None:
        self._fence = fence
        self._scope = anyio.CancelScope()

    def __enter__(self) -> anyio.CancelScope:
        scope = self._scope.__enter__()
        self._fence._started(scope)
        return scope

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._fence._posting.discard(self._scope)
        return bool(self._scope.__exit__(exc_type, exc, tb))
