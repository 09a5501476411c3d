"""The daemon's side tasks, its signals and the configuration reload.

Side tasks run beside the poller and the dispatcher: the lifecycle (``READY=1`` once the
first discovery pass was tried, ``WATCHDOG=1`` while both loops make progress), the
replica's heartbeat, the delivery log's retention, and the signal watcher. A side task that
dies takes the daemon down with it, loudly: a broken store or a bug must not leave a process
that looks alive and delivers nothing.

SIGTERM and SIGINT set the stop signal (the daemon then drains, see :mod:`.daemon`); a
second signal stops at once. SIGHUP reloads the configuration: a bad file is logged and the
running configuration kept; a good one updates endpoints, delivery and poll settings and
the log level (``api``, ``store``, ``server`` and ``delivery.allow_private_networks``
changes need a restart, and say so).

:class:`TasksMixin` is mixed into :class:`~sessionhook.relay.daemon.daemon.Daemon`, which provides
what is declared under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ..config import Config, ConfigError, load_config
from ..delivery.dispatcher import DeliverySettings, Dispatcher
from ..domain.replica import Replica, heartbeat_interval, heartbeat_late
from ..polling import Poller, PollSettings
from ..store import AsyncStore, StoreUnwritableError
from ..telemetry import logs as relay_logging
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics
from . import sdnotify
from .errors import store_failures

__all__ = ["PRUNE_EVERY", "TasksMixin", "register_secrets"]

#: How often the delivery log is pruned when ``store.delivery_log_retention`` is set.
PRUNE_EVERY = 600.0

_log = get_logger()


class TasksMixin:
    """The side tasks, signals and reload of :class:`~.daemon.Daemon`."""

    if TYPE_CHECKING:
        config: Config
        metrics: Metrics
        store: AsyncStore | None
        dispatcher: Dispatcher | None
        pollers: list[Poller]
        ready: anyio.Event
        replica: Replica
        _clock: Callable[[], float]
        _stop: anyio.Event
        _stopping: bool
        _config_path: Path | None
        _poll_settings: PollSettings

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
            except store_failures() as exc:
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
            # In a thread: validating renders each template against the sample events
            # (up to its step budget each), which must not hold the event loop.
            new = await anyio.to_thread.run_sync(load_config, self._config_path)
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
        register_secrets(new)
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


def register_secrets(config: Config) -> None:
    """Register every secret of ``config`` (API keys, endpoint secrets, the server token)
    with the logs' redaction."""
    for account in config.upstream_accounts():
        relay_logging.register_secret(account.api_key)
    for endpoint in config.endpoints:
        for secret in endpoint.secrets:
            relay_logging.register_secret(secret)
    token = None if config.server is None else config.server.token
    if token is not None:
        relay_logging.register_secret(token)
