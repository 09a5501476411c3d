"""An asyncio event loop on a fake clock: time passes only while the loop would sleep.

:class:`VirtualTimeLoop` reads its time from a counter instead of the monotonic clock.
Whenever the loop has nothing to run and would wait for its next timer, the counter jumps
to that timer at once (no real sleep), so a test of timing (a rate limit's spacing, a
backstop timer) measures the code's own schedule, exactly, without waiting for it and
without the noise of a shared machine. Work outside the loop (a store's thread) is not on
that clock: while ``busy()`` says such work is under way, the loop waits for it in real
time and the counter stands still.

Run a coroutine on it with :func:`run`; ``loop.wall()`` is a wall clock on the same counter
(for code that takes ``clock=time.time``). :func:`store_busy` is the ``busy`` of code that
runs a relay's store (its calls go to the store's thread).
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import pytest

__all__ = ["VirtualTimeLoop", "run", "store_busy"]

T = TypeVar("T")


class _Selector(selectors.BaseSelector):
    """The platform's selector, except that a wait with nothing to do jumps the clock."""

    def __init__(self, loop_clock: list[float], busy: Callable[[], bool]) -> None:
        self._inner = selectors.DefaultSelector()
        self._clock = loop_clock
        self._busy = busy

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None or self._busy():
            # Nothing scheduled (only I/O or a thread can wake us), or work outside the
            # loop is under way: wait for it for real, the clock stands still.
            return self._inner.select(timeout)
        self._clock[0] += timeout  # nothing to do until the next timer: it is due now
        return []

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """See the module docstring. ``busy()``: whether work outside the loop is under way."""

    def __init__(self, busy: Callable[[], bool] = lambda: False) -> None:
        self._virtual = [0.0]
        self._epoch = time.time()
        super().__init__(_Selector(self._virtual, busy))

    def time(self) -> float:
        """The fake monotonic clock (seconds since the loop was made)."""
        return self._virtual[0]

    def wall(self) -> float:
        """A wall clock (``time.time()`` at the loop's creation) on the fake clock."""
        return self._epoch + self._virtual[0]


def run(
    main: Callable[[VirtualTimeLoop], Coroutine[Any, Any, T]],
    busy: Callable[[], bool] = lambda: False,
) -> T:
    """Run ``main(loop)`` to its end on a fresh :class:`VirtualTimeLoop`."""
    loop = VirtualTimeLoop(busy)
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        return runner.run(main(loop))


def store_busy(monkeypatch: pytest.MonkeyPatch) -> Callable[[], bool]:
    """Counts the calls of ``AsyncStore.run`` under way (patched for the test); the
    returned ``busy()`` says whether one is (work on the store's thread)."""
    from sessionhook.relay.store import AsyncStore

    under_way = [0]
    run = AsyncStore.run

    async def counted(self: AsyncStore, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        under_way[0] += 1
        try:
            return await run(self, fn, *args, **kwargs)
        finally:
            under_way[0] -= 1

    monkeypatch.setattr(AsyncStore, "run", counted)
    return lambda: under_way[0] > 0
