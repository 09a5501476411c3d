"""The lease protocol of replicas sharing one store: claims on outbox heads, session polls
and named leases; heartbeats, expiry and takeover, clean release; one request budget.

Two store handles on one database, each registered as a replica, play two relays (on
SQLite: two connections to one file, which is what the protocol sees of two processes).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from sessionhook.api import RetryPolicy
from sessionhook.api.client import SessionsClient
from sessionhook.api.models import Session
from sessionhook.cli import cli
from sessionhook.emulator.app import create_app
from sessionhook.relay.delivery.dispatcher import DeliverySettings, Dispatcher
from sessionhook.relay.domain import replica
from sessionhook.relay.domain.retry import Delivered, Retry
from sessionhook.relay.domain.rows import ReplicaRow
from sessionhook.relay.polling import Poller, PollSettings
from sessionhook.relay.polling.lease import PollerLease
from sessionhook.relay.polling.state import PollState
from sessionhook.relay.store import (
    AsyncStore,
    AttemptRecord,
    EndpointQueries,
    Leases,
    PostgresStore,
    Store,
    notify,
)
from sessionhook.relay.telemetry.metrics import Metrics
from tests.support.backends import Backend
from tests.support.backlog import fill, ok
from tests.support.clock import T0, Clock
from tests.support.dispatch_rig import SECRET, dispatch_config, seed_session, seed_sessions
from tests.support.receiver import Receiver
from tests.support.store_rows import Ep

pytestmark = pytest.mark.app

LEASE = 10.0


@pytest.fixture
def pair(backend: Backend) -> Iterator[tuple[Store, Store]]:
    """Two replicas, ``a`` and ``b``, on one store (each engine) with 3 sessions x 2
    deliveries."""
    with backend.open(clock=Clock()) as a, backend.open(clock=Clock()) as b:
        a.endpoints.sync_endpoints([Ep("ep")])
        fill(a, 3, 2)
        a.leases.register_replica("aaaa", host="h1", pid=1, now=T0, lease=LEASE)
        b.leases.register_replica("bbbb", host="h2", pid=2, now=T0, lease=LEASE)
        yield a, b


def keys(due: list) -> set[tuple[str, str]]:  # type: ignore[type-arg]
    return {d.key for d in due}


# --------------------------------------------------------------------------- deliveries


def test_a_claimed_head_is_not_handed_to_another_replica(pair: tuple[Store, Store]) -> None:
    a, b = pair
    first = a.outbox.due_deliveries(T0, 2)
    assert len(first) == 2
    rest = b.outbox.due_deliveries(T0, 10)
    # b gets the third session only: the claimed heads are a's, and each key's second
    # delivery waits behind its head (one in flight per key, across replicas).
    assert len(rest) == 1
    assert not keys(first) & keys(rest)
    claims = a.leases.delivery_claims(T0)
    assert {claims[d.id][0] for d in first} == {"aaaa"}
    assert {claims[d.id][0] for d in rest} == {"bbbb"}
    assert all(at == T0 for _, at in claims.values())
    assert a.leases.delivery_claims(T0 + LEASE + 1) == {}  # both silent since: no live claim


def test_recording_an_attempt_releases_the_claim_and_the_next_goes_anywhere(
    pair: tuple[Store, Store],
) -> None:
    a, b = pair
    (head,) = a.outbox.due_deliveries(T0, 1)
    assert b.outbox.due_deliveries(T0, 10) and head.key not in keys(b.outbox.due_deliveries(T0, 10))
    a.outbox.record_attempts([AttemptRecord(head.id, ok(), Delivered())])
    assert head.id not in a.leases.delivery_claims(T0)
    # The key's next delivery (a later id) is free for any replica, in order.
    after = b.outbox.due_deliveries(T0 + 1, 10)
    same_key = [d for d in after if d.key == head.key]
    assert len(same_key) == 1 and same_key[0].id > head.id


def test_a_retry_keeps_order_and_frees_the_head(pair: tuple[Store, Store]) -> None:
    a, b = pair
    (head,) = a.outbox.due_deliveries(T0, 1)
    a.outbox.record_attempts([AttemptRecord(head.id, ok(), Retry(at=T0 + 5))])
    # Not due yet for anyone, and the key's later delivery never overtakes it.
    assert head.key not in keys(b.outbox.due_deliveries(T0 + 1, 10))
    again = [d for d in b.outbox.due_deliveries(T0 + 6, 10) if d.key == head.key]
    assert [d.id for d in again] == [head.id]


def test_a_dead_replicas_claims_are_taken_over_when_they_expire(
    pair: tuple[Store, Store],
) -> None:
    a, b = pair
    mine = a.outbox.due_deliveries(T0, 10)
    assert len(mine) == 3
    assert b.outbox.due_deliveries(T0 + LEASE - 0.1, 10) == []  # a is silent, its lease holds
    b.leases.heartbeat_replica(T0 + LEASE)  # b is alive
    taken = b.outbox.due_deliveries(T0 + LEASE + 0.1, 10)  # expired: b takes every head over
    assert {d.id for d in taken} == {d.id for d in mine}
    assert {owner for owner, _ in b.leases.delivery_claims(T0 + LEASE + 0.1).values()} == {"bbbb"}


def test_a_heartbeat_extends_every_claim(pair: tuple[Store, Store]) -> None:
    a, b = pair
    a.outbox.due_deliveries(T0, 10)
    a.leases.claim_session_poll("sessions/0", T0)
    assert a.leases.acquire_lease("poller:default", T0)
    a.leases.heartbeat_replica(T0 + LEASE - 1)
    later = T0 + LEASE + 1  # past the first expiry, within the extended one
    assert b.outbox.due_deliveries(later, 10) == []
    assert not b.leases.claim_session_poll("sessions/0", later)
    assert not b.leases.acquire_lease("poller:default", later)
    assert len(a.leases.delivery_claims(later)) == 3  # alive, so its claims are live
    assert a.leases.delivery_claims(T0 + 2 * LEASE) == {}  # silent since its heartbeat


def test_unstarted_deliveries_go_back(pair: tuple[Store, Store]) -> None:
    a, b = pair
    handed = a.outbox.due_deliveries(T0, 10)
    a.leases.release_delivery_claims([handed[0].key])
    assert keys(b.outbox.due_deliveries(T0, 10)) == {handed[0].key}


def test_own_claims_are_handed_out_again_to_their_owner(pair: tuple[Store, Store]) -> None:
    """A head a replica claimed and did not start (rate limit, full slots) is its own to
    start next round; the in-flight ones are excluded by ``busy``."""
    a, _ = pair
    first = a.outbox.due_deliveries(T0, 10)
    again = a.outbox.due_deliveries(T0 + 0.5, 10, busy={first[0].key})
    assert keys(again) == keys(first) - {first[0].key}


def test_a_clean_stop_releases_everything_at_once(pair: tuple[Store, Store]) -> None:
    a, b = pair
    a.outbox.due_deliveries(T0, 10)
    a.leases.claim_session_poll("sessions/1", T0)
    a.leases.acquire_lease("poller:default", T0)
    a.leases.retire_replica(T0 + 1)
    assert len(b.outbox.due_deliveries(T0 + 1, 10)) == 3
    assert b.leases.claim_session_poll("sessions/1", T0 + 1)
    assert b.leases.acquire_lease("poller:default", T0 + 1)
    (row,) = [r for r in b.leases.replicas() if r.id == "aaaa"]
    assert row.stopped_at == T0 + 1 and row.deliveries == 0 and row.leases == ()


def test_an_unregistered_handle_reads_without_claiming_and_skips_live_claims(
    backend: Backend, pair: tuple[Store, Store]
) -> None:
    a, _ = pair
    mine = a.outbox.due_deliveries(T0, 1)
    with backend.open(clock=Clock()) as reader:
        seen = reader.outbox.due_deliveries(T0, 10)
        assert mine[0].key not in keys(seen)
        assert len(seen) == 2
        assert len(reader.outbox.due_deliveries(T0, 10)) == 2  # nothing was claimed
        assert reader.leases.claim_session_poll("sessions/0", T0)  # alone: always may
    assert len(a.leases.delivery_claims(T0)) == 1


# --------------------------------------------------------------------------- polls, leases


def test_one_replica_polls_a_session_at_a_time(pair: tuple[Store, Store]) -> None:
    a, b = pair
    assert a.leases.claim_session_poll("sessions/0", T0)
    assert a.leases.claim_session_poll("sessions/0", T0 + 1)  # ours already
    assert not b.leases.claim_session_poll("sessions/0", T0 + 1)
    assert b.leases.claim_session_poll("sessions/1", T0 + 1)  # another session: free
    a.leases.release_session_poll("sessions/0")
    assert b.leases.claim_session_poll("sessions/0", T0 + 2)
    assert not a.leases.claim_session_poll("sessions/0", T0 + 2)
    assert a.leases.claim_session_poll("sessions/0", T0 + 2 + LEASE + 0.1)  # b went silent


def test_a_named_lease_has_one_holder_and_moves_when_it_expires(
    pair: tuple[Store, Store],
) -> None:
    a, b = pair
    assert b.leases.lease_expires_at("poller:default") is None  # nobody holds it
    assert a.leases.acquire_lease("poller:default", T0)
    assert not b.leases.acquire_lease("poller:default", T0 + 1)
    assert b.leases.lease_expires_at("poller:default") == T0 + LEASE  # a's heartbeat + lease
    a.leases.heartbeat_replica(T0 + 5)  # the lease lives as long as its holder
    assert b.leases.lease_expires_at("poller:default") == T0 + 5 + LEASE
    assert a.leases.acquire_lease("poller:default", T0 + 5)  # still a's
    b.leases.heartbeat_replica(T0 + 5 + LEASE)
    assert not b.leases.acquire_lease("poller:default", T0 + 5 + LEASE - 0.1)
    assert b.leases.acquire_lease("poller:default", T0 + 5 + LEASE + 0.1)  # a went silent
    assert not a.leases.acquire_lease("poller:default", T0 + 5 + LEASE + 0.2)
    (lease,) = a.leases.leases()
    assert (lease.owner, lease.acquired_at) == ("bbbb", T0 + 5 + LEASE + 0.1)
    b.leases.retire_replica(T0 + 20 + LEASE)  # a clean stop: nobody holds it any more
    assert a.leases.lease_expires_at("poller:default") is None
    assert a.leases.leases() == []


def test_replicas_share_one_request_budget(pair: tuple[Store, Store]) -> None:
    a, b = pair
    granted = 0
    for i in range(10):
        for handle in (a, b):
            got, _wait = handle.economy.take_budget("default", T0 + i * 0.1, 12, count=5)
            granted += got
    assert granted == 12


# --------------------------------------------------------------------------- operations


def test_replicas_show_what_each_holds(pair: tuple[Store, Store]) -> None:
    a, b = pair
    a.outbox.due_deliveries(T0, 2)
    b.leases.claim_session_poll("sessions/2", T0)
    b.leases.acquire_lease("poller:default", T0)
    rows = {r.id: r for r in a.leases.replicas()}
    assert (rows["aaaa"].host, rows["aaaa"].pid, rows["aaaa"].deliveries) == ("h1", 1, 2)
    assert (rows["bbbb"].polls, rows["bbbb"].leases) == (1, ("poller:default",))
    assert rows["aaaa"].alive(T0 + LEASE) and not rows["aaaa"].alive(T0 + LEASE + 1)
    assert a.leases.endpoint_claims(T0) == {"ep": {"aaaa": 2}}
    assert a.leases.endpoint_claims(T0 + LEASE + 1) == {}
    metrics = Metrics()
    metrics.refresh_replicas(rows.values(), T0 + 1)
    text = metrics.render().decode()
    assert "sessionhook_replicas_alive 2.0" in text
    assert 'sessionhook_replica_claims{kind="delivery",replica="aaaa"} 2.0' in text
    assert 'sessionhook_lease_held{lease="poller:default",replica="bbbb"} 1.0' in text
    metrics.refresh_replicas(rows.values(), T0 + LEASE + 1)
    assert "sessionhook_replicas_alive 0.0" in metrics.render().decode()


def test_a_replica_gone_for_a_day_is_forgotten(tmp_path: Path) -> None:
    with Store.open(tmp_path / "r.db", clock=Clock()) as s:
        s.leases.register_replica("old", host="h", pid=1, now=T0, lease=LEASE)
        s.leases.register_replica("new", host="h", pid=2, now=T0 + 3600, lease=LEASE)
        assert [r.id for r in s.leases.replicas()] == ["old", "new"]
        s.leases.register_replica("newer", host="h", pid=3, now=T0 + 25 * 3600, lease=LEASE)
        assert [r.id for r in s.leases.replicas()] == ["new", "newer"]


def test_lease_arithmetic() -> None:
    assert replica.heartbeat_interval(15.0) == 5.0
    assert not replica.heartbeat_late(100.0, 115.0, 15.0)
    assert replica.heartbeat_late(100.0, 115.5, 15.0)
    assert replica.replica_health(100.0, 15.0, None, 110.0) == "alive"
    assert replica.replica_health(100.0, 15.0, None, 116.0) == "dead"
    assert replica.replica_health(100.0, 15.0, 105.0, 106.0) == "stopped"
    assert replica.poller_lease("acme") == "poller:acme"
    me = replica.Replica.current()
    assert len(me.id) == 12 and me.label.startswith(me.id + "@")
    assert replica.Replica.current().id != me.id


# --------------------------------------------------------------------------- dispatchers


@pytest.mark.anyio
async def test_two_dispatchers_share_the_outbox_one_in_flight_per_session(
    tmp_path: Path,
) -> None:
    """Two replicas' dispatchers on one store and one consumer: every event once, each
    session in order, never two of a session at the consumer at once, both did work."""
    receiver = Receiver(SECRET, delay=0.02)
    config = dispatch_config(concurrency=3)
    stores = [await AsyncStore.open(tmp_path / "relay.db") for _ in range(2)]
    try:
        await stores[0].run(EndpointQueries.sync_endpoints, config.endpoints)
        expected = await seed_sessions(stores[0], sessions=6)
        for n, store in enumerate(stores):
            await store.run(
                Leases.register_replica, f"r{n}", host="h", pid=n, now=time.time(), lease=30
            )
        http = httpx.AsyncClient(transport=httpx.ASGITransport(receiver.app))
        metrics = [Metrics(), Metrics()]
        dispatchers = [
            Dispatcher(s, http, DeliverySettings.from_config(config), metrics=m)
            for s, m in zip(stores, metrics, strict=True)
        ]
        want = {i for ids in expected.values() for i in ids}
        async with anyio.create_task_group() as tg:
            for d in dispatchers:
                tg.start_soon(d.run)
            await receiver.wait_for(lambda _: receiver.delivered_ids() == want, within=20)
            tg.cancel_scope.cancel()
        await http.aclose()
    finally:
        for store in stores:
            await store.close()
    assert receiver.rejected == []
    by_session = {s: [a.event_id for a in arr] for s, arr in receiver.by_session().items()}
    assert by_session == expected  # once each, in order
    assert receiver.max_in_flight_per_session == 1
    sent = [
        sum(
            s.value
            for family in text_string_to_metric_families(m.render().decode())
            for s in family.samples
            if s.name == "sessionhook_deliveries_total"
        )
        for m in metrics
    ]
    assert all(n > 0 for n in sent), sent
    assert sum(sent) == len(want)


async def _replica_stores(
    tmp_path: Path, lease: float, registered_at: float, activities: int
) -> tuple[list[AsyncStore], list[str]]:
    """Two replicas ``r0`` and ``r1`` on one store, registered at ``registered_at`` with
    ``lease``, and one session's ``activities`` queued for delivery (their event ids)."""
    stores = [await AsyncStore.open(tmp_path / "relay.db") for _ in range(2)]
    await stores[0].run(EndpointQueries.sync_endpoints, dispatch_config().endpoints)
    session = Session(name="sessions/1000", state="IN_PROGRESS", title="S")
    expected = await seed_session(stores[0], session, activities)
    for n, store in enumerate(stores):
        await store.run(
            Leases.register_replica, f"r{n}", host="h", pid=n, now=registered_at, lease=lease
        )
    return stores, expected


@pytest.mark.anyio
async def test_a_replica_whose_heartbeat_is_late_starts_no_post_until_one_commits(
    tmp_path: Path,
) -> None:
    """Its claims may pass to a rival any moment: nothing starts (one line says why) until a
    heartbeat commits; then it sends."""
    receiver = Receiver(SECRET)
    stores, expected = await _replica_stores(
        tmp_path, lease=3.0, registered_at=time.time() - 2.5, activities=3
    )
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(receiver.app)) as http:
            late = Dispatcher(stores[0], http, DeliverySettings.from_config(dispatch_config()))
            with capture_logs() as logs:
                assert await late.run_until_idle() == 0
            assert receiver.arrivals == []
            assert [e["event"] for e in logs] == ["delivery.fence_closed"]
            assert await stores[0].run(Leases.heartbeat_replica, time.time())
            assert late.fence.renewed()  # it was closed: the dispatcher is woken
            with capture_logs() as logs:
                assert await late.run_until_idle() == len(expected)
            assert logs[0]["event"] == "delivery.fence_opened"
        assert [a.event_id for a in receiver.arrivals] == expected
    finally:
        for store in stores:
            await store.close()


@pytest.mark.anyio
async def test_a_stalled_replicas_post_is_cut_before_a_rival_takes_its_claim_over(
    tmp_path: Path,
) -> None:
    """The replicas' kill -9 black box once saw two requests of one session at once: a
    replica whose heartbeats came late was still posting when a rival took the queue's head
    over. r0 claims and posts, then never heartbeats again; its POST is cut a heartbeat
    interval before its claims lapse, and r1 (heartbeating) sends the delivery after
    them: one request of the session at a time, the same webhook-id, recorded once."""
    lease = 0.6
    receiver = Receiver(SECRET, delay=1.0)
    # One delivery: the session's later ones would wait behind it anyway.
    stores, (first,) = await _replica_stores(
        tmp_path, lease=lease, registered_at=time.time(), activities=1
    )
    settings = DeliverySettings.from_config(dispatch_config())
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(receiver.app)) as http:
            stalled = Dispatcher(stores[0], http, settings)
            rival = Dispatcher(stores[1], http, settings, max_wait=0.05)

            async def heartbeats() -> None:  # r1's, as the daemon's heartbeat task makes them
                while True:
                    await stores[1].run(Leases.heartbeat_replica, time.time())
                    rival.fence.renewed()
                    await anyio.sleep(lease / 6)

            with capture_logs() as logs:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stalled.run)
                    await receiver.wait_for(lambda r: r.in_flight == 1, within=10)
                    tg.start_soon(heartbeats)
                    tg.start_soon(rival.run)
                    await receiver.wait_for(lambda r: first in r.delivered_ids(), within=10)
                    await rival.drain()  # its attempt recorded
                    tg.cancel_scope.cancel()
        (row,) = stores[1].store.operator.list_deliveries()
        attempts = stores[1].store.operator.list_attempts(row.id)
    finally:
        for store in stores:
            await store.close()
    assert receiver.max_in_flight_per_session == 1, "two requests of one session at once"
    cut = [e for e in logs if e["event"] == "delivery.cut"]
    assert [e["event_id"] for e in cut] == [first]
    assert [a.event_id for a in receiver.arrivals] == [first]  # the cut one never answered
    assert [a.status_code for a in attempts] == [200]  # the cut POST is not an attempt


# --------------------------------------------------------------------------- pollers


@pytest.mark.anyio
async def test_one_replica_polls_an_account_and_another_takes_over_when_it_dies(
    tmp_path: Path,
) -> None:
    """Two replicas' pollers of one account: one holds the poller lease and lists the
    sessions, the other stands by (ready, no request); the holder dies without a word
    (its lease is left to expire): the other takes over and polls."""
    lease = 1.5
    emulator = create_app(api_keys=("k",), step_delay=30.0, seed=3)
    lists = {"a": 0, "b": 0}
    b_listed = anyio.Event()

    def counting(who: str) -> httpx.AsyncBaseTransport:
        inner = httpx.ASGITransport(emulator)

        class Count(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                if request.url.path.endswith("/sessions"):
                    lists[who] += 1
                    if who == "b":
                        b_listed.set()
                return await inner.handle_async_request(request)

        return Count()

    async with httpx.AsyncClient(transport=httpx.ASGITransport(emulator)) as api_http:
        api = SessionsClient(api_http, base_url="http://emu.test", api_key="k")
        await api.create_session("Task")
        stores, pollers, https = [], [], []
        for who in ("a", "b"):
            store = await AsyncStore.open(tmp_path / "relay.db")
            await store.run(
                Leases.register_replica, who, host="h", pid=1, now=time.time(), lease=lease
            )
            http = httpx.AsyncClient(transport=counting(who))
            client = SessionsClient(
                http, base_url="http://emu.test", api_key="k", retry=RetryPolicy(max_attempts=1)
            )
            settings = PollSettings(discovery_interval=0.2, mode="timer")
            stores.append(store)
            https.append(http)
            pollers.append(Poller(client, store, settings))
        try:
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    scopes = [anyio.CancelScope(), anyio.CancelScope()]

                    async def run(n: int) -> None:
                        with scopes[n]:
                            await pollers[n].run()

                    tg.start_soon(run, 0)
                    await pollers[0].first_pass_done.wait()
                    tg.start_soon(run, 1)
                    await pollers[1].first_pass_done.wait()  # standing by: ready too
                    await anyio.sleep(1.0)
                    assert lists["a"] >= 2 and lists["b"] == 0
                    holders = {r.owner for r in stores[1].store.leases.leases()}
                    assert holders == {"a"}
                    scopes[0].cancel()  # "kill -9": nothing released, the lease expires
                    await b_listed.wait()
                    assert {r.owner for r in stores[1].store.leases.leases()} == {"b"}
                    tg.cancel_scope.cancel()
        finally:
            for http in https:
                await http.aclose()
            for store in stores:
                await store.close()


@pytest.mark.anyio
async def test_a_standby_reports_its_own_accounts_last_good_pass(tmp_path: Path) -> None:
    """A standby's readiness follows the holder's discovery of ITS account: another
    account's newer good pass is not taken for it."""
    now = time.time()
    holder = Store.open(tmp_path / "relay.db")
    holder.leases.register_replica("holder", host="h", pid=1, now=now, lease=60.0)
    assert holder.leases.acquire_lease(replica.poller_lease("team-b"), now)
    holder.economy.mark_poll(True, now - 30, account="team-b")
    holder.economy.mark_poll(True, now - 1, account="team-a")
    store = await AsyncStore.open(tmp_path / "relay.db")
    await store.run(Leases.register_replica, "me", host="h", pid=2, now=now, lease=60.0)
    state = PollState(
        settings=PollSettings(),
        account="team-b",
        client=None,  # type: ignore[arg-type]  # a standby reads no upstream
        store=store,
        metrics=None,
        clock=time.time,
        monotonic=time.monotonic,
        heartbeat=0.0,
    )
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(PollerLease(state).standby)
                while state.last_success is None:  # noqa: ASYNC110 (a field the task sets)
                    await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
        assert state.last_success == now - 30
    finally:
        await store.close()
        holder.close()


# --------------------------------------------------------------------------- operator commands


def test_status_deliveries_and_endpoints_show_which_replica_holds_what(tmp_path: Path) -> None:
    path = tmp_path / "relay.db"
    now = time.time()
    with Store.open(path, clock=Clock(now)) as a, Store.open(path, clock=Clock(now)) as b:
        a.endpoints.sync_endpoints([Ep("ep")])
        fill(a, 2, 2)
        a.leases.register_replica("aaaa", host="h1", pid=11, now=now, lease=LEASE)
        b.leases.register_replica("bbbb", host="h2", pid=22, now=now, lease=LEASE)
        (mine,) = a.outbox.due_deliveries(now, 1)
        b.leases.acquire_lease("poller:default", now)
        b.leases.retire_replica(now)  # a clean stop: shown as stopped, holding nothing
    runner = CliRunner()

    status = runner.invoke(cli, ["status", "--db", str(path)])
    assert status.exit_code == 0, status.output
    (line,) = [x for x in status.output.splitlines() if x.startswith("replicas")]
    assert "1 running: aaaa@h1:11 (heartbeat" in line and "1 in flight, 0 polls" in line
    assert "(1 stopped, 0 dead in the last day)" in line
    data = json.loads(runner.invoke(cli, ["status", "--db", str(path), "--json"]).output)
    health = {r["id"]: (r["health"], r["deliveries"]) for r in data["replicas"]}
    assert health == {"aaaa": ("alive", 1), "bbbb": ("stopped", 0)}

    listed = runner.invoke(cli, ["deliveries", "--db", str(path)])
    (row,) = [x for x in listed.output.splitlines() if x.split()[0] == str(mine.id)]
    assert "in flight on aaaa" in row
    rows = json.loads(runner.invoke(cli, ["deliveries", "--db", str(path), "--json"]).output)
    assert {r["id"]: r["claimed_by"] for r in rows if r["claimed_by"]} == {mine.id: "aaaa"}

    endpoints = runner.invoke(cli, ["endpoints", "list", "--db", str(path)])
    assert "IN FLIGHT" in endpoints.output and "1 on aaaa" in endpoints.output
    listed_json = json.loads(
        runner.invoke(cli, ["endpoints", "list", "--db", str(path), "--json"]).output
    )
    assert listed_json[0]["in_flight"] == {"aaaa": 1}


def test_dead_replicas_are_known_without_waiting_when_certain() -> None:
    me = replica.Replica(id="me", host="h1", pid=10)
    rows = [
        ReplicaRow("me", "h1", 10, T0, T0, LEASE, None, 0, 0, ()),
        ReplicaRow("gone", "h1", 11, T0, T0, LEASE, None, 0, 0, ()),  # pid 11 is gone
        ReplicaRow("alive", "h1", 12, T0, T0, LEASE, None, 0, 0, ()),
        ReplicaRow("far", "h2", 11, T0, T0, LEASE, None, 0, 0, ()),  # another host
        ReplicaRow("done", "h1", 11, T0, T0, LEASE, T0 + 1, 0, 0, ()),  # stopped already
    ]
    alive = {12}.__contains__
    assert replica.dead_replicas(rows, me, alone=False, pid_alive=alive) == ["gone"]
    assert replica.dead_replicas(rows, me, alone=True, pid_alive=alive) == [
        "gone",
        "alive",
        "far",
    ]
    assert replica.pid_alive(os.getpid())


def test_reaping_frees_a_dead_replicas_claims_at_once(pair: tuple[Store, Store]) -> None:
    a, b = pair
    a.outbox.due_deliveries(T0, 10)
    a.leases.claim_session_poll("sessions/0", T0)
    a.leases.acquire_lease("poller:default", T0)
    assert b.leases.reap_replicas(["aaaa", "bbbb"], T0 + 1) == 1  # never itself
    assert len(b.outbox.due_deliveries(T0 + 1, 10)) == 3
    assert b.leases.claim_session_poll("sessions/0", T0 + 1)
    assert b.leases.acquire_lease("poller:default", T0 + 1)
    assert {r.id: r.stopped_at for r in b.leases.replicas()} == {"aaaa": T0 + 1, "bbbb": None}


@pytest.mark.anyio
async def test_postgresql_notifies_every_replica_when_deliveries_are_enqueued(
    pg_url: str,
) -> None:
    """The outbox trigger notifies on commit; a listener (every replica's daemon has one)
    hears it: its dispatcher wakes without waiting for its timer."""
    heard = anyio.Event()
    listening = anyio.Event()
    with PostgresStore.open(pg_url, clock=Clock()) as writer:
        writer.endpoints.sync_endpoints([Ep("ep")])
        async with anyio.create_task_group() as tg:
            calls = 0

            def on_notify() -> None:
                nonlocal calls
                calls += 1
                if calls > 1:  # the first call is the catch-up when LISTEN is in place
                    heard.set()

            tg.start_soon(lambda: notify.listen(pg_url, on_notify, ready=listening.set))
            with anyio.fail_after(20):
                await listening.wait()
                assert not heard.is_set()
                await anyio.to_thread.run_sync(lambda: fill(writer, 1, 2))
                await heard.wait()
            tg.cancel_scope.cancel()
