"""The poller: discovery and the per-session scheduler, as loops and as one pass."""

from __future__ import annotations

import math

import anyio
import anyio.abc

from sessionhook.api.errors import ApiError, UnauthenticatedError

from ..domain.replica import heartbeat_interval, poller_lease
from ..store import StoreUnwritableError
from ..telemetry.logs import get_logger
from .discovery import Discovery
from .history import HistoryWalk
from .settings import OnceReport, _Tracked

_log = get_logger()

#: Seconds between a standby replica's tries of the poller lease (at most a third of it).
STANDBY_TRY = 1.0
#: Seconds after the holder's expiry at which a standby tries (its clock may be a little
#: ahead of the store's comparison).
TAKEOVER_MARGIN = 0.05


class Poller(Discovery, HistoryWalk):
    """Discovery plus the per-session scheduler; see the package docstring."""

    async def run(self) -> None:
        """Discovery and the scheduler, forever (until cancelled), while this replica holds
        the account's poller lease (``poller:<account>``); on standby otherwise, taking it
        over once its holder's lease expires. A store that is not a registered replica's
        (tests, tools) polls without a lease."""
        lease = poller_lease(self.account)
        registered = self._store.store.replica_id is not None
        while True:
            if registered and not await self._hold(lease):
                await self._standby(lease)
            async with anyio.create_task_group() as tg:
                if registered:
                    tg.start_soon(self._keep, lease, tg.cancel_scope)
                tg.start_soon(self._discovery_loop)
                tg.start_soon(self._head_loop)
                tg.start_soon(self._history_loop)
                await self._schedule_loop(tg)

    async def _hold(self, lease: str) -> bool:
        """Take or renew ``lease``: whether this replica holds it now."""
        try:
            return await self._store.write(self._store.store.acquire_lease, lease, self._clock())
        except StoreUnwritableError:
            return False

    async def _keep(self, lease: str, scope: anyio.CancelScope) -> None:
        """Renew the lease every third of it; when another replica holds it (this one was
        silent past its expiry), stop polling: the holder polls now."""
        while True:
            await anyio.sleep(heartbeat_interval(self._store.store.lease_seconds))
            if not await self._hold(lease):
                _log.warning("poller.lease_lost", account=self.account, lease=lease)
                scope.cancel()
                return

    async def _standby(self, lease: str) -> None:
        """Wait until this replica can take ``lease`` (its holder stopped or died).

        Meanwhile the replica is ready (its dispatcher delivers) and its readiness follows
        the holder's discovery (the store's ``last_ok_poll_at``). The lease is tried
        every :data:`STANDBY_TRY` seconds (a third of it when shorter), and right when
        its holder's lease runs out if that comes sooner."""
        _log.info("poller.standby", account=self.account, lease=lease)
        self.first_pass_done.set()
        store = self._store.store
        while True:
            self.heartbeat = self._mono()
            raw = await self._store.call(store.get_meta, "last_ok_poll_at")
            if raw is not None:
                self.last_success = float(raw)
            expires = await self._store.call(store.lease_expires_at, lease)
            # Tried every second (at most a third of the lease), one small write per standby
            # replica; a holder that went silent is replaced as its lease runs out.
            wait = min(STANDBY_TRY, heartbeat_interval(store.lease_seconds))
            if expires is not None:
                wait = min(wait, max(0.0, expires - self._clock()) + TAKEOVER_MARGIN)
            await anyio.sleep(wait)
            self.heartbeat = self._mono()
            if await self._hold(lease):
                _log.info("poller.lease_taken", account=self.account, lease=lease)
                return

    async def run_once(self, *, max_attempts: int = 4) -> OnceReport:
        """One full pass: discovery, then every new, changed or working session polled.

        Transient failures are retried up to ``max_attempts`` times each (honouring
        backoff). A rejected API key ends the pass (``report.unauthenticated``).
        """
        report = OnceReport()
        for attempt in range(1, max_attempts + 1):
            try:
                await self.discover()
            except UnauthenticatedError as exc:
                self._discovery_failed(exc)
                report.unauthenticated = exc
                return report
            except ApiError as exc:
                delay = self._discovery_failed(exc)
                if attempt == max_attempts:
                    report.failed.append("discovery")
                    return report
                await anyio.sleep(delay)
            else:
                break
        # New sessions whose GET failed: give the service a moment, then ask again.
        for _ in range(max_attempts):
            if not self._pending:
                break
            due = min(p.retry_at for p in self._pending.values())
            await anyio.sleep(max(0.0, due - self._mono()))
            try:
                await self._retry_pending()
            except UnauthenticatedError as exc:
                report.unauthenticated = exc
                return report
        report.failed.extend(sorted(self._pending))
        # One pass archives everything, the history of the first start included.
        now = self._mono()
        for tracked in self._tracked.values():
            if tracked.history:
                self._schedule(tracked, now, refresh=True)
        self._history_queue.clear()
        todo = [self._tracked[name] for name in self.due(math.inf)]
        limiter = anyio.CapacityLimiter(self.settings.concurrency)

        async def poll_until_done(tracked: _Tracked) -> None:
            for attempt in range(1, max_attempts + 1):
                if report.unauthenticated is not None:
                    return
                async with limiter:
                    outcome = await self._poll_guarded(tracked)
                if outcome == "auth" and isinstance(tracked.last_error, UnauthenticatedError):
                    report.unauthenticated = tracked.last_error
                    return
                if outcome in ("ok", "gone"):
                    report.sessions_polled += 1
                    return
                if attempt < max_attempts:
                    await anyio.sleep(max(0.0, tracked.backoff_until - self._mono()))
            report.failed.append(tracked.name)

        async with anyio.create_task_group() as tg:
            for tracked in todo:
                tg.start_soon(poll_until_done, tracked)
        return report

    async def poll_due(self) -> dict[str, str]:
        """Poll every session due now, once, ``concurrency`` at a time (tests, tools).

        Returns each polled session's outcome: ``ok``, ``retry``, ``gone`` or ``auth``.
        """
        outcomes: dict[str, str] = {}
        limiter = anyio.CapacityLimiter(self.settings.concurrency)

        async def poll(tracked: _Tracked) -> None:
            async with limiter:
                outcomes[tracked.name] = await self._poll_guarded(tracked)

        async with anyio.create_task_group() as tg:
            for name in self.due(self._mono()):
                tg.start_soon(poll, self._tracked[name])
        return outcomes

    async def _schedule_loop(self, tg: anyio.abc.TaskGroup) -> None:
        running = 0

        async def poll(tracked: _Tracked) -> None:
            nonlocal running
            try:
                await self._poll_guarded(tracked)
            finally:
                tracked.running = False
                running -= 1
                self._changed.set()

        while True:
            self._changed = anyio.Event()
            now = self._mono()
            self.heartbeat = now
            # While the store is full no new poll starts (see _discovery_loop); the loop
            # keeps going round for the watchdog.
            due = [] if self._store.unwritable is not None else self.due(now)
            for name in due[: max(0, self.settings.concurrency - running)]:
                tracked = self._tracked[name]
                tracked.running = True
                running += 1
                tg.start_soon(poll, tracked)
            upcoming = [
                t.due_at for t in self._tracked.values() if t.due_at is not None and not t.running
            ]
            # Wake at the next due time, on a change, and at least every second (watchdog).
            wait = min([1.0, *(max(0.0, due - now) for due in upcoming)])
            if running >= self.settings.concurrency:
                wait = 1.0  # a finishing poll sets _changed
            with anyio.move_on_after(wait):
                await self._changed.wait()
