"""The store itself, for an operator's command: the one the configuration names, and the
two sides of ``store copy``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..domain.rows import ReplicaRow
from ..store import Store, StoreCore, StoreSettings, copying, open_store
from ..store.copying import CopyReport


def operator_store(settings: StoreSettings, *, readonly: bool = False) -> StoreCore:
    """The store ``settings`` name, for an operator's command: read-only for a read (safe
    while the daemon runs), writable for an action (short transactions that the daemon's
    busy timeout waits out). Raises :class:`StoreError` as :func:`~.store.open_store`."""
    return open_store(settings, readonly=readonly)


def open_copy_side(spec: str, *, writable: bool) -> StoreCore:
    """The store at ``spec`` (a SQLite path or a ``postgresql://`` URL) for ``store copy``:
    read-only for the source, opened (created and migrated) for the target."""
    if spec.startswith(("postgresql://", "postgres://")):
        from ..store.postgres import PostgresStore  # psycopg: loaded for PostgreSQL only

        return PostgresStore.open(spec) if writable else PostgresStore.open_readonly(spec)
    path = Path(spec).expanduser()
    return Store.open(path) if writable else Store.open_readonly(path)


def live_replicas(store: StoreCore, now: float) -> list[ReplicaRow]:
    """The replicas running on ``store`` at ``now`` (heartbeat within their lease): a store
    that has one is live, and ``store copy`` refuses it."""
    return [r for r in store.leases.replicas() if r.alive(now)]


def copy_stores(
    source: StoreCore,
    target: StoreCore,
    *,
    replace: bool = False,
    progress: Callable[[str, int, int], None] = lambda table, done, total: None,
) -> CopyReport:
    """Every row of ``source`` into ``target``, ids kept (:func:`~.store.copying.copy_store`,
    which raises :class:`CopyError` for a target that is not empty, or an incomplete copy)."""
    return copying.copy_store(source.copy, target.copy, replace=replace, progress=progress)
