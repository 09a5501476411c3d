"""Shared pytest fixtures (helpers and fakes live in ``tests/support/``).

anyio runs async tests on asyncio. ``store_backend`` parametrizes a test over ``sqlite`` and
``postgresql``; ``backend`` then opens that test's store (the same one at each call: a
reopen is a restart). PostgreSQL is a real server (``tests/support/pg.py``), started once
per session when a test first needs it and stopped at the end; each test gets a fresh
database. A new SQLite store opened in the test's process is a copy of a migrated template
(``tests/support/store_template.py``) unless the test is marked ``real_migrations``; httpx
clients made without an SSL context share one (``tests/support/ca_bundle.py``).
Without the server binaries the PostgreSQL tests are skipped with the reason,
except with ``CI=true``, where that fails. ``clock`` is a hand-moved clock; ``harness``
runs the real daemon's processes of a black-box test; ``listeners`` are the two loopback
consumers of the DNS-rebinding tests. Every test ends with the logging configuration it
began with (a CLI command run in-process configures logging as the real one does).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import structlog

from sessionhook.relay.store import PostgresStore
from sessionhook.relay.store import sqlite as sqlite_engine
from tests.support import ca_bundle
from tests.support.backends import Backend
from tests.support.clock import Clock
from tests.support.pg import TEMPLATE, Cluster
from tests.support.rebinding import PRIVATE, PUBLIC, Listener
from tests.support.relay_process import Harness
from tests.support.store_template import Template

pytest_plugins = ["tests.support.tiers", "pytester"]

# A suite started in the background by a shell without job control (`make test &` in a
# script) inherits SIGINT ignored, and so does every `sessionhook` it starts: the tests that
# press Ctrl-C on one would wait forever. Put Python's handler back: the children then
# start with SIGINT's default action, as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _logging_kept() -> Iterator[None]:
    """Undo a test's logging configuration (``sessionhook listen`` in-process sets the level
    to warning, a daemon's reload to its config's): the next test in this worker starts
    from the same one, so what it captures does not depend on which tests ran before."""
    before = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**before)
    for handler in list(root.handlers):  # ours only: pytest's own come and go per phase
        if handler.get_name() == "sessionhook" and handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session", autouse=True)
def _one_ca_bundle() -> Iterator[None]:
    """httpx clients made without an SSL context share one (``tests/support/ca_bundle.py``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ca_bundle.MODULE, ca_bundle.NAME, ca_bundle.SharedContext())
        yield


@pytest.fixture(scope="session")
def migrated_template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    """This worker's migrated SQLite database (``tests/support/store_template.py``)."""
    return Template(tmp_path_factory.mktemp("template"))


@pytest.fixture(autouse=True)
def _new_stores_from_the_template(
    request: pytest.FixtureRequest, migrated_template: Template
) -> Iterator[None]:
    """A new SQLite store in this process is a copy of the migrated template, unless the
    test is marked ``real_migrations``."""
    if request.node.get_closest_marker("real_migrations"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite_engine, "migrate", migrated_template.migrate)
        yield


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


@pytest.fixture
def clock() -> Clock:
    """A hand-moved clock at :data:`~tests.support.clock.T0` (a module may start it
    elsewhere with a fixture of its own)."""
    return Clock()


@pytest.fixture
def harness(tmp_path: Path) -> Iterable[Harness]:
    """The servers and ``sessionhook run`` processes of one black-box test, all stopped at
    teardown (their output printed when the test failed)."""
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def listeners() -> Iterator[tuple[Listener, Listener]]:
    """A "public" and a private listener on the same port."""
    for _ in range(20):
        public = Listener(PUBLIC, 0)
        try:
            private = Listener(PRIVATE, public.port)
        except OSError:  # the port is taken on 127.0.0.1: try another
            public.close()
            continue
        try:
            yield public, private
        finally:
            public.close()
            private.close()
        return
    pytest.fail("no port free on both 127.0.0.1 and 127.0.0.2")
