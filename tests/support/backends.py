"""The store's two engines for tests: :class:`Backend` opens one test's store on SQLite or
PostgreSQL (the ``backend`` fixture of conftest.py hands it out, parametrized by
``store_backend``); :data:`sqlite_only` marks a store test that is about SQLite itself."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sessionhook.relay.store import PostgresStore, Store, StoreCore
from tests.support.pg import TEMPLATE, Cluster


class Backend:
    """Opens one test's store on the chosen engine (again and again: a restart)."""

    def __init__(self, name: str, target: Path | str) -> None:
        self.name = name
        self.target = target

    def open(self, *, clock: Callable[[], float] = time.time) -> StoreCore:
        if isinstance(self.target, Path):
            return Store.open(self.target, clock=clock)
        return PostgresStore.open(self.target, clock=clock)

    def open_readonly(self, *, clock: Callable[[], float] = time.time) -> StoreCore:
        if isinstance(self.target, Path):
            return Store.open_readonly(self.target, clock=clock)
        return PostgresStore.open_readonly(self.target, clock=clock)

    def another(self, request: Any) -> Backend:
        """A second, independent store on the same engine."""
        if isinstance(self.target, Path):
            return Backend(self.name, self.target.with_name(self.target.stem + "-2.db"))
        cluster: Cluster = request.getfixturevalue("pg_cluster")
        name = cluster.create_database(TEMPLATE)
        request.addfinalizer(lambda: cluster.drop_database(name))
        return Backend(self.name, cluster.url(name))


#: For a store test about SQLite itself (pragmas, query plans, the file, its legacy rows).
sqlite_only = pytest.mark.parametrize("store_backend", ["sqlite"])
