"""The outbox under load: a due query whose work does not grow with the backlog, group
commits, retention of the delivery log, and the compact (but byte-exact) archive."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionhook.relay.domain import events
from sessionhook.relay.domain.retry import AttemptResult, Dead, Delivered, Retry
from sessionhook.relay.store import AttemptRecord, Caps, Round, Store, codec, outbox
from tests.support.backends import Backend, sqlite_only
from tests.support.backlog import activity, fill, ok, session
from tests.support.clock import T0, Clock
from tests.support.store_rows import Ep

pytestmark = pytest.mark.app


def fail(at: float = T0) -> AttemptResult:
    return AttemptResult(503, None, 2.0, "busy", None, at)


@pytest.fixture
def store(backend: Backend, clock: Clock) -> Iterator[Store]:
    with backend.open(clock=clock) as opened:
        opened.endpoints.sync_endpoints([Ep("a")])
        yield opened


def vm_steps(store: Store, call: Any, every: int = 100) -> int:
    """SQLite virtual-machine instructions (in units of ``every``) spent by ``call()``: a
    count of the work done, not a time."""
    steps = 0

    def tick() -> int:
        nonlocal steps
        steps += 1
        return 0

    store.db.conn.set_progress_handler(tick, every)
    try:
        call()
    finally:
        store.db.conn.set_progress_handler(None, 0)
    return steps


# --------------------------------------------------------------------------- due query


@sqlite_only  # SQLite's query plan / trace callback / 0.1 rows
def test_due_query_reads_the_heads_index_not_the_backlog(store: Store) -> None:
    fill(store, 5, 5)
    explain = "EXPLAIN QUERY PLAN "
    plan = [
        row[3] for row in store.db.conn.execute(explain + outbox.HEADS_SQL, ("a", T0, "", T0, 16))
    ]
    # The heads come from their index alone (it covers the query, claim included).
    assert any(p.startswith("SEARCH h USING COVERING INDEX outbox_heads_due") for p in plan), plan
    assert not any("TEMP B-TREE" in p for p in plan), plan  # the index gives the order
    # The replicas' registry (one row per replica of the last day) is read once per query
    # for the live owners of claims (a list subquery, not per row); nothing else is scanned.
    assert "LIST SUBQUERY 1" in plan, plan
    assert [p for p in plan if p.startswith("SCAN")] == ["SCAN replicas"], plan
    # The chosen heads' rows: every table is reached by a key lookup, never scanned. With a
    # dispatcher round's worth of ids, the delivery is still found by its key (a status
    # condition in SQL made the planner walk an index on status instead).
    plan = [row[3] for row in store.db.conn.execute(explain + outbox.rows_sql(16), range(1, 17))]
    assert not any(p.startswith("SCAN") for p in plan), plan
    assert any(p.startswith("SEARCH d USING INTEGER PRIMARY KEY") for p in plan), plan
    # Where nothing is claimed, both in one statement: the walk of the heads' index in its
    # order, the sessions in flight passed over there, each head's row joined by its key.
    in_flight = ("sessions/0", "sessions/1")
    sql = outbox.due_rows_sql(len(in_flight))
    plan = [
        row[3] for row in store.db.conn.execute(explain + sql, ("a", T0, "", T0, *in_flight, 16))
    ]
    assert plan[0].startswith("SEARCH h USING COVERING INDEX outbox_heads_due"), plan
    assert not any("TEMP B-TREE" in p for p in plan), plan
    assert [p for p in plan if p.startswith("SCAN")] == ["SCAN replicas"], plan
    assert any(p.startswith("SEARCH d USING INTEGER PRIMARY KEY") for p in plan), plan


class RowsRead:
    """The store's connection, counting the rows its statements hand back: on SQLite each
    row is one ``sqlite3_step``, which lets the GIL go and takes it back."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.rows = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    def execute(self, sql: str, params: Any = ()) -> Any:
        rows = self.conn.execute(sql, params).fetchall()
        self.rows += len(rows)
        return Read(rows)


class Read(list[Any]):
    """A statement's rows, read whole."""

    def fetchall(self) -> list[Any]:
        return list(self)

    def fetchone(self) -> Any:
        return self[0] if self else None


def rows_read(store: Store, call: Any) -> tuple[Any, int]:
    """What ``call()`` returns and the rows its statements handed back."""
    spy = RowsRead(store.db.conn)
    store.db.conn = spy  # type: ignore[assignment]
    try:
        return call(), spy.rows
    finally:
        store.db.conn = spy.conn


@sqlite_only  # a row read is a step of its statement on SQLite
def test_due_deliveries_read_a_row_per_delivery_handed_out(store: Store) -> None:
    """A row read is a call into SQLite (a ``sqlite3_step``, which lets the GIL go and
    takes it back) and a row object in the store's thread. The due deliveries past those
    in flight cost a row each, the heads in flight none (read apart, the heads came
    first, those in flight included, then their rows: 24 rows here)."""
    fill(store, 24, 2)
    first = store.outbox.due_deliveries(T0, 8)
    in_flight = {d.key for d in first}
    due, rows = rows_read(
        store, lambda: store.outbox.due_deliveries(T0, 8, in_flight, active=["a"])
    )
    assert len(due) == 8 and not in_flight & {d.key for d in due}
    assert rows == 8


def test_heads_in_flight_cost_no_row_reads(tmp_path: Path) -> None:
    """Only the rows handed out are read (joined, bodies fetched): a head in flight costs
    one index entry. So one delivery picked past 15 in flight costs well under half of
    what handing out 16 does (when each head's row was joined before it was skipped, the
    two cost the same)."""
    with Store.open(tmp_path / "f.db", clock=Clock()) as s:
        s.endpoints.sync_endpoints([Ep("a")])
        fill(s, 20, 5)
        in_flight = {("a", f"sessions/{n}") for n in range(15)}
        (one,) = s.outbox.due_deliveries(T0, 1, in_flight)
        assert (one.endpoint, one.session_name) not in in_flight
        past_busy = vm_steps(s, lambda: s.outbox.due_deliveries(T0, 1, in_flight), every=10)
        sixteen = vm_steps(s, lambda: s.outbox.due_deliveries(T0, 16), every=10)
        assert 2 * past_busy < sixteen, (past_busy, sixteen)


def test_caps_bound_each_endpoint_and_skip_full_ones(store: Store) -> None:
    """The dispatcher's free slots per endpoint: an endpoint with none gets nothing, the
    others at most their cap, busy keys still skipped; on both engines."""
    store.endpoints.sync_endpoints([Ep("a"), Ep("b"), Ep("c")])
    fill(store, 10, 3)
    assert len(store.outbox.due_deliveries(T0, 30)) == 30
    due = store.outbox.due_deliveries(T0, 30, {("b", "sessions/0")}, {"a": 0, "b": 4, "c": 30})
    by_endpoint = {e: [d for d in due if d.endpoint == e] for e in "abc"}
    assert by_endpoint["a"] == []
    assert len(by_endpoint["b"]) == 4
    assert "sessions/0" not in {d.session_name for d in by_endpoint["b"]}
    assert len(by_endpoint["c"]) == 10
    # Soonest first across endpoints, each (endpoint, session) once, bodies intact.
    assert len({d.key for d in due}) == len(due)
    assert all(json.loads(d.body)["type"] for d in due)


@sqlite_only  # SQLite's VM steps
def test_a_full_endpoint_costs_no_reads(store: Store) -> None:
    store.endpoints.sync_endpoints([Ep("a"), Ep("b"), Ep("c")])
    fill(store, 10, 3)
    only_b = vm_steps(
        store, lambda: store.outbox.due_deliveries(T0, 5, (), {"a": 0, "b": 5, "c": 0})
    )
    store.endpoints.set_endpoint_enabled("a", False, "test")
    store.endpoints.set_endpoint_enabled("c", False, "test")
    alone = vm_steps(store, lambda: store.outbox.due_deliveries(T0, 5, (), {"b": 5}))
    assert only_b <= alone + 1, (only_b, alone)


@pytest.fixture(scope="module")
def backlogs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The same 20 sessions with 10 and with 400 open deliveries each, archived once for
    the module (a test works on a copy)."""
    made = {}
    for per_session in (10, 400):
        path = tmp_path_factory.mktemp("backlog") / f"{per_session}.db"
        with Store.open(path, clock=Clock()) as s:
            s.endpoints.sync_endpoints([Ep("a")])
            fill(s, 20, per_session)
        made[per_session] = path
    return made


@pytest.mark.parametrize("query", ["due", "next_due"])
def test_due_query_work_does_not_grow_with_the_backlog(
    tmp_path: Path, backlogs: dict[int, Path], query: str
) -> None:
    """The same 20 sessions with 10 or 400 open deliveries each: the work of picking 16
    due deliveries (and the next due time) must be the same, within a small margin."""
    work = []
    for per_session in (10, 400):
        path = shutil.copy(backlogs[per_session], tmp_path / f"{per_session}.db")
        with Store.open(path, clock=Clock()) as s:
            assert s.outbox.pending_count() == 20 * per_session
            if query == "due":
                assert len(s.outbox.due_deliveries(T0, 16)) == 16
                steps = vm_steps(
                    s, lambda s=s: s.outbox.due_deliveries(T0, 16, {("a", "sessions/0")})
                )
            else:
                steps = vm_steps(s, lambda s=s: s.outbox.next_due_at(after=T0))
            work.append(steps)
    small, large = work
    assert large <= small * 1.2 + 5, f"work grew with the backlog: {small} -> {large}"


#: Endpoints with nothing queued, beside the two that have queues.
IDLE = [Ep(f"idle{n:03d}") for n in range(300)]


def test_a_round_asks_only_the_endpoints_with_a_queue(store: Store) -> None:
    """A dispatcher's round reads the active endpoints that have a queue head, on both
    engines: 300 with nothing queued change nothing of what it hands out or when it looks
    next, and a disabled endpoint's queues stay out."""
    store.endpoints.sync_endpoints([Ep("a"), Ep("b")])
    fill(store, 2, 2)
    store.endpoints.sync_endpoints([Ep("a"), Ep("b"), *IDLE])
    assert len(store.outbox.active_revisions().names) == 302
    queued = store.outbox.active_revisions(queued_only=True)
    assert queued.names == ["a", "b"]
    assert queued.revision == store.outbox.active_revisions().revision
    failing, due, next_due, active = store.outbox.dispatch_round(
        Round([], T0, 16, queued_only=True)
    )
    assert {d.endpoint for d in due} == {"a", "b"} and len(due) == 4  # a head per queue
    assert failing == [] and next_due is None and active.names == ["a", "b"]
    # Retried later: nothing due now, the next due time is still found among 302.
    store.outbox.record_attempts(
        [AttemptRecord(d.id, fail(), Retry(at=T0 + 60 + i)) for i, d in enumerate(due)]
    )
    assert store.outbox.dispatch_round(Round([], T0, 16, queued_only=True))[1:3] == ([], T0 + 60)
    store.endpoints.set_endpoint_enabled("a", False, "operator")
    assert store.outbox.active_revisions(queued_only=True).names == ["b"]
    assert (
        store.outbox.dispatch_round(Round([], T0 + 70, 16, queued_only=True))[1][0].endpoint == "b"
    )
    # Nothing queued at all: no name, the newest revision all the same.
    store.endpoints.set_endpoint_enabled("a", True)
    while due := store.outbox.due_deliveries(T0 + 100, 16):
        store.outbox.record_attempts([AttemptRecord(d.id, ok(), Delivered()) for d in due])
    nothing = store.outbox.active_revisions(queued_only=True)
    assert nothing.names == [] and nothing.revision == store.outbox.active_revisions().revision


@sqlite_only  # SQLite's VM steps
def test_an_idle_round_costs_the_same_over_300_endpoints_with_nothing_queued(
    store: Store,
) -> None:
    """What a round reads grows with the endpoints that have queues, not with those that
    have none (two statements each made 10,000 endpoints cost 130 ms a round)."""
    store.endpoints.sync_endpoints([Ep("a"), Ep("b")])
    fill(store, 2, 2)
    due = store.outbox.due_deliveries(T0, 16)
    store.outbox.record_attempts([AttemptRecord(d.id, fail(), Retry(at=T0 + 60)) for d in due])

    def idle_round() -> None:
        assert store.outbox.dispatch_round(Round([], T0, 16, queued_only=True))[1:3] == (
            [],
            T0 + 60,
        )

    two = vm_steps(store, idle_round, every=10)
    store.endpoints.sync_endpoints([Ep("a"), Ep("b"), *IDLE])
    many = vm_steps(store, idle_round, every=10)
    assert many <= two * 1.2 + 5, (two, many)


def test_caps_without_an_entry_per_endpoint(store: Store) -> None:
    """:class:`Caps`: the dispatcher's caps given for a few endpoints, a default for the
    other known ones, none for an endpoint it does not know (not loaded yet)."""
    store.endpoints.sync_endpoints([Ep("a"), Ep("b"), Ep("c")])
    fill(store, 6, 1)
    caps = Caps({"a": 0}, frozenset({"a", "b"}), 4)
    assert dict(caps) == {"a": 0, "b": 4} and len(caps) == 2
    assert caps.get("c", 0) == 0 and "c" not in caps
    due = store.outbox.due_deliveries(T0, 30, (), caps)
    assert [d.endpoint for d in due] == ["b"] * 4


def test_heads_follow_every_kind_of_write(store: Store, clock: Clock) -> None:
    fill(store, 2, 3)
    first = store.outbox.due_deliveries(T0, 10)
    assert len(first) == 2  # one head per session
    by_session = {d.session_name: d for d in first}
    # Delivered: the next one of that session becomes due; a retry moves the head's time.
    store.outbox.record_attempts(
        [
            AttemptRecord(by_session["sessions/0"].id, ok(), Delivered()),
            AttemptRecord(by_session["sessions/1"].id, fail(), Retry(at=T0 + 60)),
        ]
    )
    due = store.outbox.due_deliveries(T0, 10)
    assert [d.session_name for d in due] == ["sessions/0"]
    assert due[0].id > by_session["sessions/0"].id
    assert store.outbox.next_due_at(after=T0) == T0 + 60
    # Dead: the session's next delivery becomes the head at once.
    store.outbox.record_attempt(by_session["sessions/1"].id, fail(), Dead())
    assert {d.session_name for d in store.outbox.due_deliveries(T0, 10)} == {
        "sessions/0",
        "sessions/1",
    }
    # Replay (an INSERT ... SELECT) adds rows behind the existing heads.
    heads = {d.id for d in store.outbox.due_deliveries(T0, 10)}
    assert store.operator.replay("a", since=0) > 0
    assert {d.id for d in store.outbox.due_deliveries(T0, 10)} == heads
    # The heads table equals what the old GROUP BY over all open rows says.
    expected = set(
        store.db.conn.execute(
            "SELECT MIN(id) FROM deliveries WHERE status IN ('pending', 'failed') "
            "GROUP BY endpoint, session_name"
        ).fetchall()
    )
    assert set(store.db.conn.execute("SELECT delivery_id FROM outbox_heads").fetchall()) == expected


def test_a_disabled_endpoint_keeps_its_heads_but_gets_nothing(store: Store) -> None:
    store.endpoints.sync_endpoints([Ep("a"), Ep("b")])
    fill(store, 3, 2)
    store.endpoints.set_endpoint_enabled("b", False, "operator")
    assert {d.endpoint for d in store.outbox.due_deliveries(T0, 10)} == {"a"}
    store.endpoints.set_endpoint_enabled("b", True)
    assert {d.endpoint for d in store.outbox.due_deliveries(T0, 10)} == {"a", "b"}


# --------------------------------------------------------------------------- group commit


@sqlite_only  # SQLite's query plan / trace callback / 0.1 rows
def test_a_batch_is_one_transaction_with_per_record_failing_since(store: Store) -> None:
    fill(store, 3, 1)
    d = store.outbox.due_deliveries(T0, 10)
    commits: list[str] = []
    store.db.conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    failing = store.outbox.record_attempts(
        [
            AttemptRecord(d[0].id, fail(T0 + 1), Retry(at=T0 + 60)),
            AttemptRecord(d[1].id, fail(T0 + 2), Retry(at=T0 + 60)),
            AttemptRecord(d[2].id, ok(T0 + 3), Delivered()),
        ]
    )
    store.db.conn.set_trace_callback(None)
    assert commits == ["COMMIT"]
    assert failing == [T0 + 1, T0 + 1, None]
    (state,) = store.endpoints.endpoint_states()
    assert state.failing_since is None and state.last_success_at == pytest.approx(T0 + 3.002)
    numbers = store.db.conn.execute("SELECT delivery_id, attempt FROM attempts").fetchall()
    assert sorted(numbers) == sorted((x.id, 1) for x in d)


def test_failing_since_after_success_first_and_when_already_failing(store: Store) -> None:
    fill(store, 4, 1)
    d = store.outbox.due_deliveries(T0, 10)
    # A success first clears the clock: the batch's later failure starts a new one.
    assert store.outbox.record_attempts(
        [
            AttemptRecord(d[0].id, ok(T0 + 1), Delivered()),
            AttemptRecord(d[1].id, fail(T0 + 2), Retry(at=T0 + 60)),
        ]
    ) == [None, T0 + 2]
    (state,) = store.endpoints.endpoint_states()
    assert state.failing_since == T0 + 2
    # Already failing: a later batch's failures keep the stored start.
    assert store.outbox.record_attempts(
        [AttemptRecord(d[2].id, fail(T0 + 9), Retry(at=T0 + 60))]
    ) == [T0 + 2]
    (state,) = store.endpoints.endpoint_states()
    assert state.failing_since == T0 + 2
    assert store.outbox.record_attempts([AttemptRecord(d[3].id, ok(T0 + 10), Delivered())]) == [
        None
    ]
    (state,) = store.endpoints.endpoint_states()
    assert state.failing_since is None


@sqlite_only  # SQLite's trace callback
def test_a_batch_of_successes_does_not_read_the_failing_clock(store: Store) -> None:
    fill(store, 3, 1)
    d = store.outbox.due_deliveries(T0, 10)
    statements: list[str] = []
    store.db.conn.set_trace_callback(statements.append)
    store.outbox.record_attempts([AttemptRecord(x.id, ok(T0 + 1), Delivered()) for x in d])
    store.db.conn.set_trace_callback(None)
    assert not [sql for sql in statements if "SELECT failing_since" in sql]


def test_a_batch_costs_the_same_statements_whatever_its_size(
    store: Store, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recording is one round trip per kind of write on PostgreSQL, not one per delivery:
    a batch of 16 attempts (retries and successes) sends as many statements as one of 2."""
    fill(store, 18, 1)
    due = sorted(store.outbox.due_deliveries(T0, 18), key=lambda d: d.key)
    sent: list[str] = []
    if backend.name == "sqlite":
        conn = store.db.conn

        class Counted:  # the connection the queries see, counting what they send
            def execute(self, sql: str, parameters: Any = (), /) -> Any:
                sent.append(sql)
                return conn.execute(sql, parameters)

            def __getattr__(self, name: str) -> Any:
                return getattr(conn, name)

        monkeypatch.setattr(store.db, "conn", Counted())
    else:
        import psycopg

        execute = psycopg.Cursor.execute

        def counted(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(str(query))
            return execute(cursor, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, "execute", counted)

    def statements(batch: list[Any]) -> int:
        sent.clear()
        failing = store.outbox.record_attempts(
            [
                AttemptRecord(d.id, fail(T0 + 1), Retry(at=T0 + 60))
                if i % 2
                else AttemptRecord(d.id, ok(T0 + 1), Delivered())
                for i, d in enumerate(batch)
            ]
        )
        # A success clears the endpoint's failing clock, the failure after it starts it.
        assert failing == [T0 + 1 if i % 2 else None for i in range(len(batch))]
        return len(sent)

    assert statements(due[16:]) == statements(due[:16])
    monkeypatch.undo()
    # Every attempt is recorded, numbered, and decided.
    rows = store.db.conn.execute(
        "SELECT d.status, d.attempts, t.attempt FROM deliveries d "
        "JOIN attempts t ON t.delivery_id = d.id"
    ).fetchall()
    assert len(rows) == 18
    assert sorted({(r[0], r[1], r[2]) for r in rows}) == [
        ("delivered", 1, 1),
        ("failed", 1, 1),
    ]


@sqlite_only  # SQLite's statement journal
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
def test_a_batch_of_records_writes_no_temporary_file(store: Store) -> None:
    """A batch's record statement keeps no statement journal: SQLite spilled one past
    64 KiB to a temporary file (created, written, deleted) at every round of 16: this
    batch's rows spread over enough pages for that."""
    fill(store, 100, 10)
    due = sorted(store.outbox.due_deliveries(T0, 16), key=lambda d: d.key)
    assert len(due) == 16
    opened: set[str] = set()

    def look() -> int:  # SQLite's temporary files are named etilqs_*, deleted once open
        for fd in Path("/proc/self/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if "etilqs_" in target:
                    opened.add(target)
        return 0

    store.db.conn.set_progress_handler(look, 50)
    try:
        store.outbox.record_attempts([AttemptRecord(d.id, ok(T0 + 1), Delivered()) for d in due])
    finally:
        store.db.conn.set_progress_handler(None, 0)
    assert store.outbox.pending_count() == 100 * 10 - 16
    assert not opened


def test_a_failing_batch_records_nothing(store: Store) -> None:
    fill(store, 2, 1)
    d = store.outbox.due_deliveries(T0, 10)
    with pytest.raises(Exception, match="unknown delivery"):
        store.outbox.record_attempts(
            [AttemptRecord(d[0].id, ok(), Delivered()), AttemptRecord(999_999, ok(), Delivered())]
        )
    assert store.db.conn.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 0
    assert store.outbox.pending_count() == 2


# --------------------------------------------------------------------------- retention


def test_prune_removes_old_attempts_and_delivered_rows_only(store: Store, clock: Clock) -> None:
    fill(store, 4, 2)
    first = {d.session_name: d for d in store.outbox.due_deliveries(T0, 10)}
    store.outbox.record_attempts(
        [
            AttemptRecord(first["sessions/0"].id, ok(T0), Delivered()),
            AttemptRecord(first["sessions/1"].id, fail(T0), Dead()),
            AttemptRecord(first["sessions/2"].id, fail(T0), Retry(at=T0 + 10)),
        ]
    )
    recent = {d.session_name: d for d in store.outbox.due_deliveries(T0 + 86400 * 10, 10)}
    store.outbox.record_attempt(recent["sessions/3"].id, ok(T0 + 86400 * 10), Delivered())
    events_before = store.db.conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    attempts, deliveries = store.outbox.prune_delivery_log(T0 + 86400 * 5, batch=1)
    assert (attempts, deliveries) == (3, 1)
    rows = {
        r[0]: r[1] for r in store.db.conn.execute("SELECT id, status FROM deliveries").fetchall()
    }
    assert first["sessions/0"].id not in rows  # delivered long ago: gone
    assert rows[first["sessions/1"].id] == "dead"  # a dead letter stays (replayable)
    assert rows[first["sessions/2"].id] == "failed"  # open rows stay
    assert rows[recent["sessions/3"].id] == "delivered"  # recent: kept, with its attempt
    assert store.operator.list_attempts(recent["sessions/3"].id)
    # The archive is never touched, and the outbox still works.
    assert store.db.conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == events_before
    assert {d.session_name for d in store.outbox.due_deliveries(T0 + 86400 * 10, 10)} == {
        "sessions/0",
        "sessions/1",
        "sessions/2",
        "sessions/3",
    }


# --------------------------------------------------------------------------- archive


@settings(max_examples=60, deadline=None)
@given(
    body=st.binary(max_size=3000),
    reference=st.binary(max_size=2000),
    context=st.binary(max_size=2000),
)
def test_codec_round_trips_any_bytes(body: bytes, reference: bytes, context: bytes) -> None:
    stored = codec.encode_body(body, reference, context)
    assert codec.decode_body(stored, reference, context) == body
    raw = codec.encode_raw(body, context)
    assert codec.decode_raw(raw, context) == body


def test_bodies_come_back_byte_for_byte_and_take_far_less_room(store: Store) -> None:
    s = session(7, prompt="Refactor the parser and keep the public API " * 4)
    store.ingest.upsert_session(s, baseline=False)
    acts = [activity(7, i, text=f"step {i}: rewrote module {i % 5} " * 3) for i in range(60)]
    evs = [events.activity_event(s, a, max_media_bytes=1000) for a in acts]
    evs.append(events.session_discovered(s))
    store.ingest.ingest_activities(s.name, acts, evs[:-1], True)
    store.ingest.ingest_session_events(s.name, evs[-1:], True)
    by_id = {e.id: e.body for e in evs}
    archived = {row.id: row.body for row in store.operator.iter_events()}
    assert archived == by_id  # every byte of every body
    due = store.outbox.due_deliveries(T0, 100)
    assert all(d.body == by_id[d.event_id] for d in due)
    assert store.operator.get_event(evs[5].id).body == evs[5].body  # type: ignore[union-attr]
    for a in acts:
        raw = store.ingest.activity_raw(a.name)
        assert raw is not None and json.loads(raw) == a.to_wire()
    stored = sum(
        r[0] for r in store.db.conn.execute("SELECT length(body) FROM events").fetchall()
    ) + sum(r[0] for r in store.db.conn.execute("SELECT length(data) FROM body_refs").fetchall())
    plain = sum(len(b) for b in by_id.values())
    assert stored < plain / 4, (stored, plain)


@sqlite_only  # SQLite's query plan / trace callback / 0.1 rows
def test_rows_written_as_text_before_0004_are_still_read(store: Store) -> None:
    s = session(3)
    store.ingest.upsert_session(s, baseline=False)
    a = activity(3, 1)
    ev = events.activity_event(s, a, max_media_bytes=1000)
    store.ingest.ingest_activities(s.name, [a], [ev], True)
    # What a 0.1 database holds: plain JSON text, no reference.
    raw = json.dumps(a.to_wire(), separators=(",", ":"))
    store.db.conn.execute("UPDATE activities SET raw = ?", (raw,))
    store.db.conn.execute("UPDATE events SET body = ?, body_ref = NULL", (ev.body.decode(),))
    assert store.ingest.activity_raw(a.name) == raw.encode()
    assert [row.body for row in store.operator.iter_events()] == [ev.body]
    (due,) = store.outbox.due_deliveries(T0, 10)
    assert due.body == ev.body


def test_a_rolled_back_ingest_leaves_no_stale_reference(store: Store) -> None:
    s = session(4)
    store.ingest.upsert_session(s, baseline=False)
    a = activity(4, 1)
    ev = events.activity_event(s, a, max_media_bytes=1000)
    bad = events.Event("evt_x", "activity.unknown", s.name, None, "", 0.0, b"\xff")
    with pytest.raises(UnicodeDecodeError):
        store.ingest.ingest_activities(s.name, [a], [ev, bad], True)
    assert store.db.conn.execute("SELECT COUNT(*) FROM body_refs").fetchone()[0] == 0
    store.ingest.ingest_activities(s.name, [a], [ev], True)
    (due,) = store.outbox.due_deliveries(T0, 10)
    assert due.body == ev.body


def test_migration_builds_heads_for_an_existing_outbox(tmp_path: Path) -> None:
    """A 0.1 database with open deliveries gets its heads when 0005_outbox_heads runs."""
    path = tmp_path / "old.db"
    with Store.open(path, clock=Clock()) as s:
        s.endpoints.sync_endpoints([Ep("a")])
        fill(s, 3, 4)
        expected = {d.id for d in s.outbox.due_deliveries(T0, 10)}
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DELETE FROM outbox_heads")
    conn.execute("DROP TABLE outbox_heads")
    for name in ("insert", "update", "delete"):
        conn.execute(f"DROP TRIGGER IF EXISTS outbox_heads_on_{name}")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0005_outbox_heads'")
    # 0007 (replicas) adds claim columns to the heads: undone too, re-run after 0005.
    for statement in (
        "DROP TABLE replicas",
        "DROP TABLE leases",
        "DROP TABLE budget_locks",
        "DROP INDEX sessions_poll_claims",
        "ALTER TABLE sessions DROP COLUMN poll_owner",
        "ALTER TABLE sessions DROP COLUMN poll_claimed_at",
        "DELETE FROM _sqlite_migrations WHERE name = '0007_replicas'",
    ):
        conn.execute(statement)
    conn.close()
    with Store.open(path, clock=Clock()) as s:
        assert {d.id for d in s.outbox.due_deliveries(T0, 10)} == expected
