"""sd_notify over a real AF_UNIX datagram socket: the test plays systemd's side."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionhook.relay.daemon import sdnotify

pytestmark = pytest.mark.app


@pytest.fixture
def systemd_socket() -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket on a short filesystem path (sun_path is 108 bytes at most)."""
    directory = tempfile.mkdtemp(prefix="sdn-", dir="/tmp")
    path = os.path.join(directory, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    try:
        yield sock, path
    finally:
        sock.close()
        Path(path).unlink(missing_ok=True)
        os.rmdir(directory)


def test_ready_is_received_by_the_socket(systemd_socket: tuple[socket.socket, str]) -> None:
    sock, path = systemd_socket
    assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": path}) is True
    assert sock.recv(4096) == b"READY=1"


def test_helpers_send_the_documented_assignments(
    systemd_socket: tuple[socket.socket, str],
) -> None:
    sock, path = systemd_socket
    env = {"NOTIFY_SOCKET": path}
    assert sdnotify.ready("polling 3 sessions", env=env)
    assert sdnotify.watchdog(env=env)
    assert sdnotify.reloading(env=env)
    assert sdnotify.stopping("draining\nin-flight", env=env)
    assert sdnotify.status("ok", env=env)
    received = [sock.recv(4096).decode() for _ in range(5)]
    assert received == [
        "READY=1\nSTATUS=polling 3 sessions",
        "WATCHDOG=1",
        "RELOADING=1",
        # a newline in the status would start a new assignment: it is folded into a space
        "STOPPING=1\nSTATUS=draining in-flight",
        "STATUS=ok",
    ]


def test_abstract_namespace_socket() -> None:
    name = f"sessionhook-test-{os.getpid()}-{id(object())}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(5)
        assert sdnotify.notify("WATCHDOG=1", env={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_reads_notify_socket_from_the_process_environment(
    systemd_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = systemd_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert sdnotify.notify("READY=1")
    assert sock.recv(4096) == b"READY=1"


@pytest.mark.parametrize("value", [None, "", "vsock:2:1234", "relative/path"])
def test_without_a_usable_socket_it_is_a_no_op(value: str | None) -> None:
    env = {} if value is None else {"NOTIFY_SOCKET": value}
    assert sdnotify.notify("READY=1", env=env) is False


def test_send_failure_returns_false_instead_of_raising(tmp_path: Path) -> None:
    # A path nobody listens on: connect fails with ENOENT/ECONNREFUSED.
    missing = f"/tmp/sdn-missing-{os.getpid()}-{id(tmp_path)}"
    assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": missing}) is False


def test_watchdog_interval_is_half_the_timeout_for_this_process() -> None:
    env = {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
    assert sdnotify.watchdog_interval(env=env) == 15.0
    assert sdnotify.watchdog_interval(env={"WATCHDOG_USEC": "4000000"}) == 2.0


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"WATCHDOG_USEC": ""},
        {"WATCHDOG_USEC": "0"},
        {"WATCHDOG_USEC": "soon"},
        {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)},  # not ours
        {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"},
    ],
)
def test_watchdog_interval_off(env: dict[str, str]) -> None:
    assert sdnotify.watchdog_interval(env=env) is None
