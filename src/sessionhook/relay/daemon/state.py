"""What the daemon's collaborators share: :class:`DaemonState`.

The :class:`~.daemon.Daemon` builds one and hands it to the collaborators that read or
change the same things (the store opener, the wiring, readiness, the side tasks, the
reloader). Whatever one of them sets, the others see: the store once it is open, the
pollers and the dispatcher once they are built, the config after a reload, the stop
signal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from ..config import Config
from ..delivery.dispatcher import Dispatcher
from ..polling import Poller, PollSettings
from ..store import AsyncStore
from ..telemetry.metrics import Metrics


@dataclass
class DaemonState:
    """The daemon's shared state (see the module docstring)."""

    #: The running configuration; a reload replaces it.
    config: Config
    #: The poll knobs (the config's and those it does not expose); a reload updates them.
    poll_settings: PollSettings
    metrics: Metrics
    clock: Callable[[], float]
    #: The stop signal: SIGTERM, SIGINT or :meth:`~.daemon.Daemon.stop`.
    stop: anyio.Event = field(default_factory=anyio.Event)
    #: Set once the daemon is ready (store open, first poll tried).
    ready: anyio.Event = field(default_factory=anyio.Event)
    #: The loops are draining: the watchdog pings end.
    stopping: bool = False
    #: The open store (``None`` before it is open and after it is closed).
    store: AsyncStore | None = None
    #: One poller per account, once wired.
    pollers: list[Poller] = field(default_factory=list)
    dispatcher: Dispatcher | None = None
    #: Why the store is not open yet (a full disk at start-up), for /readyz.
    open_problem: str | None = None
