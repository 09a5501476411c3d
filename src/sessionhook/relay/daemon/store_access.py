"""Opening the daemon's store, and the upstream budget kept in it.

* The daemon lock (:mod:`sessionhook.relay.store.lock`): a second daemon on the same SQLite
  store is refused at once (exit status 2), naming the PID that holds it; PostgreSQL relays
  share their store (replicas) and take no lock.
* Opening: a store that cannot be opened is a :class:`~.daemon_errors.DaemonError`. An
  existing store that cannot be opened for lack of space is retried with growing delays
  (``READY=1`` is sent so systemd does not restart a daemon that a restart cannot help,
  /readyz says why); a store that cannot be created is a
  :class:`~.daemon_errors.DaemonError`.
* The upstream budget: each account's :class:`~.ratelimit.RateLimiter` keeps its 60 s window
  in the store, so a restart within a minute stays within ``requests_per_minute``; every
  upstream request is counted per endpoint and status (metrics and the store's per-minute
  counters).

:class:`StoreMixin` is mixed into :class:`~sessionhook.relay.daemon.daemon.Daemon`, which provides
what is declared under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import anyio

from ..config import Account, Config
from ..polling.budget import SharedWindow
from ..store import (
    AsyncStore,
    StoreError,
    StoreFullError,
    StoreLockedError,
    StoreUnwritableError,
    acquire_daemon_lock,
    open_store,
)
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics
from . import sdnotify
from .errors import DaemonError, store_failures

__all__ = ["BUDGET_LEASE", "StoreMixin", "UpstreamTally"]

#: Request grants taken from the store's budget window at once (see ``Store.take_budget``).
BUDGET_LEASE = 5

_log = get_logger()


class StoreMixin:
    """The store's opening and the upstream budget of :class:`~.daemon.Daemon`."""

    if TYPE_CHECKING:
        config: Config
        metrics: Metrics
        store: AsyncStore | None
        _clock: Callable[[], float]
        _stop: anyio.Event
        _open_problem: str | None
        _upstream_tally: UpstreamTally | None

        def store_unwritable(
            self, error: StoreUnwritableError, *, first: bool, retry_in: float
        ) -> None: ...
        def store_writable_again(self, *, after: float) -> None: ...

    @contextmanager
    def _daemon_lock(self) -> Iterator[None]:
        """Hold the store's daemon lock (one daemon per SQLite store) for the block; a
        PostgreSQL store takes no file lock (its relays share it, see the store package)."""
        if self.config.store.database_url() is not None:
            yield
            return
        try:
            # Before the store is touched: a second daemon must not even migrate it.
            lock = acquire_daemon_lock(self.config.store.path)
        except StoreLockedError as exc:
            raise DaemonError(str(exc), exit_code=2) from None
        except StoreError as exc:
            raise DaemonError(f"cannot open the store: {exc}") from None
        with lock:
            yield

    async def _open_store(self, *, wait: bool) -> AsyncStore | None:
        """Open the store and sync the endpoints into it.

        On a full disk, an existing store is tried again with growing delays (``wait``),
        /readyz saying why, until it opens or the daemon is stopped (then ``None``). A
        store that does not exist yet cannot be created: :class:`DaemonError`.
        """
        settings = self.config.store
        postgres = settings.database_url() is not None
        # A PostgreSQL database exists already (or opening it is an error to fix).
        existed = postgres or settings.path.exists()
        store: AsyncStore | None = None
        delay, failures, since = 1.0, 0, time.monotonic()
        try:
            while True:
                try:
                    if store is None:
                        opened = await anyio.to_thread.run_sync(
                            functools.partial(open_store, settings, clock=self._clock)
                        )
                        store = AsyncStore(opened, wait_for_space=wait, observer=self)
                    await store.call(store.store.sync_endpoints, list(self.config.endpoints))
                    break
                except StoreUnwritableError as exc:
                    full = isinstance(exc, StoreFullError)
                    if store is None and not existed:
                        raise DaemonError(
                            f"cannot create the store: the disk is full ({exc})"
                        ) from None
                    if not wait:
                        what = "the disk is full" if full else "it cannot be written now"
                        raise DaemonError(f"cannot open the store: {what} ({exc})") from None
                    failures += 1
                    self._open_problem = (
                        f"store is full, waiting for disk space: {exc}"
                        if full
                        else f"store is unavailable, waiting for it: {exc}"
                    )
                    self.store_unwritable(exc, first=failures == 1, retry_in=delay)
                    if failures == 1:  # systemd must not time the start out and retry
                        sdnotify.ready(
                            "store is full: waiting for disk space"
                            if full
                            else "store is unavailable: waiting for it"
                        )
                    sdnotify.watchdog()
                    with anyio.move_on_after(delay):
                        await self._stop.wait()
                    if self._stop.is_set():
                        if store is not None:
                            await store.close()
                        return None
                    delay = min(10.0, delay * 2)  # <= half the unit's WatchdogSec
                except StoreError as exc:
                    # PostgreSQL: a wrong password, a missing database, not ours, newer:
                    # a setting to fix, like a config error.
                    code = 2 if postgres else 1
                    raise DaemonError(f"cannot open the store: {exc}", exit_code=code) from None
                except store_failures() as exc:
                    raise DaemonError(f"cannot open the store: {exc}") from None
        except BaseException:
            if store is not None:
                with anyio.CancelScope(shield=True):
                    await store.close()
            raise
        if failures:
            self.store_writable_again(after=time.monotonic() - since)
        self._open_problem = None
        return store

    def _budget_window(self, store: AsyncStore, account: Account) -> SharedWindow:
        """The account's ``requests_per_minute`` window kept in the store."""
        rpm = account.requests_per_minute
        leased = 0  # grants taken from the store and not used yet

        async def take_budget() -> float:
            # The window lives in the store: a restart within a minute stays in budget.
            # Grants are leased a few at a time (one write per BUDGET_LEASE requests).
            # A store that cannot be written (full disk...) leaves the in-process window,
            # which holds the same rule for this process: no reason to stop polling.
            nonlocal leased
            if leased:
                leased -= 1
                return 0.0
            try:
                granted, wait = await store.call(
                    store.store.take_budget, account.name, self._clock(), rpm, count=BUDGET_LEASE
                )
            except store_failures() as exc:
                _log.warning("upstream.budget_not_stored", error=str(exc))
                return 0.0
            if granted:
                leased = granted - 1
            return wait

        return take_budget

    async def _record_upstream(self, label: str, status: int | str | None) -> None:
        self.metrics.upstream_request(label, status)
        tally = self._upstream_tally
        if tally is not None:
            tally.add(label, status, self._clock())  # written by its flusher, see there
        elif self.store is not None:
            await self.store.record_upstream(label, status, self._clock())

    async def _flush_upstream_counts(self, store: AsyncStore) -> None:
        """The long run's writer of the upstream counters (a side task): requests are
        counted in :class:`UpstreamTally` as they are answered and written here, a batch
        per store call, until cancelled; then what is left is written (shielded)."""
        tally = self._upstream_tally = UpstreamTally()
        try:
            await tally.run(store)
        finally:
            self._upstream_tally = None
            with anyio.CancelScope(shield=True):
                await tally.flush(store)


class UpstreamTally:
    """Upstream requests counted on their way to the store's per-minute counters.

    Recording a request used to be one store write, awaited by the request itself: with a
    backlog, every upstream answer waited behind the store's queue of page ingests
    (~18 ms a request at load 5; on the path that paces a backfill, the discovery's GET
    of each new session, it was about a third of the time). :meth:`add` is instant;
    :meth:`run` writes what was added, one transaction per store call, as soon as the
    previous one committed. The counts reach the store one store round trip later; a
    statistic, so like :meth:`AsyncStore.record_upstream` it is skipped while the store
    is full (``try_write``). A ``kill -9`` loses the counts not written yet (the requests
    answered during the last store call), as it lost the count of a request answered
    just before it."""

    def __init__(self) -> None:
        self._pending: Counter[tuple[str, int | str | None, int]] = Counter()
        self._added = anyio.Event()

    def add(self, label: str, status: int | str | None, at: float) -> None:
        """Count one request (answered at Unix time ``at``)."""
        self._pending[(label, status, int(at // 60))] += 1
        self._added.set()

    async def run(self, store: AsyncStore) -> None:
        """Write what is added, batch after batch, forever (until cancelled)."""
        while True:
            await self._added.wait()
            self._added = anyio.Event()
            await self.flush(store)

    async def flush(self, store: AsyncStore) -> None:
        """Write what was added and not written yet (one transaction)."""
        batch, self._pending = self._pending, Counter()
        if batch:
            await store.try_write(store.store.record_upstream_counts, dict(batch))
