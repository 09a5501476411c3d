"""Shared pytest configuration: anyio runs async tests on asyncio; the store's backends.

``store_backend`` parametrizes a test over ``sqlite`` and ``postgresql``; ``backend`` then
opens that test's store (the same one at each call: a reopen is a restart). PostgreSQL is
a real server (``tests/pg.py``), started once per session when a test first needs it and
stopped at the end; each test gets a fresh database. Without the server binaries the
PostgreSQL tests are skipped with the reason, except with ``CI=true``, where that fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionhook.relay.store import PostgresStore, Store, StoreCore

from .pg import Cluster

# A suite started in the background by a shell without job control (`make test &` in a
# script) inherits SIGINT ignored, and so does every `sessionhook` it starts: the tests that
# press Ctrl-C on one would wait forever. Put Python's handler back: the children then
# start with SIGINT's default action, as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TEMPLATE = "sessionhook_template"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """The session's PostgreSQL cluster, with a migrated template database."""
    try:
        cluster = Cluster()
    except (FileNotFoundError, OSError) as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"PostgreSQL is required in CI: {exc}")
        pytest.skip(f"no PostgreSQL server: {exc}")
    try:
        cluster.start()
        with cluster.admin() as conn:
            conn.execute(f'CREATE DATABASE "{TEMPLATE}"'.encode())
        PostgresStore.open(cluster.url(TEMPLATE), pool_size=1).close()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> Iterator[str]:
    """A fresh, migrated database of its own for this test."""
    name = pg_cluster.create_database(TEMPLATE)
    yield pg_cluster.url(name)
    pg_cluster.drop_database(name)


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


@pytest.fixture(params=["sqlite", "postgresql"])
def store_backend(request: pytest.FixtureRequest) -> str:
    """Which engine the store suite runs on."""
    return str(request.param)


@pytest.fixture
def backend(store_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    """This test's store on ``store_backend`` (not opened yet)."""
    if store_backend == "sqlite":
        return Backend("sqlite", tmp_path / "state" / "sessionhook.db")
    return Backend("postgresql", request.getfixturevalue("pg_url"))


#: For a store test about SQLite itself (pragmas, query plans, the file, its legacy rows).
sqlite_only = pytest.mark.parametrize("store_backend", ["sqlite"])


def run_python(script: str, cwd: Path) -> str:
    """Run ``script`` (dedented) in a fresh interpreter of this venv; its stdout, stripped.
    For what must not happen in this test process (imports already made here, a frozen
    heap). A failing script fails the test with its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
