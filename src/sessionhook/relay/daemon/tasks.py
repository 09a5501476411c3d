"""The daemon's side tasks (:class:`SideTasks`), beside the poller and the dispatcher.

The lifecycle (``READY=1`` once the first discovery pass was tried, ``WATCHDOG=1`` while
both loops make progress), the replica's heartbeat and the delivery log's retention. Each
runs under :meth:`SideTasks.guarded`: a side task that ends takes the daemon down with it,
loudly: a broken store or a bug must not leave a process that looks alive and delivers
nothing.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio

from ..domain.replica import Replica, heartbeat_interval, heartbeat_late
from ..store import PRUNE_BATCH, Leases, Outbox, store_failures
from ..telemetry.logs import get_logger
from . import sdnotify
from .state import DaemonState

#: How often the delivery log is pruned when ``store.delivery_log_retention`` is set.
PRUNE_EVERY = 600.0

_log = get_logger()


class SideTasks:
    """The side tasks of :class:`~.daemon.Daemon` (see the module docstring)."""

    def __init__(self, state: DaemonState, replica: Replica) -> None:
        self._state = state
        self._replica = replica

    async def guarded(
        self,
        name: str,
        body: Callable[[], Awaitable[None]],
        scope: anyio.CancelScope | None = None,
    ) -> None:
        """Run ``body`` (in ``scope``, if given); its ending on its own before the stop
        signal is an error (the daemon's task group then stops, loudly)."""
        if scope is None:
            await body()
        else:
            with scope:
                await body()
        if not self._state.stop.is_set():
            raise RuntimeError(f"the {name} task ended on its own")

    async def lifecycle(self) -> None:
        """READY=1 after the first poll, then WATCHDOG=1 while both loops make progress."""
        state = self._state
        pollers, dispatcher = state.pollers, state.dispatcher
        assert pollers and dispatcher is not None
        for poller in pollers:
            await poller.first_pass_done.wait()
        state.ready.set()
        sdnotify.ready("polling and delivering")
        _log.info("relay.ready")
        interval = sdnotify.watchdog_interval()
        if interval is None:
            await state.stop.wait()
            return
        while not state.stopping:
            now = time.monotonic()
            beats = {f"poller:{p.account}": p.state.heartbeat for p in pollers}
            beats["dispatcher"] = dispatcher.heartbeat
            stale = [name for name, beat in beats.items() if now - beat > 2 * interval]
            if stale:
                _log.error("relay.loop_stalled", loops=stale)  # no ping: systemd restarts us
            else:
                sdnotify.watchdog()
            await anyio.sleep(interval)

    async def heartbeat(self) -> None:
        """Every third of ``store.lease``: tell the store this replica is alive, which
        extends every claim it holds (deliveries in flight, polls, its pollers' leases),
        and moves the dispatcher's send fence on (``delivery/fence.py``)."""
        state = self._state
        store = state.store
        assert store is not None
        lease = state.config.store.lease
        last_ok = state.clock()
        late = False
        # The first at once: the start since registering (building the clients, pollers
        # and dispatcher) can take a good part of a short lease on a loaded machine.
        wait = 0.0
        while not state.stop.is_set():
            with anyio.move_on_after(wait):
                await state.stop.wait()
            if state.stop.is_set():
                return
            wait = heartbeat_interval(lease)
            now = state.clock()
            try:
                ok = await store.run(Leases.heartbeat_replica, now)
            except store_failures() as exc:
                _log.warning("replica.heartbeat_failed", error=str(exc))
                ok = False
            if ok:
                # Its POSTs in flight may run on; if it had stopped sending, it goes on.
                if state.dispatcher is not None and state.dispatcher.fence.renewed():
                    state.dispatcher.wake()
                if late:
                    _log.info("replica.heartbeat_resumed", replica=self._replica.id)
                last_ok, late = now, False
            elif not late and heartbeat_late(last_ok, now, lease):
                late = True
                state.metrics.replica_heartbeat_late_total.inc()
                _log.error(
                    "replica.heartbeat_late",
                    replica=self._replica.id,
                    silent_s=round(now - last_ok, 1),
                    note="this replica's claims may have expired: another one may take its "
                    "work over (a delivery in flight may then be sent twice, same webhook-id)",
                )

    async def retention(self) -> None:
        """Prune the delivery log every :data:`PRUNE_EVERY` seconds while a retention is set."""
        state = self._state
        while not state.stop.is_set():
            keep = state.config.store.delivery_log_retention
            store = state.store
            if keep is not None and store is not None:
                before, attempts, deliveries = state.clock() - keep, 0, 0
                while True:  # a batch per call: the dispatcher's and poller's writes go between
                    a, d = await store.run(Outbox.prune_delivery_log, before, rounds=1)
                    attempts, deliveries = attempts + a, deliveries + d
                    if a < PRUNE_BATCH and d < PRUNE_BATCH:
                        break
                if attempts or deliveries:
                    _log.info("store.pruned", attempts=attempts, deliveries=deliveries)
            with anyio.move_on_after(PRUNE_EVERY):
                await state.stop.wait()
