""":class:`AsyncStore`, the one async door into a store (SQLite or PostgreSQL):
``await astore.run(Outbox.record_attempts, records)`` runs a role's method (or
``astore.run(ops.status, now)`` an operator's function over the store) in the store's
thread, under the policy its decorator declares (:mod:`.policy`).

A store that cannot be written for now (:class:`~.errors.StoreFullError`, or the base
:class:`~.errors.StoreUnwritableError`) is recorded (:attr:`AsyncStore.unwritable`, an
``observer`` hears it begin, last and end); with ``wait_for_space=True`` (the daemon) a
``write`` is tried again after a growing delay (``retry_base`` doubling up to ``retry_cap``
seconds) until it commits, and a ``try_write`` is skipped; ``wait_for_space=False``
(``--once``) raises at once. See ``docs/store.md``, "The async door".
"""

from __future__ import annotations

import functools
import math
import os
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

import anyio
import anyio.to_thread

from .core import StoreCore
from .dialect import WakeSource
from .errors import StoreUnwritableError
from .leases import ReplicaState
from .meta import MetaQueries
from .outbox import Outbox
from .policy import Policy, policy_of
from .sqlite import Store
from .thread import StoreThread

P = ParamSpec("P")
T = TypeVar("T")
#: Unwritable again within this many seconds of recovering: the same episode continues.
_RELAPSE = 60.0
#: What runs a method under a policy: ``door(method, *args, **kwargs)``.
_Door = Callable[..., Awaitable[Any]]
_Policy = Policy | Callable[..., bool]
#: The calls a store with worker threads (PostgreSQL) runs in a thread of their own: the
#: dispatcher's round, hundreds a second, one at a time (see :class:`AsyncStore`).
_OWN_THREAD = (Outbox.dispatch_round,)
#: The door's method of each policy.
_DOORS: dict[Policy, str] = {
    "call": "_call",
    "read": "_read",
    "write": "_write",
    "try_write": "_try_write",
}


class FullObserver(Protocol):
    """Hears about an unwritable store (the daemon: logs, metrics, systemd status)."""

    def store_unwritable(
        self, error: StoreUnwritableError, *, first: bool, retry_in: float
    ) -> None:
        """A write failed, for lack of space or else (``first``: it was writable before)."""

    def store_writable_again(self, *, after: float) -> None:
        """A write succeeded again, ``after`` seconds after the store became unwritable."""


class AsyncStore:
    """The async door into a store (:class:`~.core.StoreCore`): every call runs in a
    thread, so the event loop never waits on disk: on SQLite (one writer connection) the
    store's own :class:`~.thread.StoreThread`, one call after another, in order (a third of
    the hand-off cost of ``anyio.to_thread``); on PostgreSQL anyio's worker threads under a
    ``CapacityLimiter(store.concurrency)`` (the pool's size), but for the dispatcher's
    rounds, which run one at a time in a :class:`~.thread.StoreThread` of their own
    (under the same limiter).

    :meth:`run` is the one way in; the policy of what it runs says how it meets a store
    that cannot be written or reached for now (:mod:`.policy`): once, an unreachable store
    waited out, a full disk waited out, or a statistic skipped. A call whose task is
    cancelled still finishes its transaction in the thread (anyio does not abandon the
    thread), so cancellation never half-writes.
    """

    def __init__(
        self,
        store: StoreCore,
        *,
        wait_for_space: bool = True,
        observer: FullObserver | None = None,
        retry_base: float = 1.0,
        retry_cap: float = 30.0,
    ) -> None:
        #: The synchronous store the door runs. Never call it from the event loop: go
        #: through :meth:`run`.
        self.store = store
        self._limiter = anyio.CapacityLimiter(store.concurrency)
        self._thread = StoreThread() if store.concurrency == 1 else None
        #: Per function of :data:`_OWN_THREAD`, its thread (a store with worker threads).
        self._own: dict[Callable[..., Any], StoreThread] = {}
        if self._thread is None:
            self._own = {fn: StoreThread("sessionhook-store-round") for fn in _OWN_THREAD}
        for thread in [self._thread, *self._own.values()]:
            if thread is not None:
                # A handle dropped without close() (tests, an aborted start) ends it too.
                weakref.finalize(self, thread.stop)
        self.wait_for_space = wait_for_space
        self.observer = observer
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        #: The last write error while the store cannot be written; ``None`` when writable.
        self.unwritable: StoreUnwritableError | None = None
        self._full_since = 0.0
        self._failures = 0
        self._retry_at = 0.0
        self._recovered_at = -math.inf
        self._stopped = anyio.Event()  # stop_waiting(): wake the writes waiting for space
        # Built once: each role method (the class's function) -> its role on this store,
        # its name there (looked up at each call: a test may replace it on the instance)
        # and its policy.
        self._methods: dict[Callable[..., Any], tuple[object, str, _Policy]] = {}
        self._role_classes: set[tuple[str, str]] = set()
        for role in store.roles():
            for cls in type(role).__mro__[:-1]:
                self._role_classes.add((cls.__module__, cls.__qualname__))
                for name, member in vars(cls).items():
                    policy = policy_of(member)
                    if policy is not None:
                        self._methods.setdefault(member, (role, name, policy))

    @property
    def replica(self) -> ReplicaState:
        """Who this handle is among the replicas (its id once registered, its lease,
        whether it claims): kept in memory, read without a call."""
        return self.store.replica

    @property
    def exclusive(self) -> bool:
        """At most one daemon runs on this store (SQLite: the daemon lock): this replica
        has no rival (see :attr:`~.dialect.Database.exclusive`)."""
        return self.store.db.exclusive

    def wake_source(self) -> WakeSource | None:
        """What wakes this replica when another one enqueued deliveries (PostgreSQL's
        ``LISTEN``); ``None`` where no other process writes (SQLite)."""
        return self.store.db.wake_source()

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        wait_for_space: bool = True,
        observer: FullObserver | None = None,
    ) -> AsyncStore:
        """:meth:`Store.open` in a worker thread (see :class:`AsyncStore` for the rest)."""
        store = await anyio.to_thread.run_sync(functools.partial(Store.open, path, clock=clock))
        return cls(store, wait_for_space=wait_for_space, observer=observer)

    async def run(
        self, fn: Callable[Concatenate[Any, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(*args, **kwargs)`` in the store's thread, under ``fn``'s policy: ``fn`` is a
        role's method, named by its class (``Outbox.record_attempts``: this store's
        outbox runs it), or a function whose first parameter is the synchronous store
        (``ops.status``: it gets :attr:`store`). A function of a role class that is no
        role method with a policy (a bound method, a helper) is a :class:`TypeError`."""
        found = self._methods.get(fn)
        if found is None:
            target: object = self.store
            method: Callable[..., Any] = functools.partial(fn, self.store)
            policy = self._function_policy(fn)
        else:
            target, name, policy = found
            method = getattr(target, name)
        if not isinstance(policy, str):  # writes_when: decided by the call's arguments
            policy = "write" if policy(target, *args, **kwargs) else "call"
        door: _Door = getattr(self, _DOORS[policy])
        return cast(T, await door(method, *args, **kwargs))

    def _function_policy(self, fn: Callable[..., Any]) -> _Policy:
        """The policy of a function over the synchronous store (see :meth:`run`)."""
        module = getattr(fn, "__module__", None)
        owner = getattr(fn, "__qualname__", "").rpartition(".")[0]
        if (module, owner) in self._role_classes:
            raise TypeError(
                f"{fn.__qualname__} is not a store method with a policy: pass a role's "
                "decorated method by its class (Outbox.record_attempts)"
            )
        return policy_of(fn) or "call"

    async def _call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` in the store's worker thread, once; no space or a
        read-only store raises :class:`StoreUnwritableError` (see :meth:`_write` to wait it
        out)."""
        try:
            if self._thread is not None and not self._thread.stopped:
                return await self._thread.run(functools.partial(fn, *args, **kwargs))
            own = self._own.get(getattr(fn, "__func__", fn))
            if own is not None and not own.stopped:
                async with self._limiter:  # a pooled connection, as a worker thread's
                    return await own.run(functools.partial(fn, *args, **kwargs))
            return await anyio.to_thread.run_sync(
                functools.partial(fn, *args, **kwargs), limiter=self._limiter
            )
        except StoreUnwritableError:
            raise
        except Exception as exc:
            # Outside a write transaction (a read growing the -shm, a lost connection).
            mapped = self.store.unwritable_error(exc)
            if mapped is not None:
                raise mapped from exc
            raise

    # ----------------------------------------------------------------- full disk

    async def _write(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a write, waiting out a full disk (see the module docstring).

        Raises :class:`StoreUnwritableError` without waiting when ``wait_for_space`` is off or
        :meth:`stop_waiting` was called.
        """
        while True:
            if self.unwritable is not None and self.wait_for_space:
                await self._pause()
            try:
                result = await self._call(fn, *args, **kwargs)
            except StoreUnwritableError as exc:
                self._failed(exc)
                if not self.wait_for_space:
                    raise
                continue
            self._succeeded()
            return result

    async def _read(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a read the daemon cannot go on without (the poller's), waiting out a store
        that cannot be reached (a PostgreSQL restart) as :meth:`_write` does, instead of
        raising :class:`StoreUnwritableError` into the task. Unlike a write it does not
        wait while a full disk is known: reads work without space."""
        while True:
            try:
                return await self._call(fn, *args, **kwargs)
            except StoreUnwritableError as exc:
                self._failed(exc)
                if not self.wait_for_space:
                    raise
            await self._pause()

    async def _try_write(
        self, fn: Callable[P, object], /, *args: P.args, **kwargs: P.kwargs
    ) -> bool:
        """Run a write that may be skipped (statistics): not tried while the store is full
        and its retry is not due; returns whether it committed."""
        if self.unwritable is not None and anyio.current_time() < self._retry_at:
            return False
        try:
            await self._call(fn, *args, **kwargs)
        except StoreUnwritableError as exc:
            self._failed(exc)
            return False
        self._succeeded()
        return True

    async def wait_writable(self) -> None:
        """Return at once while the store is writable; else probe it with a tiny write at
        each retry time until one commits (or :meth:`stop_waiting` is called)."""
        while self.unwritable is not None and self.wait_for_space:
            await self._pause()
            if self.wait_for_space:
                await self.run(MetaQueries.probe, "write_probe_at", repr(time.time()))

    def stop_waiting(self) -> None:
        """Make waiting writes raise :class:`StoreUnwritableError` now (the daemon stops)."""
        self.wait_for_space = False
        self._stopped.set()

    async def _pause(self) -> None:
        """Until the next retry is due, or :meth:`stop_waiting`."""
        with anyio.move_on_after(max(0.0, self._retry_at - anyio.current_time())):
            await self._stopped.wait()

    def _failed(self, exc: StoreUnwritableError) -> None:
        now = anyio.current_time()
        first = self.unwritable is None
        if first and now - self._recovered_at < _RELAPSE:
            # Writable again only briefly (a small probe fitted, the next big write did not):
            # the same episode, so the delays keep growing and it is not announced anew.
            first = False
        elif first:
            self._full_since, self._failures = now, 0
        self.unwritable = exc
        if first or now >= self._retry_at:  # concurrent failures do not grow the delay
            self._failures += 1
            delay = min(self._retry_cap, self._retry_base * 2 ** (self._failures - 1))
            self._retry_at = now + delay
            if self.observer is not None:
                self.observer.store_unwritable(exc, first=first, retry_in=delay)

    def _succeeded(self) -> None:
        if self.unwritable is None:
            return
        self.unwritable = None
        self._retry_at = 0.0
        self._recovered_at = anyio.current_time()
        if self.observer is not None:
            self.observer.store_writable_again(after=anyio.current_time() - self._full_since)

    async def close(self) -> None:
        """Close the store once every queued call has run (then its thread ends)."""
        try:
            await self._call(self.store.close)
        finally:
            for thread in [self._thread, *self._own.values()]:
                if thread is not None:
                    thread.stop()
