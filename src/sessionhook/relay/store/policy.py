"""How a store method meets a store that cannot be written or reached for now: its policy,
declared once, on the method that implements it (or on an operator's function over the
store), and read by the async door (:meth:`~.aio.AsyncStore.run`). The decorators return
the function itself, marked: a synchronous caller calls it as it is. The policies are
tabled in ``docs/store.md``, "The async door".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
B = TypeVar("B", bound=Callable[..., bool])

Policy = Literal["call", "read", "write", "try_write"]
#: The attribute a decorator sets: a :data:`Policy`, or the test of :func:`writes_when`.
_ATTRIBUTE: Final = "store_policy"


def call(fn: F) -> F:
    """Run once; a failure is raised."""
    setattr(fn, _ATTRIBUTE, "call")
    return fn


def read(fn: F) -> F:
    """A read that waits out an unreachable store."""
    setattr(fn, _ATTRIBUTE, "read")
    return fn


def write(fn: F) -> F:
    """A write that waits out a full disk or an unreachable store."""
    setattr(fn, _ATTRIBUTE, "write")
    return fn


def try_write(fn: B) -> B:
    """A statistic: skipped while the store cannot be written (it returns ``True``; the
    door returns ``False`` for a write skipped or failed)."""
    setattr(fn, _ATTRIBUTE, "try_write")
    return fn


def writes_when(test: Callable[..., bool]) -> Callable[[F], F]:
    """A :func:`write` when ``test(target, *args, **kwargs)`` (the method's own arguments)
    holds, else a :func:`call`."""

    def mark(fn: F) -> F:
        setattr(fn, _ATTRIBUTE, test)
        return fn

    return mark


def policy_of(fn: Callable[..., Any]) -> Policy | Callable[..., bool] | None:
    """The policy ``fn`` is marked with (the test of :func:`writes_when`), or ``None``."""
    policy: Policy | Callable[..., bool] | None = getattr(fn, _ATTRIBUTE, None)
    return policy
