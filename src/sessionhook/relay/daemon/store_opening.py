"""Opening the daemon's store, under the daemon lock: :class:`StoreOpener`.

A second daemon on the same SQLite store is refused at once (exit 2), naming the PID
holding the lock; PostgreSQL replicas take no lock. An existing store that cannot be opened
for lack of space is retried with growing delays (``READY=1`` sent, /readyz says why); any
other failure is a :class:`~.errors.DaemonError`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager

import anyio

from ..store import (
    AsyncStore,
    EndpointConflictError,
    EndpointQueries,
    FullObserver,
    StoreError,
    StoreFullError,
    StoreLockedError,
    StoreUnwritableError,
    acquire_daemon_lock,
    open_store,
    store_failures,
)
from . import sdnotify
from .errors import DaemonError
from .state import DaemonState


class StoreOpener:
    """Holds the daemon lock and opens the store; while space lacks, ``observer`` hears of
    it and ``state.open_problem`` says why, for /readyz."""

    def __init__(self, state: DaemonState, observer: FullObserver) -> None:
        self._state = state
        self._observer = observer

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the store's daemon lock (one daemon per SQLite store; none for PostgreSQL)."""
        if self._state.config.store.database_url() is not None:
            yield
            return
        try:
            # Before the store is touched: a second daemon must not even migrate it.
            lock = acquire_daemon_lock(self._state.config.store.path)
        except StoreLockedError as exc:
            raise DaemonError(str(exc), exit_code=2) from None
        except StoreError as exc:
            raise DaemonError(f"cannot open the store: {exc}") from None
        with lock:
            yield

    async def open(self, *, wait: bool) -> AsyncStore | None:
        """Open the store and sync the endpoints into it.

        On a full disk, an existing store is tried again with growing delays (``wait``),
        /readyz saying why, until it opens or the daemon is stopped (then ``None``). A
        store that does not exist yet cannot be created: :class:`DaemonError`.
        """
        settings = self._state.config.store
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
                            functools.partial(open_store, settings, clock=self._state.clock)
                        )
                        store = AsyncStore(opened, wait_for_space=wait, observer=self._observer)
                    endpoints = list(self._state.config.endpoints)  # a reload may change them
                    await store.run(EndpointQueries.sync_endpoints, endpoints)
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
                    self._state.open_problem = (
                        f"store is full, waiting for disk space: {exc}"
                        if full
                        else f"store is unavailable, waiting for it: {exc}"
                    )
                    self._observer.store_unwritable(exc, first=failures == 1, retry_in=delay)
                    if failures == 1:  # systemd must not time the start out and retry
                        sdnotify.ready(
                            "store is full: waiting for disk space"
                            if full
                            else "store is unavailable: waiting for it"
                        )
                    sdnotify.watchdog()
                    with anyio.move_on_after(delay):
                        await self._state.stop.wait()
                    if self._state.stop.is_set():
                        if store is not None:
                            await store.close()
                        return None
                    delay = min(10.0, delay * 2)  # <= half the unit's WatchdogSec
                except EndpointConflictError as exc:
                    # A name of the config file taken by an endpoint created at run time.
                    raise DaemonError(f"config: {exc}", exit_code=2) from None
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
            self._observer.store_writable_again(after=time.monotonic() - since)
        self._state.open_problem = None
        return store
