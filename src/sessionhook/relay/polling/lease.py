"""The poller's lease: one replica polls an account, the others stand by.

A replica registered in a shared store polls an account only while it holds the
account's poller lease (``poller:<account>``, see ``store/leases.py``): it renews it every
third of its length; a standby tries to take it every :data:`STANDBY_TRY` seconds, and as
its holder's runs out. Meanwhile a standby is ready and reports the holder's discovery.
"""

from __future__ import annotations

import anyio

from ..domain.replica import heartbeat_interval, poller_lease
from ..store import Economy, Leases, StoreUnwritableError
from ..telemetry.logs import get_logger
from .state import PollState

_log = get_logger()

#: Seconds between a standby replica's tries of the poller lease (at most a third of it).
STANDBY_TRY = 1.0
#: Seconds after the holder's expiry at which a standby tries (its clock may be a little
#: ahead of the store's comparison).
TAKEOVER_MARGIN = 0.05


class PollerLease:
    """One account's poller lease, held, kept or waited for (see the module docstring)."""

    def __init__(self, state: PollState) -> None:
        self._state, self._store, self._account = state, state.store, state.account
        self._clock, self._mono = state.clock, state.monotonic
        #: The lease's name in the store.
        self.name = poller_lease(state.account)

    async def hold(self) -> bool:
        """Take or renew the lease: whether this replica holds it now."""
        try:
            return await self._store.run(Leases.acquire_lease, self.name, self._clock())
        except StoreUnwritableError:
            return False

    async def keep(self, scope: anyio.CancelScope) -> None:
        """Renew the lease every third of it; when another replica holds it (this one was
        silent past its expiry), stop polling: the holder polls now."""
        while True:
            await anyio.sleep(heartbeat_interval(self._store.replica.lease_seconds))
            if not await self.hold():
                _log.warning("poller.lease_lost", account=self._account, lease=self.name)
                scope.cancel()
                return

    async def standby(self) -> None:
        """Wait until this replica can take the lease (its holder stopped or died); meanwhile
        it delivers and its readiness follows the holder's discovery. Tried every
        :data:`STANDBY_TRY` seconds, and when the holder's lease runs out if sooner."""
        _log.info("poller.standby", account=self._account, lease=self.name)
        self._state.first_pass_done.set()
        while True:
            self._state.heartbeat = self._mono()
            last_ok = await self._store.run(Economy.last_ok_poll_at, self._account)
            if last_ok is not None:
                self._state.last_success = last_ok
            expires = await self._store.run(Leases.lease_expires_at, self.name)
            # Tried every second (at most a third of the lease), one small write per standby
            # replica; a holder that went silent is replaced as its lease runs out.
            wait = min(STANDBY_TRY, heartbeat_interval(self._store.replica.lease_seconds))
            if expires is not None:
                wait = min(wait, max(0.0, expires - self._clock()) + TAKEOVER_MARGIN)
            await anyio.sleep(wait)
            self._state.heartbeat = self._mono()
            if await self.hold():
                _log.info("poller.lease_taken", account=self._account, lease=self.name)
                return
