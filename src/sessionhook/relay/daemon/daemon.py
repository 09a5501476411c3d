"""The relay daemon: one task group, one stop signal.

:class:`Daemon` wires the pieces together and owns their lifetime:

* the store (opened first, under the daemon lock; a store that cannot be opened is a
  :class:`DaemonError`): :mod:`.daemon_store`;
* the upstream HTTP client of each account, rate limited by one :class:`RateLimiter` (whose
  60 s window is kept in the store: :mod:`.daemon_store`) and counted per endpoint and status;
* the :class:`~sessionhook.relay.polling.Poller` and the
  :class:`~sessionhook.relay.delivery.dispatcher.Dispatcher`, which the poller wakes on enqueue;
* the open-files limit, lifted to the hard one at start (deliveries, polls, the store and
  the listener share it; ``server.max_connections`` may use half: :mod:`.listener`);
* the health server when ``[server]`` is configured (started before the store is opened,
  so /readyz can say why it is not: :mod:`.daemon_health`, which also makes the daemon the
  store's observer on a full disk), ``READY=1`` once the store is open and the first
  discovery pass was tried, ``WATCHDOG=1`` while both loops make progress (the side tasks,
  signals and reload: :mod:`.daemon_tasks`).

SIGTERM and SIGINT set the stop signal: polling stops at once, deliveries in flight get
:data:`DRAIN_SECONDS` to finish, then everything is cancelled (an interrupted attempt is
not lost: its outbox row is retried at the next start) and :meth:`Daemon.run` returns.

A side task that dies takes the daemon down with it, loudly: a broken store or a bug must
not leave a process that looks alive and delivers nothing.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import anyio
import httpx

from sessionhook.api import RetryPolicy
from sessionhook.api.client import SessionsClient

from .. import web
from ..config import Config
from ..delivery.dispatcher import DeliverySettings, Dispatcher
from ..delivery.post import UrlGuard
from ..delivery.render_process import RenderProcess
from ..delivery.resolve import Resolver
from ..delivery.sender import AiohttpPoster, HttpxPoster, Poster
from ..domain.addresses import AddressPolicy
from ..domain.replica import Replica, dead_replicas, pid_alive
from ..polling import OnceReport, Poller, PollSettings
from ..polling.budget import LimitedTransport, RateLimiter
from ..store import AsyncStore, StoreUnwritableError, notify
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics
from ..web import listener
from ..web import server as health
from . import sdnotify
from .errors import DaemonError, store_failures
from .readiness import HealthMixin
from .store_access import StoreMixin, UpstreamTally
from .tasks import TasksMixin, register_secrets

__all__ = ["DRAIN_SECONDS", "Daemon", "DaemonError"]

#: How long deliveries in flight may take to finish after SIGTERM/SIGINT.
DRAIN_SECONDS = 10.0

_log = get_logger()
_E = TypeVar("_E", bound=BaseException)


class Daemon(HealthMixin, StoreMixin, TasksMixin):
    """The relay process; see the module docstring.

    The keyword arguments are seams for tests, the demo and the bench: ``upstream_transport``
    and ``delivery_transport`` replace the network (``httpx.ASGITransport`` of the emulator
    or of a receiver), ``poll_settings`` the poll knobs that the config does not expose,
    ``guard`` the DNS-free pre-check of endpoint URLs, ``resolve`` and ``address_policy``
    the name resolution and the public/private judgement of the webhook connections
    (:class:`~sessionhook.relay.delivery.sender.AiohttpPoster`, used unless
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
        #: Upstream requests counted on their way to the store (while the long run runs).
        self._upstream_tally: UpstreamTally | None = None
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
                # Deliveries, polls and the listener share one open-files limit: take
                # all the kernel allows (the default soft limit is 1,024).
                files = listener.raise_files_limit()
                server = self.config.server
                if server is not None:
                    problem = listener.check_files_limit(server.max_connections, files)
                    if problem is not None:
                        raise DaemonError(problem, exit_code=2)
                    app = web.create_app(
                        self._web_context(server),
                        readiness=self._readiness,
                        before_scrape=self._refresh_gauges,
                        store={
                            "backend": "sqlite"
                            if self.config.store.database_url() is None
                            else "postgresql",
                            "database": self.config.store.location,
                        },
                    )
                    serve = functools.partial(
                        health.serve,
                        limits=listener.ConnectionLimits.of(server),
                        metrics=self.metrics,
                    )
                    try:
                        await outer.start(serve, server.listen, app)
                    except health.HealthServerError as exc:
                        raise DaemonError(str(exc)) from None
                store = await self._open_store(wait=True)
                if store is not None:  # None: stopped while waiting for disk space
                    async with self._wiring(store) as (_pollers, dispatcher):
                        await self._run_loops(store, dispatcher)
                outer.cancel_scope.cancel()
        _log.info("relay.stopped")

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
            # First: it counts the pollers' requests from their first one on.
            tg.start_soon(
                self._side_task, "upstream counts", lambda: self._flush_upstream_counts(store), None
            )
            tg.start_soon(self._side_task, "poller", self._run_pollers, poll_scope)
            tg.start_soon(self._side_task, "dispatcher", dispatcher.run, None)
            tg.start_soon(self._side_task, "lifecycle", self._lifecycle, None)
            tg.start_soon(self._side_task, "retention", self._retention, None)
            tg.start_soon(self._side_task, "heartbeat", self._heartbeat, None)
            url = getattr(store.store, "url", None)
            if getattr(store.store, "backend", "") == "postgresql" and url:
                # Other replicas' enqueues wake this dispatcher (LISTEN/NOTIFY); the
                # dispatcher's one-second timer backs it up. They also ring the bell: the
                # deliveries usually come with events another replica archived, which this
                # replica's event streams and live console then read at once (their store
                # poll, once a second, backs that up and covers events without deliveries).
                def wake() -> None:
                    dispatcher.wake()
                    self.bell.ring()

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

    # ------------------------------------------------------------------ wiring

    @asynccontextmanager
    async def _wiring(self, store: AsyncStore) -> AsyncIterator[tuple[list[Poller], Dispatcher]]:
        """Build the HTTP clients, one poller per account and the dispatcher on an open
        store; close all."""
        config = self.config
        self.store = store
        register_secrets(config)
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
        # Templates render in a child process, killed at delivery.render_timeout.
        renderer = RenderProcess()
        try:
            self.dispatcher = Dispatcher(
                store,
                delivery,
                DeliverySettings.from_config(config),
                metrics=self.metrics,
                guard=self._guard,
                clock=self._clock,
                renderer=renderer,
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
                except store_failures() as exc:
                    _log.warning("replica.retire_failed", error=str(exc))
                for upstream in upstreams:
                    await upstream.aclose()
                await delivery.aclose()
                await renderer.aclose()
                if isinstance(delivery, HttpxPoster):
                    await delivery.http.aclose()
                await store.close()
            self.store = None


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
