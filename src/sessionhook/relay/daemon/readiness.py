"""The daemon's health: the web app's context, /readyz, /metrics gauges, the test ping,
and the daemon as the store's observer (a full or read-only store).

A full disk (or a read-only store) does not stop the relay: the daemon is the store's
observer (:class:`~sessionhook.relay.store.FullObserver`). Writes wait for space, no poll or
delivery starts meanwhile, ``store.full`` is logged, ``store_unwritable`` is 1 and /readyz
answers 503 with the reason; everything resumes by itself (opening a store on a full disk:
:mod:`.daemon_store`).

:class:`HealthMixin` is mixed into :class:`~sessionhook.relay.daemon.daemon.Daemon`, which provides
what is declared under ``TYPE_CHECKING``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx

from .. import ops as operator
from .. import web
from ..config import Config, ServerConfig
from ..delivery.pinning import PinnedTransport
from ..delivery.resolve import Resolver
from ..domain.addresses import AddressPolicy
from ..domain.retry import AttemptResult
from ..polling import Poller
from ..store import AsyncStore, StoreFullError, StoreUnwritableError
from ..telemetry import logs as relay_logging
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics
from ..web import server as health
from . import sdnotify
from .errors import store_failures

if TYPE_CHECKING:
    from ..delivery.dispatcher import Dispatcher

__all__ = ["HealthMixin"]

_log = get_logger()


class HealthMixin:
    """Health, readiness and the store observer of :class:`~.daemon.Daemon`."""

    if TYPE_CHECKING:
        config: Config
        metrics: Metrics
        store: AsyncStore | None
        dispatcher: Dispatcher | None
        pollers: list[Poller]
        bell: web.Bell
        _clock: Callable[[], float]
        _started_at: float
        _open_problem: str | None
        _delivery_transport: httpx.AsyncBaseTransport | None
        _resolve: Resolver | None
        _address_policy: AddressPolicy | None

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

    async def _store_problem(self) -> str | None:
        """Commit a tiny write: a full disk, a read-only mount or a lost file show here."""
        store = self.store
        if store is None:
            return self._open_problem or "store is not open yet"
        if store.unwritable is not None:
            # Known already (a write failed and waits for its retry): answer at once rather
            # than probe again, which against a database that just went away waits for a
            # connection as long as the pool's timeout.
            return _unwritable_reason(store.unwritable)
        try:
            probe = store.store.set_meta
            if not await store.try_write(probe, "readyz_probe_at", repr(self._clock())):
                return _unwritable_reason(store.unwritable)
        except store_failures() as exc:
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


def _unwritable_reason(error: StoreUnwritableError | None) -> str:
    what = "full" if isinstance(error, StoreFullError) else "not writable"
    return f"store is {what}, polling and deliveries paused: {error}"
