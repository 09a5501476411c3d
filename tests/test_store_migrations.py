"""One ordered list of migrations for both engines, applied by one runner. A database that
sessionhook at fc72eec left after any of its migrations (its names recorded out of numeric
order, by sqlite-utils on SQLite) opens with those names mapped: nothing applied twice,
nothing skipped, and it ends with the schema a new database has, which is the schema
fc72eec made (tables, columns, indexes, constraints, triggers and functions) and the
migrations listed after its own."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sessionhook.relay.store import PostgresStore, Store, StoreError, migrations
from sessionhook.relay.store.migrations import MIGRATIONS, POSTGRES, SQLITE, Migration
from tests.support.backends import Backend
from tests.support.pg import Cluster
from tests.support.schemas import (
    OLD_NAMES,
    build_old_postgres,
    build_old_sqlite,
    postgres_schema,
    sqlite_schema,
)
from tests.support.store_rows import session

pytestmark = [pytest.mark.app, pytest.mark.real_migrations]

NEW_NAMES = [m.name for m in MIGRATIONS]


def empty_database(request: pytest.FixtureRequest) -> str:
    """A PostgreSQL database with nothing in it (not the migrated template), dropped after."""
    cluster: Cluster = request.getfixturevalue("pg_cluster")
    name = cluster.create_database()
    request.addfinalizer(lambda: cluster.drop_database(name))
    return cluster.url(name)


def run(backend: Backend, sql: str) -> list[tuple[Any, ...]]:
    """``sql`` on the backend's database, outside the store (committed)."""
    if isinstance(backend.target, Path):
        conn = sqlite3.connect(backend.target, isolation_level=None)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    with psycopg.connect(backend.target, autocommit=True) as pg:
        cursor = pg.execute(sql.encode())
        return cursor.fetchall() if cursor.description else []


def recorded(backend: Backend) -> list[str]:
    """The migration names the database records, in the order applied."""
    engine = SQLITE if backend.name == "sqlite" else POSTGRES
    return [str(r[0]) for r in run(backend, engine.recorded)]


def schema(backend: Backend) -> object:
    if isinstance(backend.target, Path):
        conn = sqlite3.connect(backend.target)
        try:
            return sqlite_schema(conn)
        finally:
            conn.close()
    return postgres_schema(backend.target)


def old(engine: str, request: pytest.FixtureRequest, tmp_path: Path, through: str) -> Backend:
    """A database as fc72eec left it after migration ``through``."""
    if engine == "sqlite":
        build_old_sqlite(tmp_path / "old.db", through=through)
        return Backend(engine, tmp_path / "old.db")
    url = empty_database(request)
    build_old_postgres(url, through=through)
    return Backend(engine, url)


class NewDatabases:
    """What a database this version makes records and holds, per engine (made once)."""

    def __init__(self, request: pytest.FixtureRequest, folder: Path) -> None:
        self.request, self.folder = request, folder
        self.made: dict[str, tuple[list[str], object]] = {}

    def state(self, engine: str) -> tuple[list[str], object]:
        if engine not in self.made:
            if engine == "sqlite":
                store = Backend(engine, self.folder / "new.db")
            else:
                store = Backend(engine, empty_database(self.request))
            store.open().close()
            self.made[engine] = (recorded(store), schema(store))
        return self.made[engine]


@pytest.fixture(scope="module")
def new(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> NewDatabases:
    return NewDatabases(request, tmp_path_factory.mktemp("new"))


ENGINES = pytest.mark.parametrize("engine", ["sqlite", "postgresql"])


def test_the_list_is_numbered_in_the_order_it_applies_and_maps_every_old_name() -> None:
    assert [name[:5] for name in NEW_NAMES] == [f"{n:04d}_" for n in range(1, len(NEW_NAMES) + 1)]
    # fc72eec's names, each standing for one migration, in the order it applied them.
    assert [m.formerly or m.name for m in MIGRATIONS][: len(OLD_NAMES)] == OLD_NAMES
    former = [m.formerly for m in MIGRATIONS if m.formerly]
    assert len(set(NEW_NAMES) | set(former)) == len(NEW_NAMES) + len(former)


@ENGINES
def test_a_new_database_has_the_schema_fc72eec_made_and_the_later_migrations(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path, new: NewDatabases
) -> None:
    made_then = old(engine, request, tmp_path, OLD_NAMES[-1])
    assert recorded(made_then) == OLD_NAMES
    made_then.open().close()
    assert new.state(engine) == (NEW_NAMES, schema(made_then))
    assert recorded(made_then) == [*OLD_NAMES, *NEW_NAMES[len(OLD_NAMES) :]]


#: Every step on SQLite; on PostgreSQL (the same runner, a database costs a second) one
#: before the names fc72eec applied out of order, one among them, and the last.
STEPS = [
    *(("sqlite", name) for name in OLD_NAMES),
    *(("postgresql", name) for name in ("0002_refused_activities", "0004_outbox_heads")),
    ("postgresql", OLD_NAMES[-1]),
]


@pytest.mark.parametrize(("engine", "through"), STEPS)
def test_a_database_fc72eec_left_at_any_migration_catches_up(
    engine: str, through: str, request: pytest.FixtureRequest, tmp_path: Path, new: NewDatabases
) -> None:
    store = old(engine, request, tmp_path, through)
    run(store, "INSERT INTO meta (key, value) VALUES ('kept', 'yes')")
    done = OLD_NAMES[: OLD_NAMES.index(through) + 1]
    if len(done) < len(MIGRATIONS):
        with pytest.raises(StoreError, match="needs migrating"):
            store.open_readonly()
    else:  # the old names are read as this version's: nothing to do
        store.open_readonly().close()
    store.open().close()
    store.open().close()
    # The names recorded stay as they were; what was missing is applied once, in order.
    assert recorded(store) == done + NEW_NAMES[len(done) :]
    assert schema(store) == new.state(engine)[1]
    assert run(store, "SELECT key, value FROM meta WHERE key = 'kept'") == [("kept", "yes")]
    store.open_readonly().close()


@ENGINES
def test_a_migration_recorded_under_both_names_counts_once(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store = old(engine, request, tmp_path, OLD_NAMES[-1])
    bookkeeping = SQLITE.record if engine == "sqlite" else POSTGRES.record
    run(store, bookkeeping.replace("?, ?", "'0005_outbox_heads', 0"))
    store.open().close()
    assert recorded(store) == [*OLD_NAMES, "0005_outbox_heads", *NEW_NAMES[len(OLD_NAMES) :]]


@ENGINES
def test_a_bookkeeping_table_of_another_shape_is_refused_in_one_line(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store = Backend(engine, tmp_path / "odd.db" if engine == "sqlite" else empty_database(request))
    table = SQLITE.bookkeeping if engine == "sqlite" else POSTGRES.bookkeeping
    run(store, f"CREATE TABLE {table} (name TEXT)")
    before = schema(store)
    for opening in (store.open, store.open_readonly):
        with pytest.raises(StoreError, match=r"no such column|does not exist") as info:
            opening()
        assert "\n" not in str(info.value)
    assert schema(store) == before


@pytest.mark.process
def test_a_failing_migration_leaves_no_trace_on_postgresql(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = empty_database(request)
    broken = Migration("0002_broken", ("CREATE TABLE half_done (x INTEGER)", "SELECT nowhere"))
    monkeypatch.setattr(migrations, "MIGRATIONS", (MIGRATIONS[0], broken))
    with pytest.raises(StoreError, match="nowhere"):
        PostgresStore.open(url)
    tables = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
    assert run(Backend("postgresql", url), tables) == []
    monkeypatch.undo()
    PostgresStore.open(url).close()
    assert recorded(Backend("postgresql", url)) == NEW_NAMES


@ENGINES
@pytest.mark.parametrize("accounts", [(), ("team-a",), ("team-a", "team-b")])
def test_the_passes_a_store_kept_go_to_its_one_account(
    engine: str,
    accounts: tuple[str, ...],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before ``0013_account_polls`` the store kept one last pass for all its accounts:
    a store of one account (``default`` when it has no session yet) keeps it under that
    account; with several, whose it was is unknown: each gets its own with its next pass."""
    target = tmp_path / "db.sqlite" if engine == "sqlite" else empty_database(request)
    backend = Backend(engine, target)
    monkeypatch.setattr(
        migrations, "MIGRATIONS", MIGRATIONS[: NEW_NAMES.index("0013_account_polls")]
    )
    store = backend.open()
    for n, account in enumerate(accounts):
        store.economy.record_history([session(n)], account=account)
    store.close()
    run(
        backend,
        "INSERT INTO meta (key, value) VALUES ('last_poll_at', '1700000005.5'), "
        "('last_ok_poll_at', '1700000000.25'), ('list_cut', '40'), ('kept', 'yes')",
    )
    monkeypatch.undo()
    backend.open().close()
    seeded = [(accounts or ("default",))[0], 1700000005.5, 1700000000.25, 40]
    polls = run(
        backend, "SELECT account, last_poll_at, last_ok_poll_at, list_cut FROM account_polls"
    )
    assert [list(row) for row in polls] == ([seeded] if len(accounts) < 2 else [])
    assert run(backend, "SELECT key FROM meta WHERE key LIKE 'l%' OR key = 'kept'") == [("kept",)]


def test_sqlite_migrates_once_when_several_open_a_new_file_together(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    errors: list[BaseException] = []

    def start() -> None:
        try:
            Store.open(path).close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert recorded(Backend("sqlite", path)) == NEW_NAMES


def test_sqlite_opens_a_new_file_while_another_connection_writes_it(tmp_path: Path) -> None:
    """SQLite answers ``PRAGMA journal_mode = WAL`` with "database is locked" at once,
    without the busy timeout, while another connection holds a write lock on a file still
    in rollback mode (what a second process opening a new store meets): the open waits
    for the lock instead of failing."""
    path = tmp_path / "db.sqlite"
    path.touch(mode=0o600)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    released = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    released.start()
    try:
        Store.open(path).close()
    finally:
        released.join()
        other.close()
    assert recorded(Backend("sqlite", path)) == NEW_NAMES
