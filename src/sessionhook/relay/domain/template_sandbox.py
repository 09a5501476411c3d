"""The Jinja2 sandbox templates run in, with a step budget per render (pure).

Templates are the operator's, but they run on upstream data: a loop over a title's words
inside a loop over ``range(100000)`` passes the start-up samples and runs for hours on a
real event. :class:`Sandbox` counts a render's **steps**: one per iteration of every
``for`` loop (the parser wraps each loop's iterable in a counting one), one per attribute
or item read, one per function or method call, one per number a ``range()`` makes, and
:data:`MACRO_STEPS` per call of a macro, ``caller()`` or a recursive ``loop()``.
Everything else a template runs sits in a loop body or a macro, so the steps bound its
Python-level work; a render over :data:`STEP_BUDGET` stops with :class:`OverBudget`. The
budget is deterministic: the same template on the same event stops at the same place.

Two operators can make a huge value in one step and are checked before they run:
repetition (``"x" * 10**9``, ``[s] * n``) may make at most :data:`MAX_REPEAT_SIZE`
characters or items, ``**`` at most :data:`MAX_POWER_BITS` bits. What a filter does with
a value it is given is linear in the value's size, which the upstream bounds; a time and
memory budget for what a step cannot see is the child process's (``render_process``).

Steps are counted only inside :func:`metered` (``render.render`` opens it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any

from jinja2 import nodes
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

__all__ = [
    "MACRO_STEPS",
    "MAX_POWER_BITS",
    "MAX_REPEAT_SIZE",
    "STEP_BUDGET",
    "OverBudget",
    "Sandbox",
    "metered",
]

#: Steps a render may take. A chat preset takes under 100; a million took 0.2 s (loop
#: iterations) to 2 s (recursive loops) on the 2-core machine of bench/render.py.
STEP_BUDGET = 1_000_000
#: What calling a macro (or ``caller()``, or a recursive ``loop()``) costs: Jinja2's call
#: (arguments, frame, output buffer) takes 10 to 30 times as long as a loop iteration.
MACRO_STEPS = 20
#: The most characters (or items) one ``*`` may make.
MAX_REPEAT_SIZE = 1_000_000
#: The most bits the result of one ``**`` may have.
MAX_POWER_BITS = 100_000
#: The filter the parser wraps every for loop's iterable in (not meant for templates).
COUNTED_FILTER = "_steps"


class OverBudget(Exception):
    """A render went over its step budget or made a value over a size bound."""


class _Meter:
    __slots__ = ("budget", "left")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.left = budget

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            self.stop()

    def stop(self) -> None:
        raise OverBudget(f"template over its budget of {self.budget} steps")


_METER: ContextVar[_Meter | None] = ContextVar("sessionhook_template_steps", default=None)


@contextlib.contextmanager
def metered(budget: int = STEP_BUDGET) -> Iterator[None]:
    """Count the steps of the renders inside (this thread or task) against ``budget``."""
    token = _METER.set(_Meter(budget))
    try:
        yield
    finally:
        _METER.reset(token)


def _spend(steps: int = 1) -> None:
    meter = _METER.get()
    if meter is not None:
        meter.spend(steps)


def _counted(iterable: Iterable[Any]) -> Iterable[Any]:
    meter = _METER.get()
    if meter is None:
        return iterable
    return _each_a_step(iterable, meter)


def _each_a_step(iterable: Iterable[Any], meter: _Meter) -> Iterator[Any]:
    for item in iterable:
        meter.left -= 1  # spend(1), inlined: this runs for every iteration of every loop
        if meter.left < 0:
            meter.stop()
        yield item


def _range(*args: int) -> range:
    numbers = safe_range(*args)  # the sandbox's own cap: 100000 numbers
    _spend(len(numbers))
    return numbers


def _sized(value: Any) -> int:
    """Characters or items ``value`` stands for when repeated (a list of strings: their
    total length, so that ``[title] * n | join`` is judged by what it will make)."""
    if isinstance(value, str | bytes):
        return len(value)
    return sum(len(item) if isinstance(item, str | bytes) else 1 for item in value)


class Sandbox(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox that counts steps and bounds ``*`` and ``**``."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals["range"] = _range
        self.filters[COUNTED_FILTER] = _counted

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        # Every template passes here (from_string and the loader alike): each for loop
        # then iterates through _counted. A recursive loop's later levels come through
        # call() below.
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Filter(
                loop.iter, COUNTED_FILTER, [], [], None, None, lineno=loop.lineno
            )
        return tree

    def getattr(self, obj: Any, attribute: str) -> Any:
        """``obj.attribute`` in the template: one step."""
        meter = _METER.get()
        if meter is not None:  # spend(1), inlined: templates read attributes all the time
            meter.left -= 1
            if meter.left < 0:
                meter.stop()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        """``obj[argument]`` in the template: one step."""
        meter = _METER.get()
        if meter is not None:
            meter.left -= 1
            if meter.left < 0:
                meter.stop()
        return super().getitem(obj, argument)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Call ``obj`` from the template: one step, a macro or ``caller()``
        :data:`MACRO_STEPS` (a recursive ``loop(items)`` also one per item)."""
        if isinstance(obj, Macro):
            _spend(MACRO_STEPS)
        elif isinstance(obj, LoopContext) and args:
            _spend(MACRO_STEPS)
            args = (_counted(args[0]), *args[1:])
        else:
            _spend()
        return super().call(context, obj, *args, **kwargs)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        """``*`` and ``**`` (the intercepted operators), refused when the result would be
        over its size bound."""
        if operator == "*":
            _check_repeat(left, right)
            _check_repeat(right, left)
        else:
            _check_power(left, right)
        return super().call_binop(context, operator, left, right)


def _check_repeat(times: Any, value: Any) -> None:
    if not isinstance(times, int) or not isinstance(value, str | bytes | list | tuple):
        return
    if times > 0 and _sized(value) * times > MAX_REPEAT_SIZE:
        raise OverBudget(
            f"template over its size budget: * would make more than {MAX_REPEAT_SIZE} "
            "characters or items"
        )


def _check_power(base: Any, exponent: Any) -> None:
    if not isinstance(base, int) or not isinstance(exponent, int) or exponent < 2:
        return
    if abs(base) > 1 and abs(base).bit_length() * exponent > MAX_POWER_BITS:
        raise OverBudget(
            f"template over its size budget: ** would make more than {MAX_POWER_BITS} bits"
        )
