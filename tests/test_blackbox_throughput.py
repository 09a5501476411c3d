"""Black-box tests of what the delivery speed-up (group commits, many attempts in flight)
could break: the real ``sessionhook run`` against the stand-in and the verifying consumer.

* order per (endpoint, session) with 64 attempts in flight over two endpoints;
* kill -9 at arbitrary moments of a busy delivery: nothing lost, no attempt recorded twice,
  at most what was in flight sent again;
* the delivery-log retention prunes old attempts and delivered rows, not the archive.

The store is read with ``sqlite3`` (read-only), as the other black-box tests do.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from typing import Any

import pytest

from tests.support.blackbox_consumer import Consumer
from tests.support.delivery_checks import assert_all_verified, assert_session_order
from tests.support.relay_process import (
    Endpoint,
    Harness,
    Relay,
    assert_clean_exit,
    read_store,
    relay_config,
    wait_until,
)
from tests.support.standin import StandIn
from tests.support.world import preload

pytestmark = pytest.mark.process

SESSIONS = 12
PER_SESSION = 25


def start(harness: Harness, standin: StandIn, label: str, extra: str = "", **config: Any) -> Relay:
    config.setdefault("store", harness.tmp / "relay.db")
    text = relay_config(standin=standin, **config)
    if extra:
        text = text.replace("[store]\n", f"[store]\n{extra}\n", 1)
    return harness.start(label, text, standin.api_key)


def delivered_ids(consumer: Consumer, endpoint: str) -> set[str]:
    return {h.webhook_id for h in consumer.delivered(endpoint)}


def test_order_per_endpoint_and_session_with_64_in_flight(harness: Harness) -> None:
    standin = harness.standin(max_page_size=100)
    order = preload(standin, 24, 12)
    consumer = harness.consumer()
    endpoints = []
    for name in ("one", "two"):
        url, secret = consumer.add_endpoint(name, delay=0.01)
        endpoints.append(Endpoint(name, url, secret))
    relay = start(harness, standin, "busy", endpoints=endpoints, backfill=True, concurrency=64)
    names = {a for acts in order.values() for a in acts}
    wait_until(
        lambda: all(consumer.delivered_activity_names(e.name) >= names for e in endpoints),
        60,
        "every activity at both endpoints",
        harness.diagnostics,
    )
    relay.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert_clean_exit(relay)
    assert consumer.max_in_flight >= 8, "attempts did not run concurrently"
    assert consumer.max_in_flight_per_session == 1, "two requests of one session at once"
    for e in endpoints:
        hits = consumer.hits(e.name)
        assert_all_verified(hits)
        assert_session_order(hits, order)


def test_kill_9_mid_delivery_loses_nothing_and_records_each_attempt_once(
    harness: Harness,
) -> None:
    standin = harness.standin(max_page_size=100)
    order = preload(standin, SESSIONS, PER_SESSION)
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main", delay=0.02)
    store = harness.tmp / "relay.db"
    config: dict[str, Any] = {
        "endpoints": [Endpoint("main", url, secret)],
        "store": store,
        "backfill": True,
        "concurrency": 32,
    }
    total = SESSIONS * (PER_SESSION + 1)  # + session.discovered
    kills = 0
    for n, share in enumerate((0.2, 0.45, 0.7)):
        relay = start(harness, standin, f"killed-{n}", **config)
        target = int(total * share)
        wait_until(
            lambda target=target: len(consumer.hits("main")) >= target,
            40,
            f"{target} requests before kill {n}",
            harness.diagnostics,
        )
        relay.kill()  # SIGKILL in the middle of a busy delivery
        assert relay.returncode == -signal.SIGKILL
        kills += 1
    final = start(harness, standin, "final", **config)
    names = {a for acts in order.values() for a in acts}
    wait_until(
        lambda: (
            consumer.delivered_activity_names("main") >= names
            and len(delivered_ids(consumer, "main")) >= total
        ),
        60,
        "every event delivered after the kills",
        harness.diagnostics,
    )
    wait_until(
        lambda: not read_store(store, "SELECT 1 FROM deliveries WHERE status != 'delivered'"),
        20,
        "the last results committed",
        harness.diagnostics,
    )
    final.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert_clean_exit(final)

    hits = consumer.hits("main")
    assert_all_verified(hits)
    # Nothing lost: every archived event was delivered, exactly one outbox row each.
    event_ids = {r[0] for r in read_store(store, "SELECT id FROM events")}
    assert len(event_ids) == total
    assert delivered_ids(consumer, "main") == event_ids
    per_event = Counter(r[0] for r in read_store(store, "SELECT event_id FROM deliveries"))
    assert set(per_event.values()) == {1}
    # No attempt recorded twice; attempt numbers run 1..n per delivery.
    attempts = read_store(store, "SELECT delivery_id, attempt FROM attempts ORDER BY delivery_id")
    assert len(attempts) == len(set(attempts)), "an attempt was recorded twice"
    numbers: dict[int, list[int]] = {}
    for delivery_id, attempt in attempts:
        numbers.setdefault(delivery_id, []).append(attempt)
    assert all(sorted(n) == list(range(1, len(n) + 1)) for n in numbers.values())
    # Each recorded attempt was a request the consumer saw; the requests never recorded
    # are those in flight (or awaiting their group commit) at a kill: at most 32 each.
    assert len(attempts) <= len(hits)
    assert len(hits) - len(attempts) <= kills * 32, (len(hits), len(attempts))
    resent = sum(n - 1 for n in Counter(h.webhook_id for h in hits).values())
    assert resent <= kills * 32


def test_retention_prunes_the_delivery_log_but_not_the_archive(harness: Harness) -> None:
    standin = harness.standin(max_page_size=100)
    preload(standin, 3, 5)
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    store = harness.tmp / "relay.db"
    config: dict[str, Any] = {"endpoints": [Endpoint("main", url, secret)], "store": store}
    first = start(harness, standin, "keep", backfill=True, **config)
    wait_until(
        lambda: len(delivered_ids(consumer, "main")) >= 18, 30, "delivery", harness.diagnostics
    )
    first.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert_clean_exit(first)
    assert read_store(store, "SELECT COUNT(*) FROM attempts")[0][0] >= 18
    events_before = read_store(store, "SELECT COUNT(*) FROM events")[0][0]
    # Let every row get older than the retention below, however fast the relay restarts
    # (its start-up pass is the only one within the test: the next is 10 min later).
    newest = read_store(
        store,
        "SELECT MAX(t) FROM (SELECT MAX(updated_at) AS t FROM deliveries"
        " UNION ALL SELECT MAX(started_at) FROM attempts)",
    )[0][0]
    time.sleep(max(0.0, newest + 1.5 - time.time()))

    # Restarted with a retention of one second: the start-up pass prunes what is older.
    second = start(harness, standin, "prune", 'delivery_log_retention = "1s"', **config)
    wait_until(
        lambda: read_store(store, "SELECT COUNT(*) FROM deliveries")[0][0] == 0,
        20,
        "the delivered rows pruned",
        harness.diagnostics,
    )
    second.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert_clean_exit(second)
    assert read_store(store, "SELECT COUNT(*) FROM attempts")[0][0] == 0
    assert read_store(store, "SELECT COUNT(*) FROM events")[0][0] == events_before
    assert read_store(store, "SELECT COUNT(*) FROM activities")[0][0] == 15
    assert any(e.get("event") == "store.pruned" for e in second.log_events())
