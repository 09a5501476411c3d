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

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio

from ..store import ReplicaState
from ..telemetry.logs import get_logger

_log = get_logger()


class SendFence:
    """Whether this replica may post now, and the cancel scopes of the POSTs in flight,
    whose deadline is the fence's line (``clock`` is the clock heartbeats are stamped with)."""

    def __init__(self, replica: ReplicaState, clock: Callable[[], float] = time.time) -> None:
        self._replica = replica
        self._clock = clock
        self._posting: set[anyio.CancelScope] = set()
        self._closed = False

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

    @contextmanager
    def posting(self) -> Iterator[anyio.CancelScope]:
        """A cancel scope around one POST: cancelled at the fence's line unless a heartbeat
        moves it on first (``scope.cancelled_caught`` then says the POST was cut)."""
        scope = anyio.CancelScope(deadline=self._deadline())
        self._posting.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._posting.discard(scope)

    def renewed(self) -> bool:
        """A heartbeat committed: the POSTs in flight may run to the new line. Whether the
        fence was closed (the dispatcher then has work to start again)."""
        deadline = self._deadline()
        for scope in self._posting:
            scope.deadline = deadline
        return self._closed

    def _deadline(self) -> float:
        """The fence's line on anyio's clock (what a cancel scope's deadline is in)."""
        left = self._replica.sending_until - self._clock()
        return math.inf if left == math.inf else anyio.current_time() + left
