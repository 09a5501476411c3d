""":class:`AsyncStore`, the daemon's async handle on the :class:`~.sqlite.Store`."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread

from sessionhook.api.models import Activity, Session

from ..events import Event
from ..retry import Decision
from .rows import (
    AttemptLike,
    DueDelivery,
    EndpointLike,
    EndpointState,
    Ingested,
    SessionRow,
    StatusSummary,
)
from .sqlite import Store

P = ParamSpec("P")
T = TypeVar("T")


class AsyncStore:
    """The daemon's handle on the :class:`Store`: every call runs in a worker thread under a
    ``CapacityLimiter(1)``, so there is one writer and the event loop never waits on disk.

    Explicit async methods cover what the poller, dispatcher and health server use; any
    other Store method is reachable through :meth:`call` (``await astore.call(store.replay,
    "ci", since=t)``). A call whose task is cancelled still finishes its transaction in the
    thread (anyio does not abandon the thread), so cancellation never half-writes.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._limiter = anyio.CapacityLimiter(1)

    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> AsyncStore:
        """:meth:`Store.open` in a worker thread."""
        store = await anyio.to_thread.run_sync(functools.partial(Store.open, path, clock=clock))
        return cls(store)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` (a Store method) in the store's worker thread."""
        return await anyio.to_thread.run_sync(
            functools.partial(fn, *args, **kwargs), limiter=self._limiter
        )

    async def close(self) -> None:
        """Close the store once every queued call has run."""
        await self.call(self.store.close)

    aclose = close

    async def sync_endpoints(self, endpoints: Iterable[EndpointLike]) -> None:
        """See :meth:`Store.sync_endpoints`."""
        await self.call(self.store.sync_endpoints, list(endpoints))

    async def set_endpoint_enabled(self, name: str, enabled: bool, reason: str | None) -> None:
        """See :meth:`Store.set_endpoint_enabled`."""
        await self.call(self.store.set_endpoint_enabled, name, enabled, reason)

    async def endpoint_states(self) -> list[EndpointState]:
        """See :meth:`Store.endpoint_states`."""
        return await self.call(self.store.endpoint_states)

    async def get_session(self, name: str) -> SessionRow | None:
        """See :meth:`Store.get_session`."""
        return await self.call(self.store.get_session, name)

    async def all_sessions(self) -> list[SessionRow]:
        """See :meth:`Store.all_sessions`."""
        return await self.call(self.store.all_sessions)

    async def is_baseline_complete(self) -> bool:
        """See :meth:`Store.is_baseline_complete`."""
        return await self.call(self.store.is_baseline_complete)

    async def mark_baseline_complete(self) -> None:
        """See :meth:`Store.mark_baseline_complete`."""
        await self.call(self.store.mark_baseline_complete)

    async def upsert_session(self, session: Session, *, baseline: bool) -> SessionRow:
        """See :meth:`Store.upsert_session`."""
        return await self.call(self.store.upsert_session, session, baseline=baseline)

    async def ingest_session_events(
        self, session_name: str, events: Sequence[Event], deliver: bool
    ) -> Ingested:
        """See :meth:`Store.ingest_session_events`."""
        return await self.call(self.store.ingest_session_events, session_name, events, deliver)

    async def schedule_poll(
        self,
        name: str,
        next_poll_at: float | None,
        *,
        polled_update_time: str | None = None,
        polled_at: float | None = None,
        poll_errors: int | None = None,
    ) -> None:
        """See :meth:`Store.schedule_poll`."""
        await self.call(
            self.store.schedule_poll,
            name,
            next_poll_at,
            polled_update_time=polled_update_time,
            polled_at=polled_at,
            poll_errors=poll_errors,
        )

    async def ingest_activities(
        self,
        session_name: str,
        activities: Sequence[Activity],
        events: Sequence[Event],
        deliver: bool,
    ) -> Ingested:
        """See :meth:`Store.ingest_activities`."""
        return await self.call(
            self.store.ingest_activities, session_name, activities, events, deliver
        )

    async def due_deliveries(
        self, now: float, limit: int, busy: Iterable[tuple[str, str]] = ()
    ) -> list[DueDelivery]:
        """See :meth:`Store.due_deliveries`."""
        return await self.call(self.store.due_deliveries, now, limit, set(busy))

    async def next_due_at(self) -> float | None:
        """See :meth:`Store.next_due_at`."""
        return await self.call(self.store.next_due_at)

    async def record_attempt(
        self, delivery_id: int, attempt: AttemptLike, decision: Decision
    ) -> float | None:
        """See :meth:`Store.record_attempt`."""
        return await self.call(self.store.record_attempt, delivery_id, attempt, decision)

    async def pending_count(self, endpoint: str | None = None) -> int:
        """See :meth:`Store.pending_count`."""
        return await self.call(self.store.pending_count, endpoint)

    async def outbox_stats(self) -> dict[str, tuple[int, float | None]]:
        """See :meth:`Store.outbox_stats`."""
        return await self.call(self.store.outbox_stats)

    async def status_summary(self, now: float) -> StatusSummary:
        """See :meth:`Store.status_summary`."""
        return await self.call(self.store.status_summary, now)

    async def record_upstream(self, label: str, status: int | str | None, at: float) -> None:
        """See :meth:`Store.record_upstream`."""
        await self.call(self.store.record_upstream, label, status, at)

    async def mark_poll(self, ok: bool, at: float) -> None:
        """See :meth:`Store.mark_poll`."""
        await self.call(self.store.mark_poll, ok, at)
