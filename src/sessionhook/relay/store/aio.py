""":class:`AsyncStore`, the one async door into a store (SQLite or PostgreSQL).

Every async caller (the poller, the dispatcher, the daemon, the web console and stream) goes
through it: ``await astore.outbox.record_attempts(...)``. It has the store's roles as
attributes (:mod:`.views`: the methods of :mod:`.roles`, awaitable), and runs each call in
the store's thread under one of its policies for a store that cannot be written or reached
for now (below). An operator's function over the synchronous store
(:mod:`sessionhook.relay.ops`) runs there too: :meth:`AsyncStore.run`.

A full disk (or a store that cannot be written for now)
    A write that fails for lack of space (:class:`~.rows.StoreFullError`), or because the
    file or its mount is read-only (:class:`~.rows.StoreUnwritableError`, the base class),
    rolled back whole. The AsyncStore then records it (:attr:`AsyncStore.unwritable`) and,
    in the daemon's default mode (``wait_for_space=True``), the write WAITS: it is tried
    again after a growing delay (``retry_base`` doubling up to ``retry_cap`` seconds) until
    it commits, so nothing the poller archived or the dispatcher sent is lost, and the
    caller simply waits. Writes that are only statistics (the upstream counters, a
    discovery pass's time, the heartbeat) are skipped instead (:meth:`AsyncStore.try_write`).
    :meth:`AsyncStore.wait_writable` lets a loop pause (and probe) until space returns;
    :meth:`AsyncStore.stop_waiting` makes waiting writes give up with the error (shutdown).
    ``wait_for_space=False`` (``--once``) raises at once. An ``observer`` hears when the
    store becomes unwritable, is still unwritable, and recovers (the daemon logs and counts
    it).
"""

from __future__ import annotations

import functools
import math
import os
import time
import weakref
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import anyio
import anyio.to_thread

from .core import StoreCore
from .dialect import WakeSource
from .rows import StoreUnwritableError
from .sqlite import Store
from .thread import StoreThread
from .views import (
    AsyncActions,
    AsyncConsole,
    AsyncEconomy,
    AsyncEndpoints,
    AsyncIngest,
    AsyncLeases,
    AsyncMeta,
    AsyncOperator,
    AsyncOutbox,
    AsyncRefusals,
)

__all__ = ["AsyncStore", "FullObserver"]

P = ParamSpec("P")
T = TypeVar("T")
#: Unwritable again within this many seconds of recovering: the same episode continues.
_RELAPSE = 60.0


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
    ``CapacityLimiter(store.concurrency)`` (the pool's size).

    The roles are attributes, as on the store (``astore.ingest``, ``astore.outbox``...), each
    method awaitable and declared with its policy (:mod:`.views`): :meth:`call` (once),
    :meth:`read` (waits out an unreachable store), :meth:`write` (waits out a full disk) or
    :meth:`try_write` (a statistic, skipped). A call whose task is cancelled still finishes
    its transaction in the thread (anyio does not abandon the thread), so cancellation
    never half-writes.
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
        #: through the roles below, or :meth:`run` for a function of your own.
        self.store = store
        self._limiter = anyio.CapacityLimiter(store.concurrency)
        self._thread = StoreThread() if store.concurrency == 1 else None
        if self._thread is not None:
            # A handle dropped without close() (tests, an aborted start) ends its thread too.
            weakref.finalize(self, self._thread.stop)
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
        self.meta = AsyncMeta(self, store.meta)
        self.endpoints = AsyncEndpoints(self, store.endpoints)
        self.ingest = AsyncIngest(self, store.ingest)
        self.refusals = AsyncRefusals(self, store.refusals)
        self.outbox = AsyncOutbox(self, store.outbox, store.leases)
        self.leases = AsyncLeases(self, store.leases)
        self.economy = AsyncEconomy(self, store.economy)
        self.operator = AsyncOperator(self, store.operator)
        self.console = AsyncConsole(self, store.console)
        self.actions = AsyncActions(self, store.actions)

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
        self, fn: Callable[Concatenate[StoreCore, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(store, *args, **kwargs)`` in the store's thread, once (as :meth:`call`): a
        function of the operator's over the synchronous store, e.g.
        ``await astore.run(ops.resume_position, event_id)``."""
        return await self.call(lambda: fn(self.store, *args, **kwargs))

    async def run_write(
        self, fn: Callable[Concatenate[StoreCore, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """:meth:`run` as a write: a full disk is waited out (see :meth:`write`)."""
        return await self.write(lambda: fn(self.store, *args, **kwargs))

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` in the store's worker thread, once; no space or a
        read-only store raises :class:`StoreUnwritableError` (see :meth:`write` to wait it
        out)."""
        try:
            if self._thread is not None and not self._thread.stopped:
                return await self._thread.run(functools.partial(fn, *args, **kwargs))
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

    async def write(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a write, waiting out a full disk (see the module docstring).

        Raises :class:`StoreUnwritableError` without waiting when ``wait_for_space`` is off or
        :meth:`stop_waiting` was called.
        """
        while True:
            if self.unwritable is not None and self.wait_for_space:
                await self._pause()
            try:
                result = await self.call(fn, *args, **kwargs)
            except StoreUnwritableError as exc:
                self._failed(exc)
                if not self.wait_for_space:
                    raise
                continue
            self._succeeded()
            return result

    async def read(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a read the daemon cannot go on without (the poller's), waiting out a store
        that cannot be reached (a PostgreSQL restart) as :meth:`write` does, instead of
        raising :class:`StoreUnwritableError` into the task. Unlike a write it does not
        wait while a full disk is known: reads work without space."""
        while True:
            try:
                return await self.call(fn, *args, **kwargs)
            except StoreUnwritableError as exc:
                self._failed(exc)
                if not self.wait_for_space:
                    raise
            await self._pause()

    async def try_write(
        self, fn: Callable[P, object], /, *args: P.args, **kwargs: P.kwargs
    ) -> bool:
        """Run a write that may be skipped (statistics): not tried while the store is full
        and its retry is not due; returns whether it committed."""
        if self.unwritable is not None and anyio.current_time() < self._retry_at:
            return False
        try:
            await self.call(fn, *args, **kwargs)
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
                await self.meta.probe("write_probe_at", repr(time.time()))

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
            await self.call(self.store.close)
        finally:
            if self._thread is not None:
                self._thread.stop()

    aclose = close
