"""Black-box: ``[server] listen`` cannot starve ``sessionhook run`` of file descriptors.

Anyone who can connect holds sockets open before any token is checked. The relay runs
here with a small open-files limit (set in the child before it starts, as systemd's
``LimitNOFILE=`` would), and the test opens more idle connections than the relay's
``server.max_connections``: the relay holds at most that many, closes each one that sent
no complete request within ``server.request_timeout``, and meanwhile keeps polling and
delivering. Nothing is imported from ``sessionhook``.
"""

from __future__ import annotations

import contextlib
import resource
import socket
from pathlib import Path

import httpx
import pytest

from tests.support.blackbox_consumer import Consumer
from tests.support.delivery_checks import wait_all_delivered
from tests.support.loopback import free_port
from tests.support.relay_process import (
    Endpoint,
    Harness,
    Relay,
    relay_config,
    wait_ready,
    wait_until,
)
from tests.support.world import World

pytestmark = pytest.mark.process


#: The relay's open-files limit in these tests (soft and hard).
FILES = 128
#: ``server.max_connections`` of the relay: well below FILES.
CAP = 24
#: Idle connections the test opens: more than the relay's free descriptors.
IDLE = 150


def _limit_files(soft: int, hard: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _established(port: int) -> set[str]:
    """Socket inodes of the established TCP connections whose local end is ``port`` and
    that a process accepted (a connection still in the listen queue has no inode yet).

    Not a snapshot: the kernel writes /proc/net/tcp a page per read, resuming its walk of
    a table that changes meanwhile, so one read can list one socket twice, or a socket
    already closed beside the one accepted in its place.
    """
    inodes: set[str] = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].rsplit(":", 1)[1], 16)
        if local_port == port and fields[3] == "01" and fields[9] != "0":
            inodes.add(fields[9])
    return inodes


def _accepted(port: int) -> int:
    """How many accepted connections to ``port`` were open at one same instant.

    A socket established in two reads one after the other was established all the time
    between them (an accepted socket never becomes established again once it leaves that
    state), so the sockets in both reads were open together when the first read ended.
    One read alone can count a socket closed during it beside the one accepted in its
    place, more than were ever open at once.
    """
    return len(_established(port) & _established(port))


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def _relay(
    harness: Harness, extra: str, soft: int, hard: int
) -> tuple[Relay, World, Consumer, int]:
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("alpha")
    port = free_port()
    config = relay_config(
        standin=standin,
        store=harness.tmp / "relay.db",
        endpoints=[Endpoint("alpha", url, secret)],
        listen=f"127.0.0.1:{port}",
    )
    relay = harness.start(
        "relay", config + extra, standin.api_key, preexec=lambda: _limit_files(soft, hard)
    )
    wait_ready(standin, relay)
    return relay, World(standin), consumer, port


def test_idle_connections_beyond_the_cap_starve_neither_deliveries_nor_health(
    harness: Harness,
) -> None:
    relay, world, consumer, port = _relay(
        harness, f"max_connections = {CAP}\nrequest_timeout = 1\n", FILES, FILES
    )
    idle: list[socket.socket] = []
    held: list[int] = []
    try:
        for _ in range(IDLE):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            idle.append(sock)

        # Deliveries flow while the idle connections are held (or queued).
        world.add("pr")
        world.add("fail")
        world.play(pause=0.05)
        wait_all_delivered(consumer, ["alpha"], world, harness, timeout=40)

        def all_closed() -> bool:
            held.append(_accepted(port))
            return sum(_closed_by_peer(s) for s in idle) >= IDLE - 5

        # The idle ones are closed a batch at a time; /healthz then answers.
        wait_until(all_closed, 60, "the relay to close the idle connections", relay.diagnostics)
        answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=20)
        assert answer.status_code == 200
    finally:
        for sock in idle:
            with contextlib.suppress(OSError):
                sock.close()
    assert max(held) <= CAP, f"the relay held {max(held)} connections, more than its cap"
    assert relay.alive(), relay.diagnostics()
    events = relay.log_events()
    assert any(e.get("event") == "web.connections_full" for e in events), relay.diagnostics()
    assert not any(e.get("event") == "delivery.failed" for e in events), relay.diagnostics()
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert 'sessionhook_web_connections_closed_total{reason="request_timeout"}' in metrics


def _limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-files line in /proc/{pid}/limits")


def test_the_relay_raises_its_files_limit_and_refuses_a_cap_above_half(harness: Harness) -> None:
    # Soft 100, hard 512: the relay lifts the soft limit; 200 connections fit into 512 / 2.
    relay, _world, _consumer, _port = _relay(harness, "max_connections = 200\n", 100, 512)
    assert relay.proc is not None
    assert _limits(relay.proc.pid) == (512, 512)

    # A hard limit of 256 leaves the listener 128: 200 is a config error, exit 2, one line.
    standin = harness.standin()
    listen = f"127.0.0.1:{free_port()}"
    config = relay_config(
        standin=standin, store=harness.tmp / "other.db", endpoints=[], listen=listen
    )
    refused = harness.start(
        "refused",
        config + "max_connections = 200\n",
        standin.api_key,
        preexec=lambda: _limit_files(256, 256),
    )
    assert refused.wait(30) == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith("config error: server.max_connections: 200"), lines[0]
    assert "(256)" in lines[0]
