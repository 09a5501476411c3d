"""The one hand-moved clock of the tests (``time.time`` stand-in for the store, the poller,
the emulator and the CLI): nothing moves it but the test."""

from __future__ import annotations

#: A moment in 2023 the store tests start at (``Clock()``'s default).
T0 = 1_700_000_000.0


class Clock:
    """A clock the test moves: read it by calling it; move it by setting :attr:`now`, with
    :meth:`advance`, or by awaiting :meth:`sleep` (which also records each pause in
    :attr:`slept`, for code that takes a ``sleep`` beside its clock)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
