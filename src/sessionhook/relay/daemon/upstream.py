"""The upstream budget kept in the store, and every upstream request counted.

Each account's rate limiter keeps its 60 s window in the store
(:meth:`UpstreamCounter.budget_window`), so a restart stays within ``requests_per_minute``;
every request is counted per endpoint and status in the metrics and the store's per-minute
counters (:meth:`UpstreamCounter.record`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import anyio

from ..config import Account
from ..polling.budget import SharedWindow
from ..store import AsyncStore, Economy, store_failures
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics

#: Request grants taken from the store's budget window at once (see ``Economy.take_budget``).
BUDGET_LEASE = 5

_log = get_logger()


class UpstreamCounter:
    """The daemon's upstream requests: their budget windows in the store, their counts
    (written at once outside the long run, ``--once``)."""

    def __init__(
        self,
        metrics: Metrics,
        clock: Callable[[], float],
        store: Callable[[], AsyncStore | None],
    ) -> None:
        self.metrics = metrics
        self._clock = clock
        self._store = store
        #: Requests counted on their way to the store (while :meth:`write_counts` runs).
        self.tally: UpstreamTally | None = None

    def budget_window(self, store: AsyncStore, account: Account) -> SharedWindow:
        """The account's ``requests_per_minute`` window kept in the store."""
        rpm = account.requests_per_minute
        leased = 0  # grants taken from the store and not used yet

        async def take_budget() -> float:
            # Grants are leased from the store a few at a time (one write per
            # BUDGET_LEASE requests); an unwritable store leaves the in-process window.
            nonlocal leased
            if leased:
                leased -= 1
                return 0.0
            try:
                granted, wait = await store.run(
                    Economy.take_budget, account.name, self._clock(), rpm, count=BUDGET_LEASE
                )
            except store_failures() as exc:
                _log.warning("upstream.budget_not_stored", error=str(exc))
                return 0.0
            if granted:
                leased = granted - 1
            return wait

        return take_budget

    async def record(self, label: str, status: int | str | None) -> None:
        """Count one upstream request answered with ``status``."""
        self.metrics.upstream_request(label, status)
        tally = self.tally
        if tally is not None:
            tally.add(label, status, self._clock())  # written by its flusher, see there
        else:
            store = self._store()
            if store is not None:
                await store.run(Economy.record_upstream, label, status, self._clock())

    async def write_counts(self, store: AsyncStore) -> None:
        """The long run's writer of the upstream counters (a side task), a batch per store call
        until cancelled; then what is left is written (shielded)."""
        tally = self.tally = UpstreamTally()
        try:
            await tally.run(store)
        finally:
            self.tally = None
            with anyio.CancelScope(shield=True):
                await tally.flush(store)


class UpstreamTally:
    """Upstream requests counted on their way to the store's per-minute counters.

    A request never awaits a store write of its own (behind a backlog of ingests that cost
    ~18 ms a request): :meth:`add` is instant, :meth:`run` writes what was added, one
    transaction per store call, skipped while the store is full. A ``kill -9`` loses the
    counts not written yet."""

    def __init__(self) -> None:
        self._pending: Counter[tuple[str, int | str | None, int]] = Counter()
        self._added = anyio.Event()

    def add(self, label: str, status: int | str | None, at: float) -> None:
        """Count one request (answered at Unix time ``at``)."""
        self._pending[(label, status, int(at // 60))] += 1
        self._added.set()

    async def run(self, store: AsyncStore) -> None:
        """Write what is added, batch after batch, forever (until cancelled)."""
        while True:
            await self._added.wait()
            self._added = anyio.Event()
            await self.flush(store)

    async def flush(self, store: AsyncStore) -> None:
        """Write what was added and not written yet (one transaction)."""
        batch, self._pending = self._pending, Counter()
        if batch:
            await store.run(Economy.record_upstream_counts, dict(batch))
