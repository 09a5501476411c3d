""":class:`AsyncStore`, the daemon's async handle on a store (SQLite or PostgreSQL).

A full disk (or a store that cannot be written for now)
    A write that fails for lack of space (:class:`~.rows.StoreFullError`), or because the
    file or its mount is read-only (:class:`~.rows.StoreUnwritableError`, the base class),
    rolled back whole. The AsyncStore then records it (:attr:`AsyncStore.unwritable`) and, in the
    daemon's default mode (``wait_for_space=True``), the write WAITS: it is tried again after
    a growing delay (``retry_base`` doubling up to ``retry_cap`` seconds) until it commits, so
    nothing the poller archived or the dispatcher sent is lost, and the caller simply waits.
    Writes that are only statistics (:meth:`record_upstream`, :meth:`mark_poll`) are
    skipped instead. :meth:`wait_writable` lets a loop pause (and probe) until space
    returns; :meth:`stop_waiting` makes waiting writes give up with the error (shutdown).
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import ParamSpec, Protocol, TypeVar

import anyio
import anyio.to_thread

from sessionhook.api.models import Activity, Session

from ..domain.events import Event
from ..domain.retry import Decision
from .core import StoreCore
from .outbox import AttemptRecord
from .rows import (
    AttemptLike,
    DueDelivery,
    EndpointLike,
    EndpointState,
    Ingested,
    SessionRow,
    StatusSummary,
    StoreUnwritableError,
)
from .sqlite import Store
from .thread import StoreThread

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
    """The daemon's handle on a store (:class:`~.core.StoreCore`): every call runs in a
    thread, so the event loop never waits on disk: on SQLite (one writer connection) the
    store's own :class:`~.thread.StoreThread`, one call after another, in order (a third of
    the hand-off cost of ``anyio.to_thread``); on PostgreSQL anyio's worker threads under a
    ``CapacityLimiter(store.concurrency)`` (the pool's size).

    Explicit async methods cover what the poller, dispatcher and health server use (their
    writes wait out a full disk, see the module docstring); any other Store method is
    reachable through :meth:`call` (``await astore.call(store.replay,
    "ci", since=t)``). A call whose task is cancelled still finishes its transaction in the
    thread (anyio does not abandon the thread), so cancellation never half-writes.
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

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` (a Store method) in the store's worker thread, once;
        no space or a read-only store raises :class:`StoreUnwritableError` (see :meth:`write`
        to wait it out)."""
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

    async def write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
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

    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
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

    async def try_write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> bool:
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
                await self.try_write(self.store.set_meta, "write_probe_at", repr(time.time()))

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

    async def save_rendered(self, delivery_id: int, body: bytes, content_type: str) -> None:
        """See :meth:`Store.save_rendered`."""
        await self.call(self.store.save_rendered, delivery_id, body, content_type)

    async def rendered_body(self, delivery_id: int) -> tuple[bytes, str] | None:
        """See :meth:`Store.rendered_body`."""
        return await self.call(self.store.rendered_body, delivery_id)

    async def latest_activity(self, session_name: str, member: str) -> Activity | None:
        """See :meth:`Store.latest_activity`."""
        return await self.read(self.store.latest_activity, session_name, member)

    async def sync_endpoints(self, endpoints: Iterable[EndpointLike]) -> None:
        """See :meth:`Store.sync_endpoints`."""
        await self.write(self.store.sync_endpoints, list(endpoints))

    async def set_endpoint_enabled(self, name: str, enabled: bool, reason: str | None) -> None:
        """See :meth:`Store.set_endpoint_enabled`."""
        await self.write(self.store.set_endpoint_enabled, name, enabled, reason)

    async def endpoint_states(self) -> list[EndpointState]:
        """See :meth:`Store.endpoint_states`."""
        return await self.call(self.store.endpoint_states)

    async def get_session(self, name: str) -> SessionRow | None:
        """See :meth:`Store.get_session`."""
        return await self.read(self.store.get_session, name)

    async def all_sessions(self) -> list[SessionRow]:
        """See :meth:`Store.all_sessions`."""
        return await self.call(self.store.all_sessions)

    async def is_baseline_complete(self) -> bool:
        """See :meth:`Store.is_baseline_complete`."""
        return await self.read(self.store.is_baseline_complete)

    async def mark_baseline_complete(self) -> None:
        """See :meth:`Store.mark_baseline_complete`."""
        await self.write(self.store.mark_baseline_complete)

    async def upsert_session(self, session: Session, *, baseline: bool) -> SessionRow:
        """See :meth:`Store.upsert_session`."""
        return await self.write(self.store.upsert_session, session, baseline=baseline)

    async def ingest_session_events(
        self, session_name: str, events: Sequence[Event], deliver: bool
    ) -> Ingested:
        """See :meth:`Store.ingest_session_events`."""
        return await self.write(self.store.ingest_session_events, session_name, events, deliver)

    async def schedule_poll(
        self,
        name: str,
        next_poll_at: float | None,
        *,
        polled_update_time: str | None = None,
        polled_at: float | None = None,
        poll_errors: int | None = None,
    ) -> None:
        """See :meth:`Store.schedule_poll`."""
        await self.write(
            self.store.schedule_poll,
            name,
            next_poll_at,
            polled_update_time=polled_update_time,
            polled_at=polled_at,
            poll_errors=poll_errors,
        )

    async def ingest_activities(
        self,
        session_name: str,
        activities: Sequence[Activity],
        events: Sequence[Event],
        deliver: bool,
        *,
        cursor_limit: str | None = None,
        raws: Sequence[bytes] | None = None,
    ) -> Ingested:
        """See :meth:`Store.ingest_activities`."""
        return await self.write(
            self.store.ingest_activities,
            session_name,
            activities,
            events,
            deliver,
            cursor_limit=cursor_limit,
            raws=raws,
        )

    async def refuse_activity(
        self,
        session_name: str,
        name: str,
        reason: str,
        *,
        create_time: str = "",
        detail: str = "",
        size: int | None = None,
        cursor_limit: str | None = None,
        advance_cursor: bool = False,
    ) -> bool:
        """See :meth:`Store.refuse_activity`."""
        return await self.write(
            self.store.refuse_activity,
            session_name,
            name,
            reason,
            create_time=create_time,
            detail=detail,
            size=size,
            cursor_limit=cursor_limit,
            advance_cursor=advance_cursor,
        )

    async def due_deliveries(
        self, now: float, limit: int, busy: Iterable[tuple[str, str]] = ()
    ) -> list[DueDelivery]:
        """See :meth:`Store.due_deliveries`."""
        return await self.call(self.store.due_deliveries, now, limit, set(busy))

    async def next_due_at(self, after: float | None = None) -> float | None:
        """See :meth:`Store.next_due_at`."""
        return await self.call(self.store.next_due_at, after)

    async def record_attempts(self, records: Sequence[AttemptRecord]) -> list[float | None]:
        """See :meth:`Store.record_attempts` (waits out a full disk, like every write)."""
        return await self.write(self.store.record_attempts, list(records))

    async def prune_delivery_log(self, before: float, *, batch: int = 2000) -> tuple[int, int]:
        """:meth:`Store.prune_delivery_log`, one batch per worker-thread call, so that the
        dispatcher's and poller's writes go in between. Returns (attempts, deliveries)."""
        attempts = deliveries = 0
        while True:
            a, d = await self.call(self.store.prune_delivery_log, before, batch=batch, rounds=1)
            attempts, deliveries = attempts + a, deliveries + d
            if a < batch and d < batch:
                return attempts, deliveries

    async def dispatch_round(
        self,
        records: Sequence[AttemptRecord],
        now: float,
        limit: int,
        busy: Iterable[tuple[str, str]],
        release: Iterable[tuple[str, str]] = (),
        caps: Mapping[str, int] | None = None,
    ) -> tuple[list[float | None], list[DueDelivery], float | None]:
        """One round of the dispatcher in ONE worker-thread call: record ``records`` in one
        transaction (:meth:`Store.record_attempts`, committed before anything is read),
        then :meth:`Store.due_deliveries` (``now``, ``limit``, ``busy``) and, when fewer
        than ``limit`` are due, :meth:`Store.next_due_at` after ``now`` (else ``now``).
        Returns (failing_since per record, due deliveries, next due time). ``release``: keys
        handed out by the previous round and not started, whose claims go back first
        (:meth:`Store.release_delivery_claims`); ``caps``: per endpoint, at most that many
        (its free slots). With records, or for a replica (it claims
        what it reads), it is a write: a full disk is waited out (the batch is retried
        whole, nothing of it was committed), see the module docstring."""
        keys = set(busy)
        records = list(records)
        unclaim = list(release)

        committed: list[list[float | None]] = []

        def work() -> tuple[list[float | None], list[DueDelivery], float | None]:
            # Retried by write() after a failure: a batch already committed is not redone.
            if not committed:
                committed.append(self.store.record_attempts(records))
            failing = committed[0]
            if unclaim:
                self.store.release_delivery_claims(unclaim)
            active = self.store.active_endpoints()  # read once for both queries
            due = self.store.due_deliveries(now, limit, keys, caps, active=active) if limit else []
            if limit > 0 and len(due) >= limit:
                return failing, due, now
            return failing, due, self.store.next_due_at(after=now, active=active)

        # A replica sharing the store claims what it reads: a write.
        claiming = limit > 0 and self.store.claims
        if records or (unclaim and not self.store.exclusive) or claiming:
            return await self.write(work)
        return await self.call(work)

    async def record_attempt(
        self, delivery_id: int, attempt: AttemptLike, decision: Decision
    ) -> float | None:
        """See :meth:`Store.record_attempt`."""
        return await self.write(self.store.record_attempt, delivery_id, attempt, decision)

    async def pending_count(self, endpoint: str | None = None) -> int:
        """See :meth:`Store.pending_count`."""
        return await self.call(self.store.pending_count, endpoint)

    async def outbox_stats(self) -> dict[str, tuple[int, float | None]]:
        """See :meth:`Store.outbox_stats`."""
        return await self.call(self.store.outbox_stats)

    async def status_summary(self, now: float) -> StatusSummary:
        """See :meth:`Store.status_summary`."""
        return await self.call(self.store.status_summary, now)

    async def record_upstream(self, label: str, status: int | str | None, at: float) -> None:
        """See :meth:`Store.record_upstream` (a statistic: skipped while the store is full)."""
        await self.try_write(self.store.record_upstream, label, status, at)

    async def mark_poll(self, ok: bool, at: float) -> None:
        """See :meth:`Store.mark_poll` (a statistic: skipped while the store is full)."""
        await self.try_write(self.store.mark_poll, ok, at)
