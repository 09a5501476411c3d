"""Black-box tests of ``sessionhook run`` as an operator runs it: one daemon per store,
private store files, a full disk. The real command in a subprocess against the stand-in
(``tests/support/standin.py``) and the verifying consumer, everything on 127.0.0.1; nothing is
imported from ``sessionhook``.
"""

from __future__ import annotations

import stat
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.support.blackbox_consumer import new_secret
from tests.support.delivery_checks import wait_all_delivered
from tests.support.loopback import free_port
from tests.support.relay_process import (
    Endpoint,
    Harness,
    Relay,
    assert_clean_exit,
    readyz,
    relay_config,
    wait_ready,
    wait_until,
)
from tests.support.standin import StandIn
from tests.support.tinyfs import Ballast, tiny_filesystem
from tests.support.world import World

pytestmark = pytest.mark.process


def logged(relay: Relay, event: str) -> list[dict[str, object]]:
    return [e for e in relay.log_events() if e.get("event") == event]


# --------------------------------------------------------------------------- one daemon


def test_a_second_daemon_on_the_same_store_exits_2_naming_the_holder(harness: Harness) -> None:
    """A manual ``run`` beside the service: refused at once with one line naming the store and
    the PID; ``--once`` too; operator commands keep working; after ``kill -9`` of the holder
    the next daemon starts (no stale lock)."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    endpoints = [Endpoint("main", url, secret)]
    first = harness.relay(standin, "first", endpoints=endpoints)
    wait_ready(standin, first)
    assert first.proc is not None
    store = harness.tmp / "relay.db"

    for label, args in (("second", ()), ("once", ("--once",))):
        other = harness.relay(standin, label, *args, endpoints=endpoints)
        assert other.wait(timeout=15) == 2, other.diagnostics()
        lines = other.stderr.strip().splitlines()
        assert len(lines) == 1, other.diagnostics()
        assert str(store) in lines[0] and f"pid {first.proc.pid}" in lines[0], lines[0]
        assert "Traceback" not in other.stderr

    # The operator's commands read (and write) while the daemon holds the store.
    status = first.command("status")
    assert status.returncode == 0, status.stderr
    disabled = first.command("endpoints", "disable", "main", "--reason", "maintenance")
    assert disabled.returncode == 0, disabled.stderr
    enabled = first.command("endpoints", "enable", "main")
    assert enabled.returncode == 0, enabled.stderr

    world = World(standin)
    world.add("short")
    world.play()
    wait_all_delivered(consumer, ["main"], world, harness, timeout=30)
    # Only the first daemon delivered: no event reached the consumer twice.
    ids = [h.webhook_id for h in consumer.hits("main")]
    assert len(ids) == len(set(ids)), "an event was delivered twice"

    first.kill()  # SIGKILL: the kernel drops the lock with the process
    third = harness.relay(standin, "third", endpoints=endpoints)
    wait_until(
        lambda: bool(logged(third, "relay.ready")) or not third.alive(),
        20,
        "the third daemon to start",
        third.diagnostics,
    )
    assert third.alive(), third.diagnostics()
    assert_clean_exit(third)


def test_the_store_and_its_wal_shm_and_lock_files_are_private(harness: Harness) -> None:
    """Created 0600 (the archive holds every activity) whatever the umask allows."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    store = harness.tmp / "private" / "relay.db"
    relay = harness.relay(standin, "relay", endpoints=[Endpoint("main", url, secret)], store=store)
    wait_ready(standin, relay)
    world = World(standin)
    world.add("short")
    world.play()
    wait_all_delivered(consumer, ["main"], world, harness, timeout=30)
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in store.parent.iterdir()}
    assert set(files) >= {"relay.db", "relay.db-wal", "relay.db-shm", "relay.db.lock"}, files
    assert all(mode == 0o600 for mode in files.values()), {k: oct(v) for k, v in files.items()}
    assert stat.S_IMODE(store.parent.stat().st_mode) == 0o700
    assert_clean_exit(relay)


# --------------------------------------------------------------------------- network


def test_a_private_only_endpoint_is_refused_at_start_up(harness: Harness) -> None:
    """With allow_private_networks = false, an endpoint that can only be private is a config
    error: one line naming the key, exit 2, before anything is polled or sent."""
    standin = harness.standin()
    config = relay_config(
        standin=standin,
        store=harness.tmp / "relay.db",
        endpoints=[Endpoint("local", "http://[::1]:9/hook", new_secret())],
    ).replace("allow_private_networks = true", "allow_private_networks = false")
    relay = harness.start("strict", config, standin.api_key)
    assert relay.wait(timeout=15) == 2, relay.diagnostics()
    assert relay.stderr.strip().splitlines() == [
        "config error: endpoints[0].url: ::1 is a loopback address, "
        "refused while delivery.allow_private_networks = false"
    ]
    assert standin.requests("list_sessions") == []


# --------------------------------------------------------------------------- a full disk


def metric(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def served_relay(harness: Harness, standin: StandIn, label: str, port: int, **config: Any) -> Relay:
    return harness.relay(standin, label, listen=f"127.0.0.1:{port}", **config)


def wait_full(relay: Relay, port: int, harness: Harness) -> dict[str, Any]:
    """Until the relay reports the full store on /readyz; returns the readiness body."""
    seen: dict[str, Any] = {}

    def full() -> bool:
        if not relay.alive():
            raise AssertionError(f"the relay exited on a full disk\n{relay.diagnostics()}")
        try:
            status, body = readyz(port)
        except OSError:
            return False  # the health server is not listening yet
        seen.update(body)
        return status == 503 and any("store is full" in r for r in body["reasons"])

    wait_until(full, 40, "/readyz to report the full store", harness.diagnostics)
    return seen


def test_a_full_disk_pauses_the_relay_and_loses_nothing(harness: Harness) -> None:
    """The store's filesystem fills up while sessions keep producing activities: the relay
    stays up, /readyz says 503 with the reason, SIGTERM still stops it cleanly, it starts
    again on the full disk (not ready), and once space returns every activity is delivered."""
    with tiny_filesystem(harness.tmp / "fs", 8192) as fs:
        standin = harness.standin()
        consumer = harness.consumer()
        url, secret = consumer.add_endpoint("main")
        endpoints = [Endpoint("main", url, secret)]
        port = free_port()
        store = fs / "relay.db"
        first = served_relay(harness, standin, "first", port, store=store, endpoints=endpoints)
        wait_ready(standin, first)
        world = World(standin)
        early = world.add("short")
        world.play(only=[early])
        wait_all_delivered(consumer, ["main"], world, harness, timeout=30)

        ballast = Ballast(fs)
        ballast.fill()
        busy = world.add("pr")
        world.step(busy)  # PLANNING: the session is polled every active_interval
        # More than the space SQLite may still hold in its files, less than the filesystem
        # (a transaction bigger than the whole disk could never commit).
        for _ in range(3):
            standin.append_activity(busy, "agentMessaged", {"agentMessage": "x" * 150_000})
        body = wait_full(first, port, harness)
        assert body["ready"] is False, body
        assert logged(first, "store.full"), first.diagnostics()
        assert metric(port, "sessionhook_store_unwritable") == 1.0
        assert first.alive()
        assert_clean_exit(first)  # SIGTERM while full: writes waiting for space give up

        # Started on the full disk (the space the first relay's WAL file gave back at its
        # clean stop is taken too): it stays up and says why it is not ready.
        ballast.fill()
        second = served_relay(harness, standin, "second", port, store=store, endpoints=endpoints)
        wait_full(second, port, harness)
        world.play(only=[busy])  # the rest of the session's life, still on a full disk
        assert second.alive(), second.diagnostics()

        ballast.free()
        wait_all_delivered(consumer, ["main"], world, harness, timeout=60)
        wait_until(lambda: readyz(port)[0] == 200, 30, "/readyz to recover", harness.diagnostics)
        assert logged(second, "store.recovered"), second.diagnostics()
        assert metric(port, "sessionhook_store_unwritable") == 0.0
        for relay in (first, second):
            assert "Traceback" not in relay.stderr, relay.diagnostics()
        assert_clean_exit(second)
    delivered = [h.activity_name for h in consumer.delivered("main") if h.activity_name]
    assert set(delivered) == world.activity_names()


def test_a_store_cannot_be_created_on_a_full_disk(harness: Harness) -> None:
    """No store yet and no space to create one: one line, exit 1, nothing half-made."""
    with tiny_filesystem(harness.tmp / "fs", 512) as fs:
        Ballast(fs).fill()
        standin = harness.standin()
        consumer = harness.consumer()
        url, secret = consumer.add_endpoint("main")
        relay = harness.relay(
            standin, "relay", endpoints=[Endpoint("main", url, secret)], store=fs / "relay.db"
        )
        assert relay.wait(timeout=20) == 1, relay.diagnostics()
        lines = relay.stderr.strip().splitlines()
        assert len(lines) == 1, relay.diagnostics()
        assert lines[0].startswith("error: cannot create the store: the disk is full"), lines[0]
        assert not (fs / "relay.db").exists() or (fs / "relay.db").stat().st_size == 0
