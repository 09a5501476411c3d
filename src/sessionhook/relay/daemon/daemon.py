"""The relay daemon: one task group, one stop signal (docs/daemon.md).

:class:`Daemon` is the composition root: it checks the config's templates, opens the store
under the daemon lock (:class:`~.store_opening.StoreOpener`), builds the upstream clients,
pollers and dispatcher on it (:class:`~.wiring.Wiring`), serves health and readiness
(:class:`~.readiness.Readiness`) and runs the side tasks and signal handling
(:class:`~.tasks.SideTasks`, :class:`~.reloader.SignalWatcher`, :class:`~.reloader.Reloader`).

SIGTERM and SIGINT stop polling at once and give deliveries in flight :data:`DRAIN_SECONDS`
(an interrupted attempt is retried at the next start). A side task that dies takes the
daemon down with it, loudly.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import anyio
import httpx

from .. import web
from ..config import Config, ConfigError, check_templates
from ..config.action_keys import LinkKeys
from ..delivery.dispatcher import Dispatcher
from ..delivery.post import UrlGuard
from ..delivery.resolve import Resolver
from ..delivery.template_check import check_template
from ..domain.addresses import AddressPolicy
from ..domain.replica import Replica
from ..domain.retry import AttemptResult
from ..polling import OnceReport, PollSettings
from ..store import AsyncStore, Outbox, StoreUnwritableError
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics
from ..web import listener
from ..web import server as health
from . import sdnotify
from .acting import UpstreamActions
from .errors import DaemonError
from .readiness import DiskObserver, Readiness
from .reloader import Reloader, SignalWatcher, register_secrets
from .state import DaemonState
from .store_opening import StoreOpener
from .tasks import SideTasks
from .upstream import UpstreamCounter
from .wiring import Seams, Wiring

#: How long deliveries in flight may take to finish after SIGTERM/SIGINT.
DRAIN_SECONDS = 10.0

_log = get_logger()
_E = TypeVar("_E", bound=BaseException)


class Daemon:
    """The relay process; see the module docstring.

    The keyword arguments are seams for tests, the demo and the bench:
    ``upstream_transport`` and ``delivery_transport`` replace the network, ``poll_settings``
    the knobs the config does not expose, ``guard``, ``resolve`` and ``address_policy`` the
    judgement of the webhook URLs and connections.
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
        base = poll_settings if poll_settings is not None else PollSettings()
        self.metrics = metrics if metrics is not None else Metrics()
        #: The action-link keys of the running config: signing the links of new events
        #: (the poller), verifying the links people follow (the web pages).
        self.link_keys = LinkKeys(lambda: self._state.config)
        base = replace(base, action_links=self.link_keys.links)
        state = self._state = DaemonState(
            config=config, poll_settings=base.with_config(config), metrics=self.metrics, clock=clock
        )
        #: Set once the daemon is ready (store open, first poll tried): tests wait on it.
        self.ready = state.ready
        #: Rung whenever events are archived: wakes the event streams.
        self.bell = web.Bell()
        #: This process as a replica of the store (its claims carry this id).
        self.replica = Replica.current()
        seams = Seams(
            upstream_transport=upstream_transport,
            delivery_transport=delivery_transport,
            guard=guard,
            resolve=resolve,
            address_policy=address_policy,
        )
        self._upstream = UpstreamCounter(self.metrics, clock, lambda: state.store)
        self._wiring = Wiring(state, seams, self._upstream, replica=self.replica, bell=self.bell)
        self._opener = StoreOpener(state, DiskObserver(state))
        #: Approves a plan, answers an agent or creates a session with the session's
        #: account (what the web layer's actions call; :mod:`.acting`).
        self.act = UpstreamActions(state)
        self._readiness = Readiness(
            state,
            self.bell,
            self._wiring.send_test_event,
            started_at=clock(),
            act=self.act,
            create=self.act.create,
            link_keys=self.link_keys,
            send_sample=self._wiring.send_sample_event,
        )
        self._tasks = SideTasks(state, self.replica)
        self._reloader = Reloader(state, config_path)
        self._signals = SignalWatcher(state, self._reloader)

    # ------------------------------------------------------------------ what others read

    @property
    def config(self) -> Config:
        """The running configuration (a reload replaces it)."""
        return self._state.config

    @property
    def store(self) -> AsyncStore | None:
        """The open store; ``None`` before it is open and once it is closed."""
        return self._state.store

    @property
    def dispatcher(self) -> Dispatcher | None:
        """The dispatcher (``None`` until wired)."""
        return self._state.dispatcher

    def stop(self) -> None:
        """Ask the daemon to stop, as SIGTERM does."""
        self._state.stop.set()

    async def reload(self) -> bool:
        """Re-read the config file (SIGHUP). Returns whether the new config was applied."""
        return await self._reloader.reload()

    async def send_test_event(self, name: str) -> AttemptResult:
        """Send endpoint ``name`` a signed ``ping`` now (see
        :meth:`~.wiring.Wiring.send_test_event`): never archived, never retried."""
        return await self._wiring.send_test_event(name)

    # ------------------------------------------------------------------ entry points

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until :meth:`stop` or SIGTERM/SIGINT, then drain and return; :class:`DaemonError`
        when start-up fails, and whatever killed a side task (logged) is raised again."""
        try:
            async with anyio.create_task_group() as outer:
                if handle_signals:
                    # First of all, so that a signal during start-up is a clean stop too.
                    await outer.start(self._signals.watch, outer.cancel_scope)
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
        await self._check_templates()
        with self._opener.lock():
            self._check_link_keys()
            store = await self._opener.open(wait=False)
            assert store is not None  # only a stop while waiting for space returns None
            try:
                register_secrets(self.config)
                async with self._wiring.open(store) as (pollers, dispatcher):
                    report = OnceReport()
                    rejected: list[str] = []
                    for poller in pollers:  # one account's rejected key stops no other
                        one = await poller.run_once()
                        report.sessions_polled += one.sessions_polled
                        report.failed.extend(one.failed)
                        if one.unauthenticated is not None:
                            rejected.append(f"{poller.account}: {one.unauthenticated}")
                    attempts = await dispatcher.run_until_idle()
                    pending = await store.run(Outbox.pending_count)
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

    async def _check_templates(self) -> None:
        """The config file's templates against the sample events, each in a child process
        (never in this one): one that cannot render stops the start (exit 2)."""
        try:
            await anyio.to_thread.run_sync(check_templates, self.config, check_template)
        except ConfigError as exc:
            raise DaemonError(str(exc), exit_code=2) from None

    def _check_link_keys(self) -> None:
        """With ``[actions]`` on, the key file is made now (mode 0600) or must be readable
        and private: a problem stops the start (exit 2), not the first link."""
        if self.link_keys.enabled:
            try:
                self.link_keys.ring()
            except ConfigError as exc:
                raise DaemonError(str(exc), exit_code=2) from None

    async def _serve(self) -> None:
        await self._check_templates()
        with self._opener.lock():
            self._check_link_keys()
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
                    app = web.create_app(self._readiness.web_context(server))
                    serve = functools.partial(
                        health.serve,
                        limits=listener.ConnectionLimits.of(server),
                        metrics=self.metrics,
                        trusted_proxies=server.trusted_proxies,
                    )
                    try:
                        await outer.start(serve, server.listen, app)
                    except health.HealthServerError as exc:
                        raise DaemonError(str(exc)) from None
                store = await self._opener.open(wait=True)
                if store is not None:  # None: stopped while waiting for disk space
                    register_secrets(self.config)
                    async with self._wiring.open(store) as (_pollers, dispatcher):
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
        state, tasks = self._state, self._tasks
        if state.stop.is_set():
            return
        async with anyio.create_task_group() as tg:
            poll_scope = anyio.CancelScope()
            # First: it counts the pollers' requests from their first one on.
            tg.start_soon(
                tasks.guarded, "upstream counts", lambda: self._upstream.write_counts(store)
            )
            tg.start_soon(tasks.guarded, "poller", self._run_pollers, poll_scope)
            tg.start_soon(tasks.guarded, "dispatcher", dispatcher.run)
            tg.start_soon(tasks.guarded, "lifecycle", tasks.lifecycle)
            tg.start_soon(tasks.guarded, "retention", tasks.retention)
            tg.start_soon(tasks.guarded, "heartbeat", tasks.heartbeat)
            listen = store.wake_source()
            if listen is not None:
                # Other replicas' enqueues (LISTEN/NOTIFY) wake this dispatcher and ring
                # the bell: they usually come with events the streams should read now.
                def wake() -> None:
                    dispatcher.wake()
                    self.bell.ring()

                tg.start_soon(tasks.guarded, "wakeups", lambda: listen(wake))
            try:
                await state.stop.wait()
            finally:
                # Stopped, a side task died or cancelled from outside: writes waiting for
                # disk space give up now (those deliveries stay open and are sent again at
                # the next start, same webhook-id). A shielded one (a POST's result) would
                # otherwise hold the exit for as long as the disk stays full.
                store.stop_waiting()
            state.stopping = True
            _log.info("relay.stopping", in_flight=dispatcher.in_flight)
            sdnotify.stopping("draining deliveries in flight")
            poll_scope.cancel()
            with anyio.move_on_after(DRAIN_SECONDS) as drain:
                await dispatcher.drain()
            if drain.cancelled_caught:
                _log.warning("relay.drain_timeout", in_flight=dispatcher.in_flight)
            tg.cancel_scope.cancel()

    async def _run_pollers(self) -> None:
        """Every account's poller, side by side (each with its own discovery and budget)."""
        async with anyio.create_task_group() as tg:
            for poller in self._state.pollers:
                tg.start_soon(poller.run)


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
