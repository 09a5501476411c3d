"""Black-box tests of moving up and of replicas: the real ``sessionhook`` commands in
subprocesses against the stand-in and the verifying consumer.

* ``sessionhook store copy``: an archive copied to a new store, then the relay run on the
  copy: nothing delivered before is delivered again, open deliveries go out under the
  same webhook-ids, the source is not touched.
* replicas: three ``sessionhook run`` on one throwaway PostgreSQL database, kill -9 of one
  (restarted) and of another (for good): every activity delivered, none under two ids,
  per-session order at the consumer, duplicates only for what was in flight.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.support.delivery_checks import assert_all_verified, assert_session_order
from tests.support.relay_process import (
    Endpoint,
    Harness,
    assert_clean_exit,
    read_store,
    relay_config,
    run_cli,
    wait_ready,
    wait_until,
)
from tests.support.standin import StandIn
from tests.support.world import preload

pytestmark = pytest.mark.process


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def store_copy(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("store", "copy", *args)


def test_store_copy_then_the_relay_on_the_copy_sends_nothing_twice(harness: Harness) -> None:
    standin = harness.standin(max_page_size=100)
    order = preload(standin, 4, 5)
    consumer = harness.consumer()
    url_a, secret_a = consumer.add_endpoint("a")
    url_b, secret_b = consumer.add_endpoint("b", status=503)  # down: its rows stay open
    source = harness.tmp / "source.db"
    config = {
        "endpoints": [Endpoint("a", url_a, secret_a), Endpoint("b", url_b, secret_b)],
        "backfill": True,
        "retry_delays": (1.0, 1.0, 1.0, 1.0),
    }
    once = harness.relay(standin, "source", "--once", store=source, **config)
    assert once.wait(60) == 0, once.diagnostics()
    events = {r[0] for r in read_store(source, "SELECT id FROM events")}
    assert {h.webhook_id for h in consumer.delivered("a")} == events
    # b refused the head of each session's queue; the rest wait behind it (in order).
    refused = {h.webhook_id for h in consumer.hits("b")}
    assert len(refused) == len(order) and refused < events and not consumer.delivered("b")
    before = digest(source)

    target = harness.tmp / "moved" / "target.db"
    done = store_copy("--from", str(source), "--to", str(target))
    assert done.returncode == 0, done.stderr
    assert "copy: events" in done.stderr and "counts verified" in done.stdout
    assert digest(source) == before, "the copy wrote to its source"
    for table, key in (("events", "seq, id"), ("deliveries", "id, event_id, status")):
        sql = f"SELECT {key} FROM {table} ORDER BY 1"
        assert read_store(target, sql) == read_store(source, sql)

    again = store_copy("--from", str(source), "--to", str(target))
    assert again.returncode == 2
    assert again.stderr.startswith("error: the target is not empty") and "--replace" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1

    consumer.behave("b", status=None)  # back up: the copy's open rows go out now
    relay = harness.relay(standin, "target", store=target, **config)
    wait_until(
        lambda: {h.webhook_id for h in consumer.delivered("b")} == events,
        30,
        "the open deliveries sent from the copy",
        harness.diagnostics,
    )
    assert_clean_exit(relay)
    assert_all_verified(consumer.hits())
    # Nothing delivered before the move is delivered again, nothing twice after it, and
    # no event got a new id (the relay on the copy archived nothing new).
    assert set(Counter(h.webhook_id for h in consumer.delivered("a")).values()) == {1}
    assert set(Counter(h.webhook_id for h in consumer.delivered("b")).values()) == {1}
    assert {r[0] for r in read_store(target, "SELECT id FROM events")} == events
    assert refused <= {h.webhook_id for h in consumer.delivered("b")}  # the same ids
    names = {a for acts in order.values() for a in acts}
    assert consumer.delivered_activity_names("b") == names


def test_store_copy_refuses_a_store_a_running_daemon_holds(harness: Harness) -> None:
    """Issue 20: the copy read a live store without a word. A real daemon on the source:
    one line naming the store and the daemon's pid, exit 2, nothing created; once the
    daemon stopped, the same command copies."""
    standin = harness.standin()
    preload(standin, 2, 2)
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("a")
    source = harness.tmp / "live.db"
    relay = harness.relay(standin, "live", store=source, endpoints=[Endpoint("a", url, secret)])
    pid = relay.proc.pid if relay.proc is not None else -1
    lock = source.with_name(source.name + ".lock")
    wait_until(
        lambda: lock.is_file() and lock.read_text().strip() == str(pid),
        30,
        "the daemon holding its store's lock",
        harness.diagnostics,
    )
    # Its store migrated too (the lock comes first): the copy meets a running daemon, not
    # a store still being created.
    wait_ready(standin, relay)
    target = harness.tmp / "copy" / "target.db"
    refused = store_copy("--from", str(source), "--to", str(target))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        f"error: a daemon is running on the source store {source} (pid {pid}): stop it "
        "first — sudo systemctl stop sessionhook"
    ]
    assert not target.exists() and refused.stdout == ""
    assert_clean_exit(relay)
    done = store_copy("--from", str(source), "--to", str(target))
    assert done.returncode == 0, done.stderr
    assert "counts verified" in done.stdout


# --------------------------------------------------------------------------- replicas


def replica_config(standin: StandIn, url: str, endpoint: Endpoint, lease: float) -> str:
    """The black-box config with the store on PostgreSQL and a short lease."""
    text = relay_config(
        standin=standin,
        store=Path("unused.db"),
        endpoints=[endpoint],
        backfill=True,
        concurrency=4,
        retry_delays=(0.2, 0.5, 1.0, 1.0, 1.0),
    )
    lines = [
        f"url = {json.dumps(url)}\nlease = {lease}" if line.startswith("path = ") else line
        for line in text.splitlines()
    ]
    return "\n".join(lines) + "\n"


def test_replicas_share_the_work_and_survive_kill_9(harness: Harness, pg_url: str) -> None:
    """Three real relays on one PostgreSQL store: every activity delivered, none under two
    webhook-ids, each session in order at the consumer, never two of a session at once;
    one replica killed and restarted, another killed for good (its lease expires):
    duplicates only for what was in flight."""
    standin = harness.standin(max_page_size=50)
    order = preload(standin, 8, 10)
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main", delay=0.05)
    text = replica_config(standin, pg_url, Endpoint("main", url, secret), lease=3.0)
    replicas = []
    for n in range(3):
        replicas.append(harness.start(f"replica-{n}", text, standin.api_key))

    def until_delivered(part: int, what: str) -> set[str]:
        """Until 1/``part`` of the activities so far reached the consumer; their names."""
        names = {a for acts in order.values() for a in acts}
        wait_until(
            lambda: len(consumer.delivered("main")) >= len(names) // part,
            40,
            what,
            harness.diagnostics,
        )
        return names

    until_delivered(4, "a quarter of the activities delivered")
    replicas[0].kill()  # kill -9 mid-run, then restarted at once (its pid is gone: reaped)
    assert replicas[0].returncode == -signal.SIGKILL
    again = harness.start("replica-0b", text, standin.api_key)
    # Running before more work comes: on a loaded machine the others once finished
    # everything while it was still importing (the SIGTERM at the end found no handler).
    wait_until(
        lambda: any(e.get("event") == "relay.ready" for e in again.log_events()),
        40,
        "replica-0b ready",
        harness.diagnostics,
    )

    # More work while they recover, the restarted one included. Which replica claims a
    # queue's head is a race: one round of new work was once taken whole by the two that
    # never stopped, so rounds come until the restarted one has delivered (at most 10).
    def restarted_delivered() -> bool:
        return any(e.get("event") == "delivery.succeeded" for e in again.log_events())

    for _ in range(10):
        for name in order:
            order[name].append(standin.append_activity(name, "progressUpdated")["name"])
        with contextlib.suppress(AssertionError):
            wait_until(restarted_delivered, 3, "a delivery by the restarted replica")
            break
    names = until_delivered(2, "half of the activities delivered")
    replicas[1].kill()  # kill -9 for good: its claims wait for the lease to expire
    wait_until(
        lambda: consumer.delivered_activity_names("main") >= names,
        45,
        "every activity delivered after the kills",
        harness.diagnostics,
    )
    for relay in (replicas[2], again):
        assert_clean_exit(relay)

    hits = consumer.hits("main")
    assert_all_verified(hits)
    assert_session_order(hits, order)
    assert consumer.max_in_flight_per_session == 1, "two requests of one session at once"
    per_activity: dict[str, set[str]] = {}
    for h in consumer.delivered("main"):
        if h.activity_name is not None:
            per_activity.setdefault(h.activity_name, set()).add(h.webhook_id)
    assert all(len(ids) == 1 for ids in per_activity.values()), "an activity under two ids"
    acks = Counter(h.webhook_id for h in consumer.delivered("main"))
    duplicates = sum(n - 1 for n in acks.values())
    # At most what the two killed replicas had in flight (concurrency 4 each) is sent again.
    assert duplicates <= 2 * 4, acks.most_common(5)
    # The work was shared: the replicas that lived delivered, each of them.
    for relay in (replicas[2], again):
        assert any(e.get("event") == "delivery.succeeded" for e in relay.log_events()), relay.label
