"""The status overview: what ``sessionhook status`` and the console's overview show, and
the deliveries in flight on the live replicas."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..domain.rows import HistoryProgress, ReplicaRow, StatusSummary
from ..store import StoreCore


@dataclass(frozen=True, slots=True)
class Overview:
    """What ``sessionhook status`` and the console's overview show."""

    summary: StatusSummary
    history: HistoryProgress
    accounts: dict[str, int]
    #: The replicas sharing the store (running, or stopped within a day) and what each
    #: holds.
    replicas: tuple[ReplicaRow, ...] = ()


def status(store: StoreCore, now: float) -> Overview:
    """Endpoints, upstream, archive figures, the history walk, the accounts and the
    replicas at ``now``."""
    return Overview(
        store.operator.status_summary(now),
        store.economy.history_progress(now),
        store.economy.accounts_summary(),
        tuple(store.leases.replicas()),
    )


def in_flight(store: StoreCore, now: float, ids: Iterable[int]) -> dict[int, tuple[str, float]]:
    """Of the deliveries ``ids``, those a live replica is attempting: id -> (replica, since)."""
    return store.leases.delivery_claims(now, ids)


def endpoints_in_flight(store: StoreCore, now: float) -> dict[str, dict[str, int]]:
    """Per endpoint, the deliveries in flight on each live replica."""
    return store.leases.endpoint_claims(now)
