"""The store by roles: the async door runs each role's method with its policy for a store
that cannot be written (writes wait, statistics are skipped, the daemon's own syncs are
tried once); the body references of an archive that did not commit are never used again;
and no module outside the store reaches past the door or asks a backend its name."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import anyio
import psycopg
import pytest

from sessionhook.api.models import Session
from sessionhook.relay.domain.events import Event
from sessionhook.relay.domain.rows import Ingested, from_row
from sessionhook.relay.store import (
    AsyncStore,
    Economy,
    EndpointQueries,
    LeaseRow,
    MetaQueries,
    Outbox,
    PostgresStore,
    Round,
    Store,
    StoreCore,
    StoreFullError,
)
from sessionhook.relay.store.policy import policy_of, write
from tests.support.backends import Backend

pytestmark = pytest.mark.app

BIG = "x" * 200_000
SRC = Path(__file__).resolve().parent.parent / "src" / "sessionhook"


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    events: tuple[str, ...] = ("*",)
    enabled: bool = True


class Observer:
    """Hears the door's full-disk news (the daemon logs them)."""

    def __init__(self) -> None:
        self.full = anyio.Event()

    def store_unwritable(self, error: StoreFullError, *, first: bool, retry_in: float) -> None:
        self.full.set()

    def store_writable_again(self, *, after: float) -> None:
        pass


async def _full(path: Path, observer: Observer) -> AsyncStore:
    """A door on a SQLite store that has no page left (SQLITE_FULL at the next one)."""
    store = await AsyncStore.open(path, observer=observer)
    store._retry_base = 0.02  # a test's patience
    pages = await store.run(lambda s: s.db.conn.execute("PRAGMA page_count").fetchone()[0])
    await store.run(lambda s: s.db.conn.execute(f"PRAGMA max_page_count = {pages}"))
    return store


@pytest.mark.anyio
async def test_each_role_method_meets_a_full_store_with_its_policy(tmp_path: Path) -> None:
    observer = Observer()
    store = await _full(tmp_path / "relay.db", observer)
    # The daemon's config sync is tried once (a reload must still hear SIGTERM).
    with pytest.raises(StoreFullError):
        await store.run(EndpointQueries.sync_endpoints, [Endpoint("big", "http://h/" + BIG)])
    assert store.unwritable is None  # not a waiting write: nothing recorded
    done = anyio.Event()

    async def write() -> None:
        await store.run(MetaQueries.set_meta, "big", BIG)
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(write)
        with anyio.fail_after(10):
            await observer.full.wait()
        # Statistics are skipped (not even tried before the retry is due), not waited for.
        with anyio.fail_after(1):
            assert await store.run(Economy.record_upstream, "list_sessions", 200, 0.0) is False
            assert await store.run(MetaQueries.probe, "stat", BIG) is False
        await anyio.sleep(0.1)
        assert not done.is_set()  # the write waits
        await store.run(lambda s: s.db.conn.execute("PRAGMA max_page_count = 1073741823"))
        with anyio.fail_after(10):
            await done.wait()
    assert await store.run(MetaQueries.get_meta, "big") == BIG
    assert store.unwritable is None
    await store.close()


def _event(n: int) -> Event:
    body = json.dumps({"type": "session.discovered", "n": n, "data": {"x": "y" * 300}})
    return Event(f"evt_{n}", "session.discovered", "sessions/1", None, "", 0.0, body.encode())


def test_references_of_an_archive_whose_commit_failed_are_not_used(pg_url: str) -> None:
    """PostgreSQL commits when the transaction block ends: a COMMIT that fails (here a
    deferred trigger) rolls back the body reference the archive created; the next event of
    the session must not be compressed against it."""
    with PostgresStore.open(pg_url) as store:
        store.ingest.upsert_session(Session(name="sessions/1", state="IN_PROGRESS"), baseline=False)
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(
                "CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$"
            )
            admin.execute(
                "CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON body_refs "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_commit()"
            )
        with pytest.raises(psycopg.Error, match="refused at commit"):
            store.ingest.ingest_session_events("sessions/1", [_event(1)], False)
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("DROP TRIGGER refuse ON body_refs")
        store.ingest.ingest_session_events("sessions/1", [_event(2)], False)
        assert [e.body for e in store.operator.iter_events()] == [_event(2).body]


#: Outside the store: the synchronous store behind the door, or a backend's name.
_REACHING = re.compile(
    r"\.store\.store\b|\b(?:astore|store|_store|current)\.store\.\w+\(|"
    r"\._?(?:call|write|read|try_write)\(\s*[\w.]*\.store\b|getattr\([^)]*[\"']backend[\"']"
)


def test_nothing_outside_the_store_reaches_past_the_door() -> None:
    found = [
        f"{path.relative_to(SRC)}:{text.count(chr(10), 0, m.start()) + 1}: {m[0]}"
        for path in sorted(SRC.rglob("*.py"))
        if "relay/store/" not in path.as_posix()
        for text in [path.read_text()]
        for m in _REACHING.finditer(text)
    ]
    assert found == []


def test_every_public_method_of_every_role_declares_its_policy(tmp_path: Path) -> None:
    with Store.open(tmp_path / "relay.db") as store:
        classes = [type(role) for role in store.roles()]
    assert len(classes) >= 10
    undeclared = [
        f"{cls.__name__}.{name}"
        for cls in classes
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_") and policy_of(member) is None
    ]
    assert undeclared == []


#: A store call: ``store.run(Role.method`` (the call may wrap a line).
_STORE_CALL = re.compile(r"store\.run\(\s*(\w+)\.(\w+)")
#: The daemon's long-running tasks: the poller, and the side tasks of the daemon.
_LONG_RUNNING = ("relay/polling/*.py", "relay/daemon/tasks.py", "relay/daemon/upstream.py")
#: Their calls tried once on purpose: each caller catches the failure itself.
_CAUGHT_BY_THE_CALLER = {
    "Leases.release_session_poll",  # session_poll.py: suppressed, the claim lapses
    "Economy.take_budget",  # upstream.py: the in-process window instead
}


def test_the_long_running_tasks_store_calls_wait_out_an_unreachable_store() -> None:
    """A ``call`` raises at the first failure (a PostgreSQL pool timeout), and a failure
    that leaves a poller's or a side task's body ends the daemon: every store call of
    those is a read or a write that waits out an unreachable store, or a statistic,
    unless its caller catches the failure."""
    import sessionhook.relay.store as roles

    calls = {
        f"{m[1]}.{m[2]}"
        for pattern in _LONG_RUNNING
        for path in sorted(SRC.glob(pattern))
        for m in _STORE_CALL.finditer(path.read_text())
    }
    assert len(calls) >= 20, calls  # the pattern still finds them
    once = sorted(
        call
        for call in calls - _CAUGHT_BY_THE_CALLER
        for role, method in [call.split(".")]
        if policy_of(getattr(getattr(roles, role), method)) == "call"
    )
    assert once == []


@write
def _write_big(store: StoreCore, key: str) -> None:
    """An operator's write over the store (as ops.replay is)."""
    store.meta.set_meta(key, BIG)


def _read_big(store: StoreCore, key: str) -> str | None:
    """A function without a policy: run once."""
    return store.meta.get_meta(key)


@pytest.mark.anyio
async def test_a_function_over_the_store_runs_under_its_own_policy(tmp_path: Path) -> None:
    observer = Observer()
    store = await _full(tmp_path / "relay.db", observer)
    store._retry_base = 3600.0  # a write waits an hour between tries: only a read goes on
    outcome: list[object] = []

    async def write() -> None:
        try:
            outcome.append(await store.run(_write_big, "big"))
        except StoreFullError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(write)
        with anyio.fail_after(10):
            await observer.full.wait()
        with anyio.fail_after(5):
            # Reads go on while the write waits: the function without a policy, and the
            # dispatcher's round that records nothing and claims nothing (writes_when).
            assert await store.run(_read_big, "big") is None
            failing, due, _next, _active = await store.run(
                Outbox.dispatch_round, Round([], 0.0, 10)
            )
            assert (failing, due) == ([], [])
        assert outcome == [] and store.unwritable is not None  # the write waits
        store.stop_waiting()
    [error] = outcome  # the waiting write gave up
    assert isinstance(error, StoreFullError)
    await store.close()


def test_the_door_refuses_what_is_no_role_method_with_a_policy(tmp_path: Path) -> None:
    async def main() -> None:
        store = await AsyncStore.open(tmp_path / "relay.db")
        try:
            with pytest.raises(TypeError, match="pending_count is not a store method"):
                await store.run(store.store.outbox.pending_count)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="_due_rows is not a store method"):
                await store.run(Outbox._due_rows, [])
            assert await store.run(Outbox.pending_count) == 0
        finally:
            await store.close()

    anyio.run(main)


#: A result row read by position: ``r[13]``, ``row[0]``, ``rows[0][1]``, ``fetchone()[0]``.
_BY_POSITION = re.compile(
    r"\b(?:r|row|rows\[\w+\]|holder|old|value|upstream)\[\d+\]|fetchone\(\)\[\d+\]|\)\[\d+\]\[\d+\]"
)
#: Where a position is the point: the first column of a one-value query (``first_value``),
#: the migrations' bookkeeping (on the connection before it reads by name).
_BY_POSITION_KEPT = {"dialect.py", "migrations.py"}


def test_the_store_reads_result_rows_by_name() -> None:
    found = [
        f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m[0]}"
        for path in sorted((SRC / "relay" / "store").glob("*.py"))
        if path.name not in _BY_POSITION_KEPT
        for text in [path.read_text()]
        for m in _BY_POSITION.finditer(text)
    ]
    assert found == []


def test_rows_read_by_name_and_position_on_both_engines(backend: Backend) -> None:
    with backend.open() as store:
        row = store.db.conn.execute("SELECT 7 AS seven, 'x' AS ex").fetchone()
        assert (row["seven"], row["ex"]) == (7, "x")
        assert (
            (row[0], row[1]) == (7, "x")
            and row == (7, "x")
            and list(row.keys())
            == [
                "seven",
                "ex",
            ]
        )
        assert from_row(LeaseRow, row, name="n", owner="o", acquired_at=1.0) == LeaseRow(
            "n", "o", 1.0
        )
        (state,) = [*store.db.conn.execute("SELECT 'a' AS name, 'b' AS owner, 2.5 AS acquired_at")]
        assert from_row(LeaseRow, state) == LeaseRow("a", "b", 2.5)
        assert from_row(LeaseRow, state, owner="c") == LeaseRow("a", "c", 2.5)
        # A field with a default may have no column.
        counts = store.db.conn.execute("SELECT 3 AS activities, 1 AS deliveries").fetchone()
        assert from_row(Ingested, counts, event_types=()) == Ingested(3, (), deliveries=1)
