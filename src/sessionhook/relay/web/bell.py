"""A bell the daemon rings whenever it archives events: waiting streams wake at once.

In-process; on a shared PostgreSQL store the daemon also rings it when another replica
notifies that it queued deliveries (``LISTEN``/``NOTIFY``, :mod:`..store.notify`), and the
streams' store poll (see :mod:`.stream`) brings in whatever no notification announced.
Ringing is cheap and never blocks: every waiter of the moment wakes, the next waiters wait
for the next ring.
"""

from __future__ import annotations

import anyio


class Bell:
    """Wake everybody waiting; see the module docstring."""

    def __init__(self) -> None:
        self._event = anyio.Event()
        #: Rings so far (tests and the stream read it to see whether one was missed).
        self.rings = 0

    def ring(self) -> None:
        """Wake every current waiter (call from the event loop's thread)."""
        self.rings += 1
        self._event.set()
        self._event = anyio.Event()

    def current(self) -> anyio.Event:
        """The event the next ring sets: take it BEFORE looking for new work, then wait on
        it, and a ring in between is not missed."""
        return self._event

    async def wait(self) -> None:
        """Wait for the next ring (bound it with ``anyio.move_on_after``)."""
        await self._event.wait()
