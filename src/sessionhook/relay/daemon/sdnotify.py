"""The systemd notification protocol (``sd_notify(3)``) in a few lines, without libsystemd.

The daemon sends ``READY=1``, ``WATCHDOG=1``, ``RELOADING=1``, ``STOPPING=1`` and
``STATUS=...`` to the datagram socket ``NOTIFY_SOCKET`` names (a leading ``@``: the abstract
namespace). Outside systemd every call is a cheap no-op returning ``False``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def _address(raw: str) -> str | bytes | None:
    if raw.startswith("@"):
        # Abstract namespace: a leading NUL byte instead of the '@' shown in the environment.
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    return None  # vsock and other schemes are not ours to speak


def notify(state: str, *, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd; whether the datagram was sent. Never
    raises: a broken channel ends in the watchdog restarting the daemon, as intended.
    """
    environ = os.environ if env is None else env
    address = _address(environ.get("NOTIFY_SOCKET", ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True


def ready(status_text: str | None = None, *, env: Mapping[str, str] | None = None) -> bool:
    """Tell systemd start-up (or a reload) is complete, with an optional status line."""
    return notify(_with_status("READY=1", status_text), env=env)


def reloading(*, env: Mapping[str, str] | None = None) -> bool:
    """Tell systemd a configuration reload started; send :func:`ready` when it is done."""
    return notify("RELOADING=1", env=env)


def stopping(status_text: str | None = None, *, env: Mapping[str, str] | None = None) -> bool:
    """Tell systemd the daemon is draining and about to exit."""
    return notify(_with_status("STOPPING=1", status_text), env=env)


def watchdog(*, env: Mapping[str, str] | None = None) -> bool:
    """Ping the service watchdog; call it from the main loop, not from a side thread."""
    return notify("WATCHDOG=1", env=env)


def status(text: str, *, env: Mapping[str, str] | None = None) -> bool:
    """Set the one-line status shown by ``systemctl status``."""
    return notify(_with_status(None, text), env=env)


def _with_status(head: str | None, status_text: str | None) -> str:
    lines = [] if head is None else [head]
    if status_text is not None:
        # One datagram is newline-separated assignments: a newline would start a new key.
        lines.append("STATUS=" + " ".join(status_text.splitlines()))
    return "\n".join(lines)


def watchdog_interval(*, env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (half of ``WATCHDOG_USEC``), or ``None`` when the
    watchdog is off or ``WATCHDOG_PID`` is another process's."""
    environ = os.environ if env is None else env
    raw = environ.get("WATCHDOG_USEC")
    if not raw:
        return None
    pid = environ.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        usec = int(raw)
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 1_000_000 / 2
