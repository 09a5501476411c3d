"""A render's two budgets, steps and size, and the meter that counts them (pure).

:func:`metered` opens a :class:`Meter` for the renders inside it (this thread or task);
the sandbox (:mod:`.template_sandbox`) spends steps on it and the size rules
(:mod:`.template_sizes`) charge what a render makes. Outside :func:`metered` nothing is
counted. A render over either budget stops with :class:`OverBudget`, which says which
budget and how big it was. Both are deterministic: the same template on the same event
stops at the same place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any

#: Steps a render may take. A chat preset takes under 100; a million took 0.2 s (loop
#: iterations) to 2 s (recursive loops) on the 2-core machine of bench/render.py.
STEP_BUDGET = 1_000_000
#: What calling a macro (or ``caller()``, or a recursive ``loop()``) costs: Jinja2's call
#: (arguments, frame, output buffer) takes 10 to 30 times as long as a loop iteration.
MACRO_STEPS = 20
#: Characters a render may make in all, besides :data:`SIZE_PER_BYTE` per byte of its
#: event. A chat preset makes a few thousand.
SIZE_BUDGET = 1_000_000
#: What a render may make per byte of its event: enough to show the event whole (as JSON)
#: and output it.
SIZE_PER_BYTE = 4
#: The most bits the result of one ``**`` or ``*`` may have.
MAX_POWER_BITS = 100_000


class OverBudget(Exception):
    """A render went over its step budget or its size budget."""


class Meter:
    """The budgets of one render: ``left`` steps, ``room`` characters."""

    __slots__ = ("budget", "left", "room", "size")

    def __init__(self, budget: int, size: int) -> None:
        self.budget = budget
        self.left = budget
        self.size = size
        self.room = size

    def spend(self, steps: int) -> None:
        """Take ``steps`` steps."""
        self.left -= steps
        if self.left < 0:
            self.stop()

    def stop(self) -> None:
        """Over the step budget."""
        raise OverBudget(f"template over its budget of {self.budget} steps")

    def check(self, size: int) -> None:
        """Refuse to make a value of ``size`` characters when there is no room for it."""
        if size > self.room:
            self.full()

    def make(self, size: int) -> None:
        """Charge a value of ``size`` characters, made (or about to be)."""
        self.room -= size
        if self.room < 0:
            self.full()

    def full(self) -> None:
        """Over the size budget."""
        raise OverBudget(f"template over its size budget of {self.size} characters")


_METER: ContextVar[Meter | None] = ContextVar("sessionhook_template_meter", default=None)


@contextlib.contextmanager
def metered(budget: int = STEP_BUDGET, size: int = SIZE_BUDGET) -> Iterator[None]:
    """Count the steps and sizes of the renders inside (this thread or task) against
    ``budget`` steps and ``size`` characters."""
    token = _METER.set(Meter(budget, size))
    try:
        yield
    finally:
        _METER.reset(token)


def current() -> Meter | None:
    """The meter of the render running here (``None``: nothing is counted)."""
    return _METER.get()


def spend(steps: int = 1) -> None:
    """Take ``steps`` steps of the current render."""
    meter = _METER.get()
    if meter is not None:
        meter.spend(steps)


def check_size(size: int) -> None:
    """Refuse a value of ``size`` characters the current render has no room for."""
    meter = _METER.get()
    if meter is not None:
        meter.check(size)


def make_size(size: int) -> None:
    """Charge a value of ``size`` characters to the current render."""
    meter = _METER.get()
    if meter is not None:
        meter.make(size)


def counted(iterable: Iterable[Any]) -> Iterable[Any]:
    """``iterable``, each item a step of the current render."""
    meter = _METER.get()
    if meter is None:
        return iterable
    return _each_a_step(iterable, meter)


def _each_a_step(iterable: Iterable[Any], meter: Meter) -> Iterator[Any]:
    for item in iterable:
        meter.left -= 1  # spend(1), inlined: this runs for every iteration of every loop
        if meter.left < 0:
            meter.stop()
        yield item
