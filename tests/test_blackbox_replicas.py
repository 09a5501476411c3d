"""Black-box tests of moving up and of replicas: the real ``sessionhook`` commands in
subprocesses against the stand-in and the verifying consumer.

* ``sessionhook store copy``: an archive copied to a new store, then the relay run on the
  copy: nothing delivered before is delivered again, open deliveries go out under the
  same webhook-ids, the source is not touched.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from .test_blackbox import (
    SESSIONHOOK,
    Endpoint,
    Harness,
    assert_all_verified,
    assert_clean_exit,
    harness,
    wait_until,
)
from .test_blackbox_throughput import preload, read

pytestmark = pytest.mark.integration
__all__ = ["harness"]  # the fixture, shared with test_blackbox


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def store_copy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SESSIONHOOK), "store", "copy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


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
    events = {r[0] for r in read(source, "SELECT id FROM events")}
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
        assert read(target, sql) == read(source, sql)

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
    assert {r[0] for r in read(target, "SELECT id FROM events")} == events
    assert refused <= {h.webhook_id for h in consumer.delivered("b")}  # the same ids
    names = {a for acts in order.values() for a in acts}
    assert consumer.delivered_activity_names("b") == names
