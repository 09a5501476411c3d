"""Replicas writing one PostgreSQL store at the same time: the paths that do not take the
global write lock (claiming and recording deliveries, heartbeats) neither wait for it nor
break the outbox heads when they interleave with ingest and with each other.

Real PostgreSQL (the suite's throwaway cluster); threads play replicas. Bounded: a fixed
number of pages and rounds, every wait with a timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sessionhook.relay.domain import events
from sessionhook.relay.domain.retry import Delivered, Retry
from sessionhook.relay.domain.rows import EndpointSpec
from sessionhook.relay.store import AttemptRecord, PostgresStore, dialect, postgres
from tests.support.backlog import activity, ok, session
from tests.support.clock import T0, Clock
from tests.support.store_rows import Ep
from tests.support.store_rows import activity as store_activity

pytestmark = pytest.mark.process

LEASE = 60.0
WAIT = 30.0  # seconds a step may take on a loaded machine before it counts as blocked


def replica(url: str, rid: str) -> PostgresStore:
    store = PostgresStore.open(url, clock=Clock())
    store.leases.register_replica(rid, host="h", pid=1, now=T0, lease=LEASE)
    return store


@pytest.fixture
def stores(pg_url: str) -> Iterator[tuple[PostgresStore, PostgresStore]]:
    a, b = replica(pg_url, "aaaa"), replica(pg_url, "bbbb")
    a.endpoints.sync_endpoints([Ep("one"), Ep("two")])
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def ingest_page(store: PostgresStore, n: int, first: int, count: int) -> None:
    s = session(n)
    store.ingest.upsert_session(s, baseline=False)
    acts = [activity(n, i) for i in range(first, first + count)]
    evs = [events.activity_event(s, a, max_media_bytes=1000) for a in acts]
    store.ingest.ingest_activities(s.name, acts, evs, True)


def heads_are_exact(store: PostgresStore) -> None:
    """``outbox_heads`` holds exactly each open queue's oldest delivery."""
    derived = store.db.conn.execute(
        "SELECT endpoint, session_name, MIN(id) FROM deliveries "
        "WHERE status IN ('pending', 'failed') GROUP BY endpoint, session_name"
    ).fetchall()
    heads = store.db.conn.execute(
        "SELECT endpoint, session_name, delivery_id FROM outbox_heads"
    ).fetchall()
    assert sorted(map(tuple, heads)) == sorted(map(tuple, derived))


def test_claiming_and_recording_do_not_wait_for_the_global_write_lock(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = stores
    ingest_page(a, 1, 0, 2)
    holding, release = threading.Event(), threading.Event()

    def hold_the_write_lock() -> None:
        with a.db.tx():  # a serialized writer (an ingest, an operator's replay) in progress
            holding.set()
            release.wait(WAIT)

    holder = threading.Thread(target=hold_the_write_lock)
    holder.start()
    try:
        assert holding.wait(WAIT)
        done: list[str] = []

        def work() -> None:
            b.leases.heartbeat_replica(T0 + 1)
            due = b.outbox.due_deliveries(T0 + 1, 10)
            b.outbox.record_attempts(
                [AttemptRecord(d.id, ok(), Delivered()) for d in sorted(due, key=lambda d: d.key)]
            )
            done.append(f"{len(due)} recorded")

        worker = threading.Thread(target=work)
        worker.start()
        worker.join(WAIT)
        finished_while_held = not worker.is_alive()
    finally:
        release.set()
        holder.join(WAIT)
        worker.join(WAIT)
    assert finished_while_held, "the replica's hot path waited for the global write lock"
    assert done == ["2 recorded"]  # the head of each endpoint's queue of session 1
    heads_are_exact(a)


def test_ingest_and_two_recording_replicas_interleaved_keep_every_head_exact(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = stores
    sessions, pages, per_page = 4, 6, 3
    errors: list[BaseException] = []
    ingested = threading.Event()

    def ingest() -> None:
        try:
            for page in range(pages):
                for n in range(sessions):
                    ingest_page(a, n, page * per_page, per_page)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            ingested.set()

    def deliver(store: PostgresStore, failing: bool) -> None:
        try:
            for step in range(400):
                now = T0 + 1 + step
                due = sorted(store.outbox.due_deliveries(now, 8), key=lambda d: d.key)
                if not due and ingested.is_set():
                    return
                store.leases.heartbeat_replica(now)
                decisions = [
                    Retry(at=now) if failing and d.attempts == 0 else Delivered() for d in due
                ]
                store.outbox.record_attempts(
                    [AttemptRecord(d.id, ok(now), x) for d, x in zip(due, decisions, strict=True)]
                )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=ingest),
        threading.Thread(target=deliver, args=(a, False)),
        threading.Thread(target=deliver, args=(b, True)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 4)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    heads_are_exact(a)
    # Every delivery went out, each recorded once per attempt, in order per queue.
    expected = 2 * sessions * pages * per_page  # two endpoints
    open_left = a.outbox.pending_count()
    assert open_left == 0
    rows = a.db.conn.execute(
        "SELECT d.id, d.status, COUNT(t.attempt), MAX(t.attempt) FROM deliveries d "
        "JOIN attempts t ON t.delivery_id = d.id GROUP BY d.id, d.status"
    ).fetchall()
    assert len(rows) == expected
    assert all(status == "delivered" and count == top for _, status, count, top in rows)


def queue_keys_held_while_waiting(
    store: PostgresStore,
    first: tuple[str, str],
    act: Callable[[], object],
    meanwhile: Callable[[Any], None] = lambda c: None,
) -> int:
    """With a rival holding the queue key ``first``, run ``act`` on a thread until it waits
    for that key: the queue keys (two-int4 advisory locks, objsubid 2) it holds then.
    ``meanwhile`` reads on the rival's connection before the key is released."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            act()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=run)
    with store.db.tx(serialized=False) as c:
        store.db.lock_queue_keys(c, [first])
        thread.start()
        deadline = time.monotonic() + WAIT
        while not c.execute(
            "SELECT COUNT(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()["n"]:
            assert time.monotonic() < deadline, "it never waited for the rival's key"
            time.sleep(0.01)
        held = c.execute(
            "SELECT COUNT(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND objsubid = 2 AND pid <> pg_backend_pid()"
        ).fetchone()["n"]
        meanwhile(c)
    thread.join(WAIT)
    assert not thread.is_alive()
    assert errors == []
    return int(held)


def claimed_then_given_back(b: PostgresStore) -> None:
    """Replica ``b`` claims the queue ("api", session 1) once its retry is due, then gives
    the claim back (handed out, not started: what the dispatcher's next round does)."""
    key = ("api", session(1).name)
    assert key in {d.key for d in b.outbox.due_deliveries(T0 + 10_001, 10)}
    b.leases.release_delivery_claims([key])


#: Each writer of one queue's rows, on replica ``b``, of queue ("api", session 1) whose
#: head ``y`` failed and waits for a later retry.
QUEUE_WRITERS: dict[str, Callable[[PostgresStore, int], object]] = {
    "give a claim back": lambda b, y: claimed_then_given_back(b),
    "record one attempt": lambda b, y: b.outbox.record_attempts(
        [AttemptRecord(y, ok(T0 + 2), Delivered())]
    ),
    "retry": lambda b, y: b.requeue.retry(y),
    "recover": lambda b, y: b.requeue.recover("api", 0.0),
    "due now": lambda b, y: b.requeue.due_now("api"),
    "delete the endpoint": lambda b, y: b.endpoints.delete_endpoint("api", "gone"),
}


@pytest.mark.parametrize("writer", sorted(QUEUE_WRITERS))
def test_a_writer_of_a_queue_takes_its_key_lock_before_any_row_of_it(
    stores: tuple[PostgresStore, PostgresStore], writer: str
) -> None:
    """The lock order of every writer of the heads (docs/replicas.md): a queue's key lock,
    then its rows. A writer that locked a delivery row first and then waited for the key
    deadlocked with a replica recording a batch with that delivery (it holds the key and
    waits for the row): two replicas record one delivery when one took over the claim of
    the other, whose lease lapsed."""
    a, b = stores
    spec = EndpointSpec("api", "http://127.0.0.1:9/", ("*",), {}, None, {})
    a.endpoints.create_endpoint(spec, "whsec_" + "A" * 32)
    ingest_page(a, 1, 0, 2)
    key = ("api", session(1).name)
    y = min(
        d.id for d in b.outbox.due_deliveries(T0 + 1, 10) if (d.endpoint, d.session_name) == key
    )
    b.outbox.record_attempts([AttemptRecord(y, ok(T0 + 1), Retry(at=T0 + 10_000))])
    free: dict[str, tuple[int, int]] = {}

    def rows_free(c: Any) -> None:
        # The writer waits for the key: none of the queue's rows may be locked by it.
        for table in ("deliveries", "outbox_heads"):
            where = f"FROM {table} WHERE endpoint = ? AND session_name = ?"
            total = c.execute(f"SELECT COUNT(*) AS n {where}", key).fetchone()["n"]
            unlocked = c.execute(
                f"SELECT COUNT(*) AS n FROM (SELECT 1 {where} FOR UPDATE SKIP LOCKED) AS r", key
            ).fetchone()["n"]
            free[table] = (unlocked, total)

    queue_keys_held_while_waiting(a, key, lambda: QUEUE_WRITERS[writer](b, y), rows_free)
    assert free == {"deliveries": (2, 2), "outbox_heads": (1, 1)}, (
        f"{writer} locked rows of the queue before its key"
    )
    heads_are_exact(a)


@pytest.mark.parametrize("per_statement", [postgres.KEYS_PER_LOCK, 1])
def test_a_replay_takes_its_queues_keys_in_key_order(
    stores: tuple[PostgresStore, PostgresStore],
    per_statement: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replay inserts deliveries in event order, across sessions; their queues' keys are
    taken first, in key order (a recording replica's order), not as the inserts meet them:
    while a rival holds an earlier key, the replay holds no later one (the keys locked in
    one statement or in several, as a replay of many sessions does)."""
    monkeypatch.setattr(postgres, "KEYS_PER_LOCK", per_statement)
    a, b = stores
    ingest_page(a, 2, 0, 1)  # session 2's event first in event order...
    ingest_page(a, 1, 0, 1)  # ...then session 1's
    spec = EndpointSpec("api", "http://127.0.0.1:9/", ("*",), {}, None, {})
    a.endpoints.create_endpoint(spec, "whsec_" + "A" * 32)  # created after: nothing queued
    held = queue_keys_held_while_waiting(
        a, ("api", session(1).name), lambda: b.operator.replay("api", since=0.0)
    )
    assert held == 0, "the replay held a later queue's key while it waited for an earlier one"
    assert a.outbox.pending_count("api") == 2
    heads_are_exact(a)


def test_an_ingest_takes_its_queues_keys_in_key_order(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """A page whose first event goes to endpoint two only and whose second to one and two:
    the ingest takes (one, s) before (two, s), a recording replica's order, not the order
    its events meet the queues."""
    a, b = stores
    a.endpoints.sync_endpoints([Ep("one", events=("activity.agent_messaged",)), Ep("two")])
    s = session(1)
    acts = [
        store_activity(1, 0),  # progress: to two only
        store_activity(1, 1, agentMessaged={"agentMessage": "done"}),  # to one and two
    ]

    def ingest() -> None:
        b.ingest.upsert_session(s, baseline=False)
        evs = [events.activity_event(s, x, max_media_bytes=1000) for x in acts]
        b.ingest.ingest_activities(s.name, acts, evs, True)

    held = queue_keys_held_while_waiting(a, ("one", s.name), ingest)
    assert held == 0, "the ingest held (two, s) while it waited for (one, s)"
    assert (a.outbox.pending_count("one"), a.outbox.pending_count("two")) == (1, 2)
    heads_are_exact(a)


#: Writers over many queues, on replica ``b``, of the queues ("api", sessions 1 to 3), each
#: with one failed delivery (none for the replay: "api" is created after the ingest), and
#: what each has done to a queue once committed.
MANY_QUEUE_WRITERS: dict[str, tuple[Callable[[PostgresStore], object], str]] = {
    "recover": (lambda b: b.requeue.recover("api", 0.0), "status = 'pending'"),
    "due now": (lambda b: b.requeue.due_now("api"), f"next_attempt_at < {T0 + 10_000}"),
    "delete the endpoint": (
        lambda b: b.endpoints.delete_endpoint("api", "gone"),
        "status = 'dead'",
    ),
    "replay": (lambda b: b.operator.replay("api", since=0.0), "replayed = 1"),
}


@pytest.mark.parametrize("writer", sorted(MANY_QUEUE_WRITERS))
def test_a_write_over_many_queues_commits_them_in_batches(
    stores: tuple[PostgresStore, PostgresStore], writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each queue's key lock lasts to the end of its transaction, and PostgreSQL's lock
    table holds some ten thousand: a write over more queues commits a batch of them at a
    time (here 2). While the third queue's key is held by a rival, the first two are
    committed already."""
    monkeypatch.setattr(dialect, "QUEUES_PER_TX", 2)
    a, b = stores
    act, done = MANY_QUEUE_WRITERS[writer]
    spec = EndpointSpec("api", "http://127.0.0.1:9/", ("*",), {}, None, {})
    if writer != "replay":
        a.endpoints.create_endpoint(spec, "whsec_" + "A" * 32)
    for n in (1, 2, 3):
        ingest_page(a, n, 0, 1)
    if writer == "replay":
        a.endpoints.create_endpoint(spec, "whsec_" + "A" * 32)
    else:
        ids = [
            r["id"] for r in a.db.conn.execute("SELECT id FROM deliveries WHERE endpoint = 'api'")
        ]
        b.outbox.record_attempts(
            [AttemptRecord(i, ok(T0 + 1), Retry(at=T0 + 10_000)) for i in sorted(ids)]
        )
    first_two = (session(1).name, session(2).name)
    seen: list[int] = []

    def committed(c: Any) -> None:
        seen.append(
            c.execute(
                f"SELECT COUNT(*) AS n FROM deliveries WHERE endpoint = 'api' AND {done} "
                "AND session_name IN (?, ?)",
                first_two,
            ).fetchone()["n"]
        )

    held = queue_keys_held_while_waiting(a, ("api", session(3).name), lambda: act(b), committed)
    assert seen == [2], f"{writer}: the first batch was not committed while the last waited"
    assert held == 0
    heads_are_exact(a)
