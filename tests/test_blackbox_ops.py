"""Black-box tests of ``sessionhook run`` as an operator runs it: one daemon per store,
private store files, a full disk. The real command in a subprocess against the stand-in
(``tests/standin.py``) and the verifying consumer, everything on 127.0.0.1; nothing is
imported from ``sessionhook``.
"""

from __future__ import annotations

import stat
import subprocess

import pytest

from .blackbox_consumer import new_secret
from .test_blackbox import (
    SESSIONHOOK,
    Endpoint,
    Harness,
    Relay,
    World,
    assert_clean_exit,
    harness,
    relay_config,
    wait_all_delivered,
    wait_ready,
    wait_until,
)

__all__ = ["harness"]  # the fixture, re-exported so pytest finds it here

pytestmark = pytest.mark.integration


def operator(relay: Relay, *args: str) -> subprocess.CompletedProcess[str]:
    """An operator command (``sessionhook status``...) against the relay's config."""
    return subprocess.run(
        [str(SESSIONHOOK), *args, "--config", str(relay.config_path)],
        capture_output=True,
        text=True,
        env=relay.env,
        timeout=30,
        check=False,
    )


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
    status = operator(first, "status")
    assert status.returncode == 0, status.stderr
    disabled = operator(first, "endpoints", "disable", "main", "--reason", "maintenance")
    assert disabled.returncode == 0, disabled.stderr
    enabled = operator(first, "endpoints", "enable", "main")
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
    relay = Relay(harness.tmp, "strict", config, standin.api_key)
    harness.relays.append(relay)
    relay.start()
    assert relay.wait(timeout=15) == 2, relay.diagnostics()
    assert relay.stderr.strip().splitlines() == [
        "config error: endpoints[0].url: ::1 is a loopback address, "
        "refused while delivery.allow_private_networks = false"
    ]
    assert standin.requests("list_sessions") == []
