"""The relay daemon: one task group, one stop signal.

:class:`Daemon` wires the pieces together and owns their lifetime:

* the store (opened first; a store that cannot be opened is a :class:`DaemonError`), under
  the daemon lock (:mod:`sessionhook.relay.store.lock`): a second daemon on the same store
  is refused at once (exit status 2), naming the PID that holds it;
* the upstream HTTP client, rate limited by one :class:`RateLimiter` (whose 60 s window is
  kept in the store, so a restart within a minute stays within ``requests_per_minute``) and
  counted per endpoint and status (metrics and the store's per-minute counters);
* the :class:`~sessionhook.relay.poller.Poller` and the
  :class:`~sessionhook.relay.dispatch.Dispatcher`, which the poller wakes on enqueue;
* the health server when ``[server]`` is configured (started before the store is opened,
  so /readyz can say why it is not), ``READY=1`` once the store is open and the first
  discovery pass was tried, ``WATCHDOG=1`` while both loops make progress.

A full disk (or a read-only store) does not stop the relay: the daemon is the store's
observer (:class:`~sessionhook.relay.store.FullObserver`). Writes wait for space, no poll or
delivery starts meanwhile, ``store.full`` is logged, ``store_unwritable`` is 1 and /readyz
answers 503 with the reason; everything resumes by itself. An existing store that cannot
even be opened is retried the same way (``READY=1`` is sent so systemd does not restart a
daemon that a restart cannot help); a store that cannot be created is a
:class:`DaemonError`.

SIGTERM and SIGINT set the stop signal: polling stops at once, deliveries in flight get
:data:`DRAIN_SECONDS` to finish, then everything is cancelled (an interrupted attempt is
not lost: its outbox row is retried at the next start) and :meth:`Daemon.run` returns. A
second signal stops at once. SIGHUP reloads the configuration: a bad file is logged and the
running configuration kept; a good one updates endpoints, delivery and poll settings and
the log level (``api``, ``store``, ``server`` and ``delivery.allow_private_networks``
changes need a restart, and say so).

A side task that dies takes the daemon down with it, loudly: a broken store or a bug must
not leave a process that looks alive and delivers nothing.
"""

from __future__ import annotations

import functools
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import httpx

from sessionhook.api.client import RetryPolicy, SessionsClient

from . import health, operator, sdnotify, web
from . import logging as relay_logging
from .config import Account, Config, ConfigError, ServerConfig, load_config
from .dispatch import DeliverySettings, Dispatcher, UrlGuard
from .logging import get_logger
from .metrics import Metrics
from .netguard import AddressPolicy, Resolver
from .pinning import PinnedTransport
from .poller import OnceReport, Poller, PollSettings
from .ratelimit import LimitedTransport, RateLimiter, SharedWindow
from .replica import Replica, dead_replicas, heartbeat_interval, heartbeat_late, pid_alive
from .retry import AttemptResult
from .sender import AiohttpPoster, HttpxPoster, Poster
from .store import (
    DATABASE_ERRORS,
    AsyncStore,
    StoreError,
    StoreFullError,
    StoreLockedError,
    StoreUnwritableError,
    acquire_daemon_lock,
    notify,
    open_store,
)

__all__ = ["DRAIN_SECONDS", "Daemon", "DaemonError"]

#: How long deliveries in flight may take to finish after SIGTERM/SIGINT.
DRAIN_SECONDS = 10.0
#: How often the delivery log is pruned when ``store.delivery_log_retention`` is set.
PRUNE_EVERY = 600.0
#: Request grants taken from the store's budget window at once (see ``Store.take_budget``).
BUDGET_LEASE = 5

_log = get_logger()
_E = TypeVar("_E", bound=BaseException)


#: A store that failed in a way the store did not map (a bug, a corrupt file, an OS error).
_STORE_FAILURES: tuple[type[Exception], ...] = (StoreError, OSError, *DATABASE_ERRORS)


class DaemonError(Exception):
    """The daemon cannot start or cannot go on; ``str()`` is one line for the user.

    ``exit_code`` is the status the command line should exit with.
    """

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Daemon:
    """The relay process; see the module docstring.

    The keyword arguments are seams for tests, the demo and the bench: ``upstream_transport``
    and ``delivery_transport`` replace the network (``httpx.ASGITransport`` of the emulator
    or of a receiver), ``poll_settings`` the poll knobs that the config does not expose,
    ``guard`` the DNS-free pre-check of endpoint URLs, ``resolve`` and ``address_policy``
    the name resolution and the public/private judgement of the webhook connections
    (:class:`~sessionhook.relay.sender.AiohttpPoster`, used unless
    ``delivery_transport`` replaces the network).
    """

    def __init__(
        self,
        config: Config,
        *,
        config_path: Path | None = None,
        upstream_transport: httpx.AsyncBaseTransport | None = None,
        delivery_transport: httpx.AsyncBaseTransport | None = None,
        poll_settings: PollSettings | None = None,
        guard: UrlGuard | None = None,
        resolve: Resolver | None = None,
        address_policy: AddressPolicy | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._config_path = config_path
        self._upstream_transport = upstream_transport
        self._delivery_transport = delivery_transport
        base = poll_settings if poll_settings is not None else PollSettings()
        self._poll_settings = base.with_config(config)
        self._guard = guard
        self._resolve = resolve
        self._address_policy = address_policy
        self.metrics = metrics if metrics is not None else Metrics()
        self._clock = clock
        self._stop = anyio.Event()
        self._stopping = False
        self._started_at = clock()
        self.store: AsyncStore | None = None
        #: Why the store is not open yet (a full disk at start-up), for /readyz.
        self._open_problem: str | None = None
        #: One poller per account (``[[accounts]]``, or the one ``[api]`` describes).
        self.pollers: list[Poller] = []
        self.poller: Poller | None = None  # the first account's
        self.dispatcher: Dispatcher | None = None
        #: Set once the daemon is ready (store open, first poll tried): tests wait on it.
        self.ready = anyio.Event()
        #: Rung whenever events are archived: wakes the event streams.
        self.bell = web.Bell()
        #: This process as a replica of the store (its claims carry this id).
        self.replica = Replica.current()

    def stop(self) -> None:
        """Ask the daemon to stop, as SIGTERM does."""
        self._stop.set()

    # ------------------------------------------------------------------ entry points

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until :meth:`stop` or SIGTERM/SIGINT, then drain and return.

        Raises :class:`DaemonError` when start-up fails, and re-raises whatever killed a
        side task (after logging it).
        """
        try:
            async with anyio.create_task_group() as outer:
                if handle_signals:
                    # First of all, so that a signal during start-up is a clean stop too.
                    await outer.start(self._watch_signals, outer.cancel_scope)
                try:
                    await self._serve()
                except Exception as exc:
                    if _daemon_error(exc) is None:
                        _log.exception("relay.crashed")
                    raise
                finally:
                    outer.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # Task groups wrap what they raise; a start-up failure is one clean error.
            error = _daemon_error(group)
            if error is not None:
                raise error from None
            raise

    async def run_once(self) -> int:
        """One full pass: discover, poll every new/changed/working session, deliver all
        that is due; return the exit status (0, or 1 when something could not be polled).

        Raises :class:`DaemonError` when the store cannot be opened, is held by another
        daemon or is full (nothing is lost: the next pass resumes), or the key is rejected.
        """
        with self._daemon_lock():
            store = await self._open_store(wait=False)
            assert store is not None  # only a stop while waiting for space returns None
            try:
                async with self._wiring(store) as (pollers, dispatcher):
                    report = OnceReport()
                    rejected: list[str] = []
                    for poller in pollers:  # one account's rejected key stops no other
                        one = await poller.run_once()
                        report.sessions_polled += one.sessions_polled
                        report.failed.extend(one.failed)
                        if one.unauthenticated is not None:
                            rejected.append(f"{poller.account}: {one.unauthenticated}")
                    attempts = await dispatcher.run_until_idle()
                    pending = await store.pending_count()
                    if rejected:
                        raise DaemonError(
                            f"the Sessions API rejected the API key ({'; '.join(rejected)})"
                        )
            except Exception as exc:
                unwritable = _find(exc, StoreUnwritableError)
                if unwritable is None:
                    raise
                raise DaemonError(
                    f"the store cannot be written ({unwritable}); nothing committed is lost: "
                    "run again once it can"
                ) from None
        _log.info(
            "relay.once_done",
            sessions_polled=report.sessions_polled,
            attempts=attempts,
            pending=pending,
            failed=report.failed or None,
        )
        if report.failed:
            _log.error("relay.once_incomplete", not_polled=report.failed)
            return 1
        return 0

    # ------------------------------------------------------------------ the long run

    async def _serve(self) -> None:
        with self._daemon_lock():
            async with anyio.create_task_group() as outer:
                # First, so that /readyz answers (503, with the reason) while the store
                # cannot be opened for lack of space.
                if self.config.server is not None:
                    app = web.create_app(
                        self._web_context(self.config.server),
                        readiness=self._readiness,
                        before_scrape=self._refresh_gauges,
                        store={
                            "backend": "sqlite"
                            if self.config.store.database_url() is None
                            else "postgresql",
                            "database": self.config.store.location,
                        },
                    )
                    try:
                        await outer.start(health.serve, self.config.server.listen, app)
                    except health.HealthServerError as exc:
                        raise DaemonError(str(exc)) from None
                store = await self._open_store(wait=True)
                if store is not None:  # None: stopped while waiting for disk space
                    async with self._wiring(store) as (_pollers, dispatcher):
                        await self._run_loops(store, dispatcher)
                outer.cancel_scope.cancel()
        _log.info("relay.stopped")

    def _web_context(self, server: ServerConfig) -> web.WebContext:
        token = server.token
        if token is not None:
            relay_logging.register_secret(token)

        def wake() -> None:
            if self.dispatcher is not None:
                self.dispatcher.wake()

        return web.WebContext(
            config=lambda: self.config,
            store=lambda: self.store,
            metrics=self.metrics,
            auth=web.WebAuth(
                None if token is None else token.get_secret_value(),
                on_failure=self.metrics.web_auth_failed,
            ),
            bell=self.bell,
            clock=self._clock,
            send_test=self.send_test_event,
            wake=wake,
        )

    async def send_test_event(self, name: str) -> AttemptResult:
        """Send endpoint ``name`` a signed ``ping`` now, as ``sessionhook endpoints test``
        does (:func:`.operator.test_endpoint`): the name resolved once, every address
        vetted, the connection pinned to a vetted one. Never archived, never retried.
        Raises :class:`~.operator.OperatorError` for a name the config does not have."""
        transport = self._delivery_transport or PinnedTransport(
            allow_private=self.config.delivery.allow_private_networks,
            resolve=self._resolve,
            policy=self._address_policy,
        )
        _event_id, result = await operator.test_endpoint(
            self.config, name, transport=transport, now=self._clock()
        )
        return result

    async def _run_loops(self, store: AsyncStore, dispatcher: Dispatcher) -> None:
        _log.info(
            "relay.started",
            store=self.config.store.location,
            endpoints=[e.name for e in self.config.endpoints],
            base_url=self.config.api.base_url,
            accounts={a.name: a.base_url for a in self.config.upstream_accounts()},
        )
        if self._stop.is_set():
            return
        async with anyio.create_task_group() as tg:
            poll_scope = anyio.CancelScope()
            tg.start_soon(self._side_task, "poller", self._run_pollers, poll_scope)
            tg.start_soon(self._side_task, "dispatcher", dispatcher.run, None)
            tg.start_soon(self._side_task, "lifecycle", self._lifecycle, None)
            tg.start_soon(self._side_task, "retention", self._retention, None)
            tg.start_soon(self._side_task, "heartbeat", self._heartbeat, None)
            url = getattr(store.store, "url", None)
            if getattr(store.store, "backend", "") == "postgresql" and url:
                # Other replicas' enqueues wake this dispatcher (LISTEN/NOTIFY); the
                # dispatcher's one-second timer backs it up.
                wake = dispatcher.wake
                tg.start_soon(self._side_task, "wakeups", lambda: notify.listen(url, wake), None)
            await self._stop.wait()
            self._stopping = True
            _log.info("relay.stopping", in_flight=dispatcher.in_flight)
            sdnotify.stopping("draining deliveries in flight")
            poll_scope.cancel()
            # Records waiting for disk space give up now: those deliveries stay open and
            # are sent again at the next start (same webhook-id).
            store.stop_waiting()
            with anyio.move_on_after(DRAIN_SECONDS) as drain:
                await dispatcher.drain()
            if drain.cancelled_caught:
                _log.warning("relay.drain_timeout", in_flight=dispatcher.in_flight)
            tg.cancel_scope.cancel()

    async def _run_pollers(self) -> None:
        """Every account's poller, side by side (each with its own discovery and budget)."""
        async with anyio.create_task_group() as tg:
            for poller in self.pollers:
                tg.start_soon(poller.run)

    async def _side_task(
        self,
        name: str,
        body: Callable[[], Awaitable[None]],
        scope: anyio.CancelScope | None,
    ) -> None:
        if scope is None:
            await body()
        else:
            with scope:
                await body()
        if not self._stop.is_set():
            raise RuntimeError(f"the {name} task ended on its own")

    async def _lifecycle(self) -> None:
        """READY=1 after the first poll, then WATCHDOG=1 while both loops make progress."""
        pollers, dispatcher = self.pollers, self.dispatcher
        assert pollers and dispatcher is not None
        for poller in pollers:
            await poller.first_pass_done.wait()
        self.ready.set()
        sdnotify.ready("polling and delivering")
        _log.info("relay.ready")
        interval = sdnotify.watchdog_interval()
        if interval is None:
            await self._stop.wait()
            return
        while not self._stopping:
            now = time.monotonic()
            beats = {f"poller:{p.account}": p.heartbeat for p in pollers}
            beats["dispatcher"] = dispatcher.heartbeat
            stale = [name for name, beat in beats.items() if now - beat > 2 * interval]
            if stale:
                _log.error("relay.loop_stalled", loops=stale)  # no ping: systemd restarts us
            else:
                sdnotify.watchdog()
            await anyio.sleep(interval)

    async def _heartbeat(self) -> None:
        """Every third of ``store.lease``: tell the store this replica is alive, which
        extends every claim it holds (deliveries in flight, polls, its pollers' leases)."""
        store = self.store
        assert store is not None
        lease = self.config.store.lease
        last_ok = self._clock()
        late = False
        while not self._stop.is_set():
            with anyio.move_on_after(heartbeat_interval(lease)):
                await self._stop.wait()
            if self._stop.is_set():
                return
            now = self._clock()
            try:
                ok = await store.try_write(store.store.heartbeat_replica, now)
            except _STORE_FAILURES as exc:
                _log.warning("replica.heartbeat_failed", error=str(exc))
                ok = False
            if ok:
                if late:
                    _log.info("replica.heartbeat_resumed", replica=self.replica.id)
                last_ok, late = now, False
            elif not late and heartbeat_late(last_ok, now, lease):
                late = True
                self.metrics.replica_heartbeat_late()
                _log.error(
                    "replica.heartbeat_late",
                    replica=self.replica.id,
                    silent_s=round(now - last_ok, 1),
                    note="this replica's claims may have expired: another one may take its "
                    "work over (a delivery in flight may then be sent twice, same webhook-id)",
                )

    async def _retention(self) -> None:
        """Prune the delivery log every :data:`PRUNE_EVERY` seconds when
        ``store.delivery_log_retention`` is set (a reload may set or clear it)."""
        while not self._stop.is_set():
            keep = self.config.store.delivery_log_retention
            store = self.store
            if keep is not None and store is not None:
                attempts, deliveries = await store.prune_delivery_log(self._clock() - keep)
                if attempts or deliveries:
                    _log.info("store.pruned", attempts=attempts, deliveries=deliveries)
            with anyio.move_on_after(PRUNE_EVERY):
                await self._stop.wait()

    async def _watch_signals(
        self,
        outer: anyio.CancelScope,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGHUP:
                    await self.reload()
                elif self._stop.is_set():
                    _log.warning("relay.stop_now", signal=signal.Signals(signum).name)
                    outer.cancel()
                else:
                    _log.info("relay.signal", signal=signal.Signals(signum).name)
                    self._stop.set()

    async def reload(self) -> bool:
        """Re-read the config file (SIGHUP). Returns whether the new config was applied."""
        if self._config_path is None:
            _log.warning("config.reload_skipped", reason="no config file to re-read")
            return False
        sdnotify.reloading()
        try:
            new = load_config(self._config_path)
        except ConfigError as exc:
            _log.error("config.reload_failed", error=str(exc), kept="the running configuration")
            sdnotify.ready("reload failed; running with the previous configuration")
            return False
        old = self.config
        if _restart_only(old) != _restart_only(new):
            _log.warning(
                "config.reload_partial",
                note="api, store, server and delivery.allow_private_networks changes need a "
                "restart",
            )
            # The webhook connections were opened (and are kept alive) under the old
            # address policy: it stays until a restart rebuilds the pool.
            delivery = new.delivery.model_copy(
                update={"allow_private_networks": old.delivery.allow_private_networks}
            )
            new = new.model_copy(
                update={
                    "api": old.api,
                    "store": old.store,
                    "server": old.server,
                    "delivery": delivery,
                    "accounts": old.accounts,
                }
            )
        relay_logging.configure(new.log.level, new.log.format)
        _register_secrets(new)
        if self.store is not None:
            try:  # never wait for disk space here: a SIGTERM must still be heard
                await self.store.call(self.store.store.sync_endpoints, list(new.endpoints))
            except StoreUnwritableError as exc:
                _log.error("config.reload_failed", error=f"the store is not writable: {exc}")
                sdnotify.ready("reload failed; running with the previous configuration")
                return False
        if self.dispatcher is not None:
            self.dispatcher.update(DeliverySettings.from_config(new))
        self._poll_settings = self._poll_settings.with_config(new)
        for poller in self.pollers:
            poller.settings = replace(
                self._poll_settings, requests_per_minute=poller.settings.requests_per_minute
            )
        self.config = new
        _log.info("config.reloaded", endpoints=[e.name for e in new.endpoints])
        sdnotify.ready("configuration reloaded")
        return True

    # ------------------------------------------------------------------ wiring

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
                except _STORE_FAILURES as exc:
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

    @asynccontextmanager
    async def _wiring(self, store: AsyncStore) -> AsyncIterator[tuple[list[Poller], Dispatcher]]:
        """Build the HTTP clients, one poller per account and the dispatcher on an open
        store; close all."""
        config = self.config
        self.store = store
        _register_secrets(config)
        # SQLite: the daemon lock says this replica is alone (see Store.exclusive).
        alone = getattr(store.store, "backend", "sqlite") == "sqlite"
        await store.write(
            store.store.register_replica,
            self.replica.id,
            host=self.replica.host,
            pid=self.replica.pid,
            now=self._clock(),
            lease=config.store.lease,
            exclusive=alone,
        )
        _log.info("replica.registered", replica=self.replica.label, lease=config.store.lease)
        # A replica that is certainly dead (alone: every other one; any backend: a pid of
        # this host that is gone) gives its claims back now, not when its lease runs out:
        # a restart after kill -9 resumes at once.
        rows = await store.call(store.store.replicas)
        dead = dead_replicas(rows, self.replica, alone=alone, pid_alive=pid_alive)
        if dead:
            await store.write(store.store.reap_replicas, dead, self._clock())
            _log.info("replica.reaped", replicas=dead, reason="alone" if alone else "pid gone")
        accounts = config.upstream_accounts()
        inner = self._upstream_transport or httpx.AsyncHTTPTransport()
        # One HTTP client per account, each with its own budget (an API key's quota). 2xx
        # answers are counted once the client parsed them (settle): a malformed one is
        # counted as "malformed", not as the 200 it claimed to be.
        # The API client takes the budget's grant before each attempt (its gate, outside
        # the deadline of the exchange: waiting for budget is not a slow upstream), so the
        # transport only counts.
        limiters = [
            RateLimiter(
                account.requests_per_minute,
                shared_window=self._budget_window(store, account),
            )
            for account in accounts
        ]
        counted = [
            LimitedTransport(inner, None, record=self._record_upstream, settle_success=True)
            for _ in accounts
        ]
        upstreams = [httpx.AsyncClient(transport=transport) for transport in counted]
        # Webhooks go out through aiohttp (sender.py says why, with numbers), every
        # connection to an address vetted when it was resolved, once. A test's or the
        # demo's transport (ASGI, mock) goes through httpx instead.
        delivery: Poster = (
            HttpxPoster(
                httpx.AsyncClient(transport=self._delivery_transport, follow_redirects=False)
            )
            if self._delivery_transport is not None
            else AiohttpPoster(
                allow_private=config.delivery.allow_private_networks,
                resolve=self._resolve,
                policy=self._address_policy,
            )
        )
        try:
            self.dispatcher = Dispatcher(
                store,
                delivery,
                DeliverySettings.from_config(config),
                metrics=self.metrics,
                guard=self._guard,
                clock=self._clock,
            )
            self.pollers = [
                Poller(
                    SessionsClient(
                        upstream,
                        base_url=account.base_url,
                        api_key=account.api_key.get_secret_value(),
                        api_key_header=account.api_key_header,
                        timeout=config.api.timeout,
                        max_response_bytes=config.api.max_response_bytes,
                        gate=limiter.acquire,
                        retry=RetryPolicy(max_attempts=1),
                        on_answer=transport.settle,
                    ),
                    store,
                    replace(self._poll_settings, requests_per_minute=account.requests_per_minute),
                    on_enqueued=self.dispatcher.wake,
                    on_ingested=self.bell.ring,
                    metrics=self.metrics,
                    clock=self._clock,
                    account=account.name,
                )
                for account, upstream, transport, limiter in zip(
                    accounts, upstreams, counted, limiters, strict=True
                )
            ]
            self.poller = self.pollers[0]
            yield self.pollers, self.dispatcher
        finally:
            with anyio.CancelScope(shield=True):
                # A clean stop frees every claim at once: nobody waits for a lease.
                try:
                    await store.call(store.store.retire_replica, self._clock())
                except _STORE_FAILURES as exc:
                    _log.warning("replica.retire_failed", error=str(exc))
                for upstream in upstreams:
                    await upstream.aclose()
                await delivery.aclose()
                if isinstance(delivery, HttpxPoster):
                    await delivery.http.aclose()
                await store.close()
            self.store = None

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
            except _STORE_FAILURES as exc:
                _log.warning("upstream.budget_not_stored", error=str(exc))
                return 0.0
            if granted:
                leased = granted - 1
            return wait

        return take_budget

    async def _record_upstream(self, label: str, status: int | str | None) -> None:
        self.metrics.upstream_request(label, status)
        if self.store is not None:
            await self.store.record_upstream(label, status, self._clock())

    async def _store_problem(self) -> str | None:
        """Commit a tiny write: a full disk, a read-only mount or a lost file show here."""
        store = self.store
        if store is None:
            return self._open_problem or "store is not open yet"
        try:
            probe = store.store.set_meta
            if not await store.try_write(probe, "readyz_probe_at", repr(self._clock())):
                error = store.unwritable
                what = "full" if isinstance(error, StoreFullError) else "not writable"
                return f"store is {what}, polling and deliveries paused: {error}"
        except _STORE_FAILURES as exc:
            _log.warning("health.store_not_writable", error=str(exc))
            return f"store is not writable: {exc}"
        return None

    async def _readiness(self) -> tuple[bool, list[str]]:
        # Ready when every account's discovery succeeded lately (the oldest counts).
        successes = [p.last_success for p in self.pollers]
        last = None if not successes or None in successes else min(s for s in successes if s)
        bound = max(120.0, 3 * self.config.poll.discovery_interval)
        problem = await self._store_problem()
        return health.check_ready(
            store_writable=problem is None,
            store_problem=problem,
            last_successful_poll=last,
            now=self._clock(),
            max_poll_age=bound,
            started_at=self._started_at,
        )

    # ------------------------------------------------------------------ full disk

    def store_unwritable(
        self, error: StoreUnwritableError, *, first: bool, retry_in: float
    ) -> None:
        """A write failed (the store's observer): log, count, tell systemd."""
        full = isinstance(error, StoreFullError)
        self.metrics.store_write_failed("full" if full else "unwritable")
        self.metrics.store_unwritable.set(1)
        what = "full" if full else "not_writable"
        fields = {"store": self.config.store.location, "error": str(error)}
        if first:
            _log.error(
                f"store.{what}",
                retry_in=round(retry_in, 1),
                hint=("free disk space" if full else "make the store writable")
                + ": polling and deliveries resume by themselves, nothing committed is lost",
                **fields,
            )
            sdnotify.status(f"store is {what.replace('_', ' ')}: polling and deliveries paused")
        else:
            _log.warning(f"store.still_{what}", retry_in=round(retry_in, 1), **fields)

    def store_writable_again(self, *, after: float) -> None:
        """Writes succeed again (the store's observer)."""
        self.metrics.store_unwritable.set(0)
        _log.info("store.recovered", store=self.config.store.location, after_s=round(after, 1))
        sdnotify.status("polling and delivering")
        if self.dispatcher is not None:
            self.dispatcher.wake()

    async def _refresh_gauges(self) -> None:
        if self.store is None:
            return
        stats = await self.store.outbox_stats()
        self.metrics.refresh_outbox(stats, self._clock(), [e.name for e in self.config.endpoints])
        states = await self.store.endpoint_states()
        self.metrics.refresh_endpoints({s.name: s.enabled for s in states})
        replicas = await self.store.call(self.store.store.replicas)
        self.metrics.refresh_replicas(replicas, self._clock())


def _daemon_error(exc: BaseException) -> DaemonError | None:
    """The :class:`DaemonError` that ``exc`` is, or that a group holds alone."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, DaemonError) else None


def _find(exc: BaseException, kind: type[_E]) -> _E | None:
    """The first ``kind`` in ``exc`` or in the groups it is wrapped in."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


def _restart_only(config: Config) -> tuple[Any, ...]:
    return (
        config.api.model_dump(),
        [
            (a.name, a.base_url, a.api_key.get_secret_value(), a.requests_per_minute)
            for a in config.upstream_accounts()
        ],
        str(config.store.path),
        config.store.database_url(),
        config.store.pool_size,
        config.delivery.allow_private_networks,
        # The listener and its token are taken when the web app is built, at start.
        None if config.server is None else config.server.model_dump(),
        None
        if config.server is None or config.server.token is None
        else config.server.token.get_secret_value(),
    )


def _register_secrets(config: Config) -> None:
    for account in config.upstream_accounts():
        relay_logging.register_secret(account.api_key)
    for endpoint in config.endpoints:
        for secret in endpoint.secrets:
            relay_logging.register_secret(secret)
    token = None if config.server is None else config.server.token
    if token is not None:
        relay_logging.register_secret(token)
