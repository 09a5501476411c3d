"""What only the PostgreSQL backend has: its migrations, its error mapping, its pool, its
connection strings. The store's behaviour is tested on both engines by the parametrized
suite (``store_backend``); these run on the session's real cluster (``tests/support/pg.py``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import anyio
import psycopg
import pytest

from sessionhook.api.models import Session
from sessionhook.relay.config.database_url import display_url
from sessionhook.relay.domain.retry import Delivered
from sessionhook.relay.store import (
    AsyncStore,
    AttemptRecord,
    Ingest,
    PostgresStore,
    StoreError,
    StoreFullError,
    StoreUnwritableError,
)
from sessionhook.relay.store.dialect import to_pyformat
from sessionhook.relay.store.migrations import MIGRATIONS, POSTGRES
from sessionhook.relay.store.outbox import Outbox, Round
from tests.support.backlog import fill, ok
from tests.support.clock import T0, Clock
from tests.support.loopback import free_port
from tests.support.pg import PASSWORD, Cluster
from tests.support.store_rows import Ep

pytestmark = pytest.mark.process


@pytest.fixture
def empty_url(pg_cluster: Cluster) -> Iterator[str]:
    """A database with nothing in it (not the migrated template)."""
    name = pg_cluster.create_database()
    yield pg_cluster.url(name)
    pg_cluster.drop_database(name)


def test_the_query_text_is_translated_once_for_psycopg() -> None:
    sql = (
        "SELECT '?', \"a%b\" FROM t WHERE x = ? AND y LIKE 'a%' "
        "AND z IN (SELECT value FROM json_each(?))"
    )
    assert to_pyformat(sql) == (
        "SELECT '?', \"a%%b\" FROM t WHERE x = %s AND y LIKE 'a%%' AND z IN "
        "(SELECT value FROM json_array_elements_text(CAST(%s AS json)))"
    )


def test_migrations_are_recorded_in_order_and_run_once_even_when_two_start_together(
    empty_url: str,
) -> None:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            PostgresStore.open(empty_url, pool_size=1).close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    with psycopg.connect(empty_url) as conn:
        names = [r[0] for r in conn.execute(POSTGRES.recorded.encode())]
    assert names == [m.name for m in MIGRATIONS]


def test_a_newer_schema_is_refused(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {POSTGRES.bookkeeping} (name, applied_at) VALUES ('9999_future', 0)"
        )
    with pytest.raises(StoreError, match=r"newer sessionhook \(migration 9999_future\)"):
        PostgresStore.open(pg_url)
    with pytest.raises(StoreError, match="newer sessionhook"):
        PostgresStore.open_readonly(pg_url)


def test_a_foreign_database_is_refused_and_left_alone(empty_url: str) -> None:
    with psycopg.connect(empty_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE theirs (x INTEGER)")
    with pytest.raises(StoreError, match="is not a sessionhook database"):
        PostgresStore.open(empty_url)
    with psycopg.connect(empty_url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    assert tables == [("theirs",)]


def test_an_unmigrated_database_is_refused_read_only(empty_url: str) -> None:
    with pytest.raises(StoreError, match="needs migrating"):
        PostgresStore.open_readonly(empty_url)


def test_a_wrong_password_or_database_is_one_clear_error_without_the_password(
    pg_cluster: Cluster,
) -> None:
    with pytest.raises(StoreError) as wrong:
        PostgresStore.open(pg_cluster.url(password="not-it"))
    assert not isinstance(wrong.value, StoreUnwritableError)
    assert "password authentication failed" in str(wrong.value)
    assert "not-it" not in str(wrong.value)
    with pytest.raises(StoreError, match='database "missing" does not exist') as missing:
        PostgresStore.open(pg_cluster.url("missing"))
    assert not isinstance(missing.value, StoreUnwritableError)
    assert PASSWORD not in str(missing.value)


def test_an_unreachable_server_is_unwritable_for_now() -> None:
    url = f"postgresql://u:secret-pw@127.0.0.1:{free_port()}/relay"
    with pytest.raises(StoreUnwritableError, match="database unavailable") as caught:
        PostgresStore.open(url)
    assert "secret-pw" not in str(caught.value)
    assert f"127.0.0.1:{url.split(':')[3].split('/')[0]}/relay" in str(caught.value)


def test_display_url_never_shows_the_password() -> None:
    shown = display_url("postgresql://relay:s3cret@db.example:5433/hooks?sslmode=require")
    assert "s3cret" not in shown
    assert shown.endswith("db.example:5433/hooks")
    assert "s3cret" not in display_url("postgresql://db.example/hooks?password=s3cret")


def test_disk_full_and_read_only_errors_map_to_the_waiting_paths(pg_url: str) -> None:
    with PostgresStore.open(pg_url) as store:
        full = store.unwritable_error(psycopg.errors.DiskFull("no space"))
        assert isinstance(full, StoreFullError)
        read_only = store.unwritable_error(psycopg.errors.ReadOnlySqlTransaction("standby"))
        assert isinstance(read_only, StoreUnwritableError)
        assert not isinstance(read_only, StoreFullError)
        assert store.unwritable_error(psycopg.errors.UniqueViolation("dup")) is None


@pytest.mark.anyio
async def test_a_read_only_database_makes_writes_wait_then_succeed(
    pg_cluster: Cluster, pg_url: str
) -> None:
    name = pg_url.rsplit("/", 1)[1]
    store = AsyncStore(PostgresStore.open(pg_url), retry_base=0.05, retry_cap=0.2)
    assert store._limiter.total_tokens == store.store.concurrency > 1
    try:
        with pg_cluster.admin() as conn:
            conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
        session = Session(name="sessions/1", state="IN_PROGRESS")
        with pytest.raises(StoreUnwritableError):  # tried once: a function without a policy
            await store.run(lambda s: s.ingest.upsert_session(session, baseline=False))

        async def writable_again() -> None:
            await anyio.sleep(0.3)
            with pg_cluster.admin() as conn:
                conn.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (name,),
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(writable_again)
            with anyio.fail_after(30):
                row = await store.run(Ingest.upsert_session, session, baseline=False)
        assert row.name == "sessions/1"
        assert store.unwritable is None
    finally:
        await store.close()


def test_text_with_nul_characters_is_stored_not_refused(pg_url: str) -> None:
    with PostgresStore.open(pg_url) as store:
        store.ingest.upsert_session(
            Session(name="sessions/1", title="a\x00b", state="IN_PROGRESS"), baseline=False
        )
        row = store.ingest.get_session("sessions/1")
        assert row is not None and row.title == "a\ufffdb"


def _claimed_round(
    store: PostgresStore, queues: int, claim: int
) -> tuple[list[Any], list[AttemptRecord]]:
    """Endpoint ``a`` with ``queues`` sessions of two deliveries, replica ``r1``, and a
    first round that claimed ``claim`` heads: those deliveries, and their records as
    delivered (the next round's input)."""
    store.endpoints.sync_endpoints([Ep("a")])
    fill(store, queues, 2)
    store.leases.register_replica("r1", host="h", pid=1, now=T0, lease=1e9)
    first = store.outbox.dispatch_round(Round([], T0 + 1, claim, (), (), {"a": claim}))[1]
    return first, [AttemptRecord(d.id, ok(T0 + 1), Delivered()) for d in first]


def test_a_dispatcher_rounds_statements_are_prepared_once_per_connection(pg_url: str) -> None:
    """The round's statements are prepared on the server (planned once per connection) and
    reused by the next round; the round still records, moves each queue on and claims."""
    store = PostgresStore.open(pg_url, clock=Clock(), pool_size=1)  # one connection to look at
    try:
        first, records = _claimed_round(store, 6, 3)
        failing, due, _next, _active = store.outbox.dispatch_round(
            Round(records, T0 + 1, 3, (), (), {"a": 3})
        )
        assert failing == [None, None, None]
        # The next of each queue: its head moved on in the same transaction.
        assert len(due) == 3 and not {d.id for d in due} & {d.id for d in first}
        prepared = store.db.conn.execute(
            "SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements"
        ).fetchall()
        plans = {text.split(" FROM ")[0][:30]: n for text, n in prepared}
        # The claim (heads read, claimed, their rows) ran in both rounds on one prepared
        # statement.
        assert plans["WITH h AS (SELECT h.endpoint, "] == 2
        assert any(text.startswith("UPDATE deliveries SET status") for text, _n in prepared)
        claimed = store.db.conn.execute(
            "SELECT COUNT(*) FROM outbox_heads WHERE claimed_by = 'r1'"
        ).fetchone()[0]
        assert claimed == 3
        assert store.outbox.pending_count() == 9
    finally:
        store.close()


@pytest.mark.anyio
async def test_the_dispatcher_rounds_run_in_one_thread_of_their_own(pg_url: str) -> None:
    """Through the async door, every round runs in the same thread, kept for rounds (the
    SQLite store's hand-off, not one of anyio's worker threads); other calls do not."""
    store = AsyncStore(PostgresStore.open(pg_url, clock=Clock()))
    threads: list[str] = []
    db = store.store.db
    one_connection = db.one_connection

    def spied() -> Any:
        threads.append(threading.current_thread().name)
        return one_connection()

    try:
        await store.run(lambda s: s.endpoints.sync_endpoints([Ep("a")]))
        await store.run(lambda s: fill(s, 4, 2))
        db.one_connection = spied  # type: ignore[method-assign]
        for _ in range(3):
            await store.run(Outbox.dispatch_round, Round([], T0 + 1, 2, (), (), {"a": 2}))
        other = await store.run(lambda s: threading.current_thread().name)
        assert threads == ["sessionhook-store-round"] * 3
        assert other != threads[0]
    finally:
        await store.close()


def _syncs(trace: str) -> int:
    """The batches a libpq trace's client waited for to the end: each ends with the
    server's ``ReadyForQuery`` (a simple query, an extended-protocol or pipeline sync)."""
    return sum(1 for line in trace.splitlines() if "\tReadyForQuery\t" in line)


def _statements(trace: str) -> int:
    """The statements a libpq trace's client sent (each a simple ``Query`` or an
    extended-protocol ``Execute``)."""
    return sum(
        1 for line in trace.splitlines() if line.split("\t")[2:3] in (["Query"], ["Execute"])
    )


def test_a_dispatcher_round_waits_for_the_server_at_the_end_of_four_batches(
    pg_url: str, tmp_path: Path
) -> None:
    """A round (records, their queues moved on, the next heads claimed and read) runs on
    one connection: the connection's check, the records' transaction (pipelined), the
    active endpoints, the claim (one statement: the heads read, locked and claimed, their
    rows). Statement by statement (each waited for, BEGIN and COMMIT too, and a check per
    borrowed connection) it was 19 batches; with the claim's own transaction and BEGIN
    and COMMIT sent, 13 statements."""
    store = PostgresStore.open(pg_url, clock=Clock(), pool_size=1)  # one connection to trace
    trace = tmp_path / "trace"
    try:
        first, records = _claimed_round(store, 6, 3)
        pool = cast(Any, store.db.conn).pool
        with trace.open("w") as out:
            with pool.connection() as conn:
                conn.pgconn.trace(out.fileno())
                conn.pgconn.set_trace_flags(
                    psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
                )
            try:
                failing, due, _next, _active = store.outbox.dispatch_round(
                    Round(records, T0 + 1, 3, (), (), {"a": 3})
                )
            finally:
                with pool.connection() as conn:
                    conn.pgconn.untrace()
        assert failing == [None, None, None]
        assert len(due) == 3 and not {d.id for d in due} & {d.id for d in first}
        assert store.outbox.pending_count() == 9
        # Borrowing the connection back to untrace it was checked once more.
        assert _syncs(trace.read_text()) - 1 == 4
        # The check; the queues' locks, the records, the attempts, the endpoint (one
        # transaction, no BEGIN or COMMIT: the pipeline's sync commits it); the active
        # endpoints; the claim.
        assert _statements(trace.read_text()) - 1 == 7
    finally:
        store.close()


def test_a_round_failing_inside_its_pipeline_commits_nothing_and_the_next_one_works(
    pg_url: str,
) -> None:
    """A statement whose result is not read (the attempts' rows) fails on the server: the
    round raises, the records' transaction is rolled back whole (their deliveries still
    open and claimed, no attempt logged), and the next round, on a fresh connection,
    records them."""
    store = PostgresStore.open(pg_url, clock=Clock(), pool_size=1)
    try:
        first, records = _claimed_round(store, 2, 2)
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused'; END $$"
            )
            admin.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON attempts "
                "FOR EACH STATEMENT EXECUTE FUNCTION refuse()"
            )
            with pytest.raises(psycopg.Error, match="refused"):
                store.outbox.dispatch_round(Round(records, T0 + 1, 2, (), (), {"a": 2}))
            assert store.outbox.pending_count() == 4
            logged = admin.execute("SELECT COUNT(*) FROM attempts").fetchone()
            assert logged is not None and logged[0] == 0
            admin.execute("DROP TRIGGER refuse ON attempts")
        failing, due, _next, _active = store.outbox.dispatch_round(
            Round(records, T0 + 1, 2, (), (), {"a": 2})
        )
        assert failing == [None, None]
        assert store.outbox.pending_count() == 2
        assert len(due) == 2 and not {d.id for d in due} & {d.id for d in first}
    finally:
        store.close()


def test_an_error_raised_between_a_rounds_statements_commits_none_of_them(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A round's transaction has no BEGIN and no COMMIT (the pipeline's closing sync
    commits it): an error raised in Python after some of its statements were sent (an
    unknown delivery) must not let that sync commit them. The next round works.
    psycopg's warning that it could not end the pipeline whose connection was closed on
    purpose is not passed on: the error is raised, and is the one line to read."""
    store = PostgresStore.open(pg_url, clock=Clock(), pool_size=1)
    try:
        _first, records = _claimed_round(store, 2, 2)
        unknown = AttemptRecord(10**9, ok(T0 + 1), Delivered())
        with (
            caplog.at_level(logging.DEBUG, logger="psycopg"),
            pytest.raises(StoreError, match="unknown delivery"),
        ):
            # The records' UPDATE and its RETURNING ran; the error comes after them.
            store.outbox.dispatch_round(Round([*records, unknown], T0 + 1, 0))
        assert [r.getMessage() for r in caplog.records if r.name == "psycopg"] == []
        assert store.outbox.pending_count() == 4
        failing, _due, _next, _active = store.outbox.dispatch_round(Round(records, T0 + 1, 0))
        assert failing == [None, None]
        assert store.outbox.pending_count() == 2
    finally:
        store.close()
