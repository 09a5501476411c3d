"""A user template checked against a sample of every event type in a child process:
:func:`check_template`.

Run when an endpoint is defined and, for the config file's templates, at start and reload,
so a template that cannot render is refused then, never a failed delivery later. It has a
delivery's bounds (the render child's memory cap and alarm, ``delivery.render_timeout``, the
sandbox's budgets); nothing of the template runs in the caller's process. Synchronous; at
most :data:`MAX_CHECKS` run at once in a process.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Sequence

from ..domain.render import RenderError, Shape
from ..domain.samples import sample_events
from .render_child import READY, request
from .render_process import child_command, child_streams

#: Checks running at once in one process.
MAX_CHECKS = 2
#: Seconds a child has to start (an interpreter and Jinja2 loaded on a busy machine).
START_TIMEOUT = 30.0
_CHECKS = threading.BoundedSemaphore(MAX_CHECKS)
_LENGTH = struct.Struct(">I")


class _Late(Exception):
    """The child did not answer in time."""


class _Gone(Exception):
    """The child closed its output (it died)."""


def check_template(
    shape: Shape,
    time_budget: float,
    *,
    command: Sequence[str] | None = None,
    start_timeout: float = START_TIMEOUT,
) -> None:
    """Render ``shape`` against every sample event in a child process, each within
    ``time_budget`` seconds; a one-line :class:`~.render.RenderError` on the first failure."""
    with _CHECKS:
        try:
            process = subprocess.Popen(list(command or child_command()), **child_streams())
        except OSError as exc:
            raise RenderError(f"the renderer process did not start: {exc}") from None
        try:
            _exchange(process, shape, time_budget, start_timeout)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()


def _exchange(
    process: subprocess.Popen[bytes], shape: Shape, time_budget: float, start_timeout: float
) -> None:
    assert process.stdin is not None and process.stdout is not None
    with _Pipe(process.stdout.fileno()) as pipe:
        _samples(process, pipe, shape, time_budget, start_timeout)


def _samples(
    process: subprocess.Popen[bytes],
    pipe: _Pipe,
    shape: Shape,
    time_budget: float,
    start_timeout: float,
) -> None:
    assert process.stdin is not None
    try:
        ready = pipe.frame(time.monotonic() + start_timeout)
    except (_Late, _Gone):
        ready = b""
    if ready != READY:
        raise RenderError(f"the renderer process did not start ({_ended(process)})")
    for event in sample_events():
        deadline = time.monotonic() + time_budget
        try:
            process.stdin.write(request(event.id, event.body, shape, time_budget))
            process.stdin.flush()
            meta = json.loads(pipe.frame(deadline))
            pipe.skip_frame(deadline)  # what it rendered: not needed
        except _Late:
            raise RenderError(
                f"template over its time budget of {time_budget:g} s on {event.type}"
            ) from None
        except (_Gone, OSError, ValueError):
            raise RenderError(
                f"the renderer process died while rendering {event.type} ({_ended(process)})"
            ) from None
        if not meta.get("ok"):
            raise RenderError(str(meta.get("error")))


def _ended(process: subprocess.Popen[bytes]) -> str:
    """How the child ended (killed now if it still runs)."""
    if process.poll() is None:
        process.kill()
    code = process.wait()
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


class _Pipe:
    """The child's output, read frame by frame with a deadline (never blocking past it)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._selector = selectors.DefaultSelector()  # epoll: any descriptor number
        self._selector.register(fd, selectors.EVENT_READ)
        self._buffer = bytearray()

    def __enter__(self) -> _Pipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self._selector.close()

    def frame(self, deadline: float) -> bytes:
        (length,) = _LENGTH.unpack(self._take(_LENGTH.size, deadline))
        return self._take(length, deadline)

    def skip_frame(self, deadline: float) -> None:
        (length,) = _LENGTH.unpack(self._take(_LENGTH.size, deadline))
        while length:  # read and dropped as it comes: a big render is never held whole
            chunk = self._take(min(length, 1 << 16), deadline)
            length -= len(chunk)

    def _take(self, size: int, deadline: float) -> bytes:
        while len(self._buffer) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not self._selector.select(left):
                raise _Late
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                raise _Gone
            self._buffer += chunk
        taken = bytes(self._buffer[:size])
        del self._buffer[:size]
        return taken
