"""The daemon's health: the web app it hands the web layer (:class:`Readiness`: the
context, /readyz, /metrics gauges), and the store's observer on a full or read-only disk
(:class:`DiskObserver`): writes wait for space, nothing new starts, ``store.full`` is
logged and /readyz says why, until everything resumes by itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .. import web
from ..config import ServerConfig
from ..config.action_keys import LinkKeys
from ..domain.actions import UpstreamAct, UpstreamCreate
from ..domain.retry import AttemptResult
from ..store import (
    EndpointQueries,
    Leases,
    MetaQueries,
    Outbox,
    StoreFullError,
    StoreUnwritableError,
    configured_errors,
    describe_store,
    store_failures,
)
from ..telemetry import logs as relay_logging
from ..telemetry.logs import get_logger
from ..web import server as health
from . import sdnotify
from .state import DaemonState

_log = get_logger()


class Readiness:
    """What the daemon hands the web layer: the
    :class:`~sessionhook.relay.web.WebContext` of the app on ``[server] listen``, its
    readiness check and scrape hook."""

    def __init__(
        self,
        state: DaemonState,
        bell: web.Bell,
        send_test: Callable[[str], Awaitable[AttemptResult]],
        *,
        started_at: float,
        act: UpstreamAct | None = None,
        create: UpstreamCreate | None = None,
        link_keys: LinkKeys | None = None,
        send_sample: web.SendSample | None = None,
    ) -> None:
        self._state = state
        self._send_sample = send_sample
        self._bell = bell
        self._send_test = send_test
        self._act = act
        self._create = create
        self._link_keys = link_keys
        self._started_at = started_at

    def web_context(self, server: ServerConfig) -> web.WebContext:
        """What the web routes may use of the daemon."""
        state = self._state
        token = server.token
        if token is not None:
            relay_logging.register_secret(token)

        def wake() -> None:
            if state.dispatcher is not None:
                state.dispatcher.wake()

        # The app is built before the store opens (so /readyz can say why it cannot):
        # the engine and its errors are named from the config.
        return web.WebContext(
            config=lambda: state.config,
            store=lambda: state.store,
            metrics=state.metrics,
            auth=web.WebAuth(
                None if token is None else token.get_secret_value(),
                on_failure=state.metrics.web_auth_failed,
            ),
            bell=self._bell,
            clock=state.clock,
            readiness=self.check,
            before_scrape=self.refresh_gauges,
            store_facts=describe_store(state.config.store),
            store_errors=configured_errors(state.config.store),
            send_test=self._send_test,
            send_sample=self._send_sample,
            wake=wake,
            act=self._act,
            create=self._create,
            link_keys=self._link_keys,
        )

    async def _store_problem(self) -> str | None:
        """Commit a tiny write: a full disk, a read-only mount or a lost file show here."""
        store = self._state.store
        if store is None:
            return self._state.open_problem or "store is not open yet"
        if store.unwritable is not None:
            # Known already (a write failed and waits for its retry): answer at once rather
            # than probe again, which against a database that just went away waits for a
            # connection as long as the pool's timeout.
            return _unwritable_reason(store.unwritable)
        try:
            if not await store.run(MetaQueries.probe, "readyz_probe_at", repr(self._state.clock())):
                return _unwritable_reason(store.unwritable)
        except store_failures() as exc:
            _log.warning("health.store_not_writable", error=str(exc))
            return f"store is not writable: {exc}"
        return None

    async def check(self) -> tuple[bool, list[str]]:
        """/readyz: the store writable and every account's discovery recent."""
        state = self._state
        # Ready when every account's discovery succeeded lately (the oldest counts).
        successes = [p.state.last_success for p in state.pollers]
        last = None if not successes or None in successes else min(s for s in successes if s)
        bound = max(120.0, 3 * state.config.poll.discovery_interval)
        problem = await self._store_problem()
        return health.check_ready(
            store_writable=problem is None,
            store_problem=problem,
            last_successful_poll=last,
            now=state.clock(),
            max_poll_age=bound,
            started_at=self._started_at,
        )

    async def refresh_gauges(self) -> None:
        """Before a scrape of /metrics: the outbox, endpoint and replica gauges."""
        state = self._state
        store = state.store
        if store is None:
            return
        stats = await store.run(Outbox.outbox_stats)
        state.metrics.refresh_outbox(stats, state.clock(), [e.name for e in state.config.endpoints])
        states = await store.run(EndpointQueries.endpoint_states)
        state.metrics.refresh_endpoints({s.name: s.enabled for s in states})
        replicas = await store.run(Leases.replicas)
        state.metrics.refresh_replicas(replicas, state.clock())


class DiskObserver:
    """The store's observer: a full or read-only store is logged, counted and told to
    systemd; writable again wakes the dispatcher."""

    def __init__(self, state: DaemonState) -> None:
        self._state = state

    def store_unwritable(
        self, error: StoreUnwritableError, *, first: bool, retry_in: float
    ) -> None:
        """A write failed (the store's observer): log, count, tell systemd."""
        full = isinstance(error, StoreFullError)
        self._state.metrics.store_write_failures.labels(
            reason="full" if full else "unwritable"
        ).inc()
        self._state.metrics.store_unwritable.set(1)
        what = "full" if full else "not_writable"
        fields = {"store": self._state.config.store.location, "error": str(error)}
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
        self._state.metrics.store_unwritable.set(0)
        _log.info(
            "store.recovered", store=self._state.config.store.location, after_s=round(after, 1)
        )
        sdnotify.status("polling and delivering")
        dispatcher = self._state.dispatcher
        if dispatcher is not None:
            dispatcher.wake()


def _unwritable_reason(error: StoreUnwritableError | None) -> str:
    what = "full" if isinstance(error, StoreFullError) else "not writable"
    return f"store is {what}, polling and deliveries paused: {error}"
