"""Retry now and recover (the store and the operator layer, both backends): the same rows,
so the same webhook-id and body; each session's deliveries still go out in order; and an
answer that says why when nothing was queued (replay's too)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from sessionhook.relay import ops as operator
from sessionhook.relay.domain.retry import Dead, Delivered, Retry
from sessionhook.relay.domain.rows import DeliveryRow
from sessionhook.relay.ops import OperatorError
from sessionhook.relay.ops.requeue import recover, retry
from sessionhook.relay.store import StoreCore
from tests.support.backends import Backend
from tests.support.requeue_rows import ACT0, Ep, failure, fill

pytestmark = pytest.mark.app

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def opened(backend: Backend) -> Iterator[tuple[StoreCore, Clock]]:
    clock = Clock()
    store = backend.open(clock=clock)
    try:
        store.endpoints.sync_endpoints([Ep("ci-bot")])
        yield store, clock
    finally:
        store.close()


def _rows(store: StoreCore, session: str) -> list[DeliveryRow]:
    return sorted(store.operator.list_deliveries(session=session, limit=100), key=lambda d: d.id)


def _due(store: StoreCore, now: float) -> list[int]:
    return [d.id for d in store.outbox.due_deliveries(now, 100)]


def test_retry_reopens_a_dead_delivery_first_in_its_session_same_event(
    opened: tuple[StoreCore, Clock],
) -> None:
    store, clock = opened
    fill(store, 1, 3)
    first, second, third = _rows(store, "sessions/s0")
    store.outbox.record_attempt(first.id, failure(T0), Dead())
    assert _due(store, T0) == [second.id]  # a dead head no longer blocks its session
    clock.now = T0 + 5
    result = retry(store, first.id)
    assert result.previous == "dead" and result.head is None
    after = store.operator.get_delivery(first.id)
    assert after is not None and after.status == "pending"
    assert after.event_id == first.event_id and after.next_attempt_at == T0 + 5
    # It is its queue's head again: the later ones wait behind it, in order.
    assert _due(store, T0 + 5) == [first.id]
    assert [d.waiting_on for d in _rows(store, "sessions/s0")] == [None, first.id, first.id]
    (due,) = store.outbox.due_deliveries(T0 + 5, 1)
    event = store.operator.get_event(first.event_id)
    assert due.event_id == first.event_id and event is not None and due.body == event.body
    store.outbox.record_attempt(first.id, failure(T0 + 6), Delivered())
    assert _due(store, T0 + 6) == [second.id]
    assert _rows(store, "sessions/s0")[2].waiting_on == second.id == third.id - 1


def test_retry_of_a_delivery_behind_a_failed_head_makes_the_head_due_first(
    opened: tuple[StoreCore, Clock],
) -> None:
    store, clock = opened
    fill(store, 1, 2)
    head, later = _rows(store, "sessions/s0")
    store.outbox.record_attempt(head.id, failure(T0), Retry(at=T0 + 300))
    assert _due(store, T0 + 1) == []  # the issue: everything waits for the head's 300 s
    clock.now = T0 + 2
    result = retry(store, later.id)
    assert result.head == head.id and "after delivery" in result.message
    assert _due(store, T0 + 2) == [head.id]  # the head goes first: the order is kept
    store.outbox.record_attempt(head.id, failure(T0 + 3), Delivered())
    assert _due(store, T0 + 3) == [later.id]


def test_enabling_an_endpoint_again_makes_what_waits_for_it_due_now(
    opened: tuple[StoreCore, Clock],
) -> None:
    store, clock = opened
    store.endpoints.sync_endpoints([Ep("ci-bot"), Ep("chat")])
    fill(store, 2, 2)

    def queue(session: str, endpoint: str) -> list[DeliveryRow]:
        return [d for d in _rows(store, session) if d.endpoint == endpoint]

    def due_to_ci_bot() -> list[int]:
        return sorted(
            d.id for d in store.outbox.due_deliveries(T0 + 5, 100) if d.endpoint == "ci-bot"
        )

    s0_head, _s0_later = queue("sessions/s0", "ci-bot")
    s1_dead, s1_later = queue("sessions/s1", "ci-bot")
    chat_head = queue("sessions/s0", "chat")[0]
    store.outbox.record_attempt(s0_head.id, failure(T0), Retry(at=T0 + 300))
    store.outbox.record_attempt(s1_dead.id, failure(T0), Dead())
    store.outbox.record_attempt(chat_head.id, failure(T0), Retry(at=T0 + 300))
    operator.disable_endpoint(store, "ci-bot", "the consumer is down")
    clock.now = T0 + 5
    assert due_to_ci_bot() == []

    assert operator.enable_endpoint(store, "ci-bot") == 3  # open to it: s0's two, s1's one
    # The retry scheduled while it failed goes now; each session's queue keeps its order.
    assert due_to_ci_bot() == [s0_head.id, s1_later.id]
    got = store.operator.get_delivery(s0_head.id)
    assert got is not None and got.next_attempt_at == T0 + 5
    # Nothing else moved: the dead one stays dead (that is recover's), and the other
    # endpoint keeps its own schedule.
    dead = store.operator.get_delivery(s1_dead.id)
    assert dead is not None and dead.status == "dead"
    chat = store.operator.get_delivery(chat_head.id)
    assert chat is not None and chat.next_attempt_at == T0 + 300


def test_retry_refuses_unknown_and_delivered_deliveries_with_a_hint(
    opened: tuple[StoreCore, Clock],
) -> None:
    store, _ = opened
    fill(store, 1, 1)
    (only,) = _rows(store, "sessions/s0")
    with pytest.raises(OperatorError, match="no delivery 999999"):
        retry(store, 999_999)
    store.outbox.record_attempt(only.id, failure(T0), Delivered())
    with pytest.raises(OperatorError, match="delivered already") as caught:
        retry(store, only.id)
    assert caught.value.hint is not None and only.event_id in caught.value.hint


def test_recover_reopens_failed_and_dead_since_a_time_in_order_and_says_why_not(
    opened: tuple[StoreCore, Clock],
) -> None:
    store, clock = opened
    fill(store, 2, 3)
    for name in ("sessions/s0", "sessions/s1"):
        rows = _rows(store, name)
        store.outbox.record_attempt(rows[0].id, failure(T0), Dead())
        store.outbox.record_attempt(rows[1].id, failure(T0), Dead())
        store.outbox.record_attempt(rows[2].id, failure(T0), Retry(at=T0 + 300))
    before = {d.id: d.event_id for d in store.operator.list_deliveries(limit=100)}
    # Events of second 1 and later: the first event of each session stays dead.
    clock.now = T0 + 10
    result = recover(store, "ci-bot", ACT0 + 1)
    assert result.queued == 4 and result.reason is None
    reopened = {d.id for d in store.operator.list_deliveries(status="pending", limit=100)}
    assert reopened == set(result.ids)
    assert {d.id: d.event_id for d in store.operator.list_deliveries(limit=100)} == before
    due = store.outbox.due_deliveries(T0 + 10, 100)
    heads = sorted(_rows(store, n)[1].id for n in ("sessions/s0", "sessions/s1"))
    assert sorted(d.id for d in due) == heads  # each session's oldest re-opened one first
    assert {d.status for d in store.operator.list_deliveries(status="dead", limit=100)} == {"dead"}
    assert len(store.operator.list_deliveries(status="dead", limit=100)) == 2
    # Nothing left since then: the answer says the rest is older, and how to reach it.
    again = recover(store, "ci-bot", ACT0 + 1)
    assert again.queued == 0 and again.reason is not None
    assert "2 failed or dead deliveries are of events before" in again.reason
    assert "recovered 0 deliveries of ci-bot:" in again.message
    with pytest.raises(OperatorError, match="no endpoint named 'nope'"):
        recover(store, "nope", ACT0)


def test_recover_with_nothing_failed_says_what_is_waiting(
    opened: tuple[StoreCore, Clock],
) -> None:
    store, _ = opened
    result = recover(store, "ci-bot", ACT0)
    assert result.queued == 0 and result.reason is not None
    assert "nothing is waiting" in result.reason
    fill(store, 1, 2)
    result = recover(store, "ci-bot", ACT0)
    assert result.reason is not None and "2 are pending" in result.reason


def test_a_replay_that_queues_nothing_says_why(opened: tuple[StoreCore, Clock]) -> None:
    store, _ = opened
    fill(store, 1, 2)
    # Both events have an open delivery: the "queued 0 deliveries" with no reason.
    result = operator.replay(store, "ci-bot", since=ACT0 - 3600)
    assert result.queued == 0 and result.reason is not None
    assert "on their way to ci-bot already" in result.reason and "recover" in result.reason
    empty = operator.replay(store, "ci-bot", since=ACT0 + 3600)
    assert empty.queued == 0 and empty.reason == "no archived event in that range"
    for d in _rows(store, "sessions/s0"):
        store.outbox.record_attempt(d.id, failure(T0), Delivered())
    assert operator.replay(store, "ci-bot", since=ACT0 - 3600).reason is None


def test_a_retry_keeps_the_claim_of_a_replica_sending_that_session(backend: Backend) -> None:
    with backend.open(clock=Clock()) as a, backend.open(clock=Clock()) as b:
        a.endpoints.sync_endpoints([Ep("ci-bot")])
        fill(a, 1, 2)
        a.leases.register_replica("aaaa", host="h1", pid=1, now=T0, lease=10.0)
        b.leases.register_replica("bbbb", host="h2", pid=2, now=T0, lease=10.0)
        (head,) = a.outbox.due_deliveries(T0, 1)  # a sends it now: the session is a's
        retry(a, head.id)  # an operator's "retry now" meanwhile
        retry(b, _rows(b, "sessions/s0")[1].id)  # ...and on the later one, from b
        assert a.leases.delivery_claims(T0)[head.id][0] == "aaaa"
        assert b.outbox.due_deliveries(T0, 10) == []  # never two replicas on one session


def test_a_retry_waits_for_a_claim_being_taken_and_keeps_it(pg_url: str) -> None:
    """PostgreSQL: a replica claims heads in transactions of its own (row locks, not the
    global write lock). A retry reading the head while that claim is being written waits
    for it and puts it back on the re-derived head, rather than keeping what it read
    before it (which left the queue claimable by a second replica while the first sent)."""
    with Backend("postgresql", pg_url).open(clock=Clock()) as store:
        store.endpoints.sync_endpoints([Ep("ci-bot")])
        fill(store, 1, 2)
        store.leases.register_replica("bbbb", host="h2", pid=2, now=T0, lease=10.0)
        head, later = _rows(store, "sessions/s0")
        retried = threading.Event()

        def retry_later() -> None:
            retry(store, later.id)
            retried.set()

        with psycopg.connect(pg_url) as claimer:  # replica b, mid-claim
            claimer.execute(
                "SELECT 1 FROM outbox_heads WHERE delivery_id = %s FOR UPDATE", (head.id,)
            )
            claimer.execute(
                "UPDATE outbox_heads SET claimed_by = 'bbbb', claimed_at = %s "
                "WHERE delivery_id = %s",
                (T0, head.id),
            )
            worker = threading.Thread(target=retry_later)
            worker.start()
            assert not retried.wait(0.5)  # the operator's retry waits for the claim
            claimer.commit()
        worker.join(timeout=30)
        assert retried.is_set()
        assert store.leases.delivery_claims(T0)[head.id][0] == "bbbb"
