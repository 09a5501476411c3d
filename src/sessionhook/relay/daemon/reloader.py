"""The daemon's signals (:class:`SignalWatcher`) and the configuration reload
(:class:`Reloader`).

SIGTERM and SIGINT set the stop signal; a second one stops at once. SIGHUP reloads the
configuration: a bad file is logged and the running one kept; ``api``, ``store``,
``server`` and ``delivery.allow_private_networks`` changes need a restart, and say so.
"""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from ..config import Config, ConfigError, check_templates, load_config
from ..delivery.dispatcher import DeliverySettings
from ..delivery.template_check import check_template
from ..store import EndpointConflictError, EndpointQueries, StoreUnwritableError
from ..telemetry import logs as relay_logging
from ..telemetry.logs import get_logger
from . import sdnotify
from .state import DaemonState

_log = get_logger()


class Reloader:
    """Applies a re-read config file to the running daemon (SIGHUP, or
    :meth:`~.daemon.Daemon.reload`); ``config_path`` ``None``: nothing to re-read."""

    def __init__(self, state: DaemonState, config_path: Path | None) -> None:
        self._state = state
        self._config_path = config_path

    async def reload(self) -> bool:
        """Re-read the config file (SIGHUP). Returns whether the new config was applied."""
        if self._config_path is None:
            _log.warning("config.reload_skipped", reason="no config file to re-read")
            return False
        sdnotify.reloading()
        try:
            # In a thread: each template is rendered against the sample events in a child
            # process (never in this one), which must not hold the event loop.
            new = await anyio.to_thread.run_sync(_read_config, self._config_path)
        except ConfigError as exc:
            _log.error("config.reload_failed", error=str(exc), kept="the running configuration")
            sdnotify.ready("reload failed; running with the previous configuration")
            return False
        state = self._state
        old = state.config
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
        store = state.store
        if store is not None:
            # First: a new file the store refuses changes nothing (the log level neither).
            try:  # never wait for disk space here: a SIGTERM must still be heard
                await store.run(EndpointQueries.sync_endpoints, list(new.endpoints))
            except StoreUnwritableError as exc:
                _log.error("config.reload_failed", error=f"the store is not writable: {exc}")
                sdnotify.ready("reload failed; running with the previous configuration")
                return False
            except EndpointConflictError as exc:
                _log.error("config.reload_failed", error=str(exc), kept="the running configuration")
                sdnotify.ready("reload failed; running with the previous configuration")
                return False
        relay_logging.configure(new.log.level, new.log.format)
        register_secrets(new)
        if state.dispatcher is not None:
            state.dispatcher.update(DeliverySettings.from_config(new))
        state.poll_settings = state.poll_settings.with_config(new)
        for poller in state.pollers:
            poller.settings = replace(
                state.poll_settings, requests_per_minute=poller.settings.requests_per_minute
            )
        state.config = new
        _log.info("config.reloaded", endpoints=[e.name for e in new.endpoints])
        sdnotify.ready("configuration reloaded")
        return True


def _read_config(path: Path) -> Config:
    """The config file at ``path``, its templates checked in a child process."""
    config = load_config(path, templates_here=False)
    check_templates(config, check_template)
    return config


class SignalWatcher:
    """SIGTERM and SIGINT set the stop signal (a second one stops at once); SIGHUP reloads
    through ``reloader``."""

    def __init__(self, state: DaemonState, reloader: Reloader) -> None:
        self._state = state
        self._reloader = reloader

    async def watch(
        self,
        outer: anyio.CancelScope,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen for SIGTERM, SIGINT and SIGHUP until cancelled; a second stop signal
        cancels ``outer`` (the daemon's outermost scope) at once."""
        stop = self._state.stop
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGHUP:
                    await self._reloader.reload()
                elif stop.is_set():
                    _log.warning("relay.stop_now", signal=signal.Signals(signum).name)
                    outer.cancel()
                else:
                    _log.info("relay.signal", signal=signal.Signals(signum).name)
                    stop.set()


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
    """Register every secret of ``config`` with the logs' redaction."""
    for account in config.upstream_accounts():
        relay_logging.register_secret(account.api_key)
    for endpoint in config.endpoints:
        for secret in endpoint.secrets:
            relay_logging.register_secret(secret)
    token = None if config.server is None else config.server.token
    if token is not None:
        relay_logging.register_secret(token)
