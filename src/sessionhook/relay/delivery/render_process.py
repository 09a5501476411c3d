"""Rendering off the event loop, with a time budget that really stops a render.

The step budget of :mod:`.template_sandbox` bounds a render's Python-level work; what runs
long inside one step or fills memory is bounded here: :class:`RenderProcess` renders in child
processes (:mod:`.render_child`) and kills one past its time budget (a thread cannot be
stopped). A preset ``format`` on an event of at most :data:`INLINE_BYTES` renders inline
(cheaper than a round trip, ``bench/render.py``); each user template gets a child of its own
(at most :data:`MAX_CHILDREN`), so a slow one delays only its endpoints; over the budget the
attempt fails with a :class:`~.render.RenderError`. A child gets none of the daemon's
environment but the ``PYTHON*`` variables.

:class:`InlineRenderer` renders on the caller's thread with the step budget only.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from ..domain import render
from ..domain.render import RenderError, Shape
from .render_child import READY, request

#: Presets render inline on events up to this size (bigger ones go to a child).
INLINE_BYTES = 256 * 1024
#: Child processes kept at most (one per template in use).
MAX_CHILDREN = 8
#: What a child runs (``python -m``): the render loop of :mod:`.render_child`.
CHILD_MODULE = "sessionhook.relay.delivery.render_child"
_LENGTH = struct.Struct(">I")
#: What reading from or writing to a child that died raises.
_CHILD_GONE = (
    anyio.EndOfStream,
    anyio.IncompleteRead,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)


class Renderer(Protocol):
    """Makes the bytes an endpoint is sent (see :func:`sessionhook.relay.domain.render.render`)."""

    async def render(
        self, event_id: str, body: bytes, shape: Shape, *, time_budget: float
    ) -> tuple[bytes, str]:
        """The body and content type, or :class:`~.render.RenderError`."""
        ...


class InlineRenderer:
    """Renders on the caller's thread: the step budget only, ``time_budget`` is not enforced."""

    async def render(
        self, event_id: str, body: bytes, shape: Shape, *, time_budget: float
    ) -> tuple[bytes, str]:
        """:func:`sessionhook.relay.domain.render.render`, here and now."""
        return render.render(event_id, body, shape)


class _Child:
    """One child process and the framing on its pipes."""

    def __init__(self, process: Process) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self._stdin = process.stdin
        self._stdout = BufferedByteReceiveStream(process.stdout)

    async def send(self, data: bytes) -> None:
        await self._stdin.send(data)

    async def receive(self) -> bytes:
        (length,) = _LENGTH.unpack(await self._stdout.receive_exactly(_LENGTH.size))
        return await self._stdout.receive_exactly(length)

    async def kill(self) -> str:
        """Kill the child, reap it; how it ended (``killed by SIGKILL``, ``exit status 1``)."""
        with anyio.CancelScope(shield=True):
            if self.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    self.process.kill()
            await self.process.aclose()
        code = self.process.returncode
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"


def child_command() -> list[str]:
    """How a render child is started: ``python -m`` :data:`CHILD_MODULE`, this interpreter."""
    return [sys.executable, "-m", CHILD_MODULE]


def child_streams() -> dict[str, Any]:
    """How a render child is wired: stdin and stdout piped, stderr dropped, and only the
    environment Python needs to start (a PYTHONPATH, say), for the daemon's holds its secrets."""
    env = {key: value for key, value in os.environ.items() if key.startswith("PYTHON")}
    return {
        "stdin": subprocess.PIPE,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.DEVNULL,
        "env": env,
    }


class _Lane:
    """The child process of one template, used by one render at a time: a template that
    runs long delays only its own endpoint's renders, never another endpoint's."""

    def __init__(self, owner: RenderProcess) -> None:
        self._owner = owner
        self.lock = anyio.Lock()
        self._child: _Child | None = None
        #: No longer in use (see RenderProcess._retire_idle): stop the child after a render.
        self.retired = False

    async def exchange(self, request: bytes, time_budget: float) -> tuple[dict[str, Any], bytes]:
        """Send one request, read its answer within ``time_budget`` seconds."""
        async with self.lock:
            child = self._child or await self._start()
            try:
                with anyio.move_on_after(time_budget) as budget:
                    await child.send(request)
                    meta: dict[str, Any] = json.loads(await child.receive())
                    rendered = await child.receive()
            except (*_CHILD_GONE, ValueError):  # ValueError: not JSON, never seen but fatal
                how = await self.close()
                raise RenderError(f"the renderer process died while rendering ({how})") from None
            except BaseException:
                await self.close()  # cancelled mid-exchange: its pipes are out of step
                raise
            if budget.cancelled_caught:
                await self.close()
                raise RenderError(f"template over its time budget of {time_budget:g} s")
            if self.retired:
                await self.close()
        return meta, rendered

    async def close(self) -> str:
        """Kill the child if one runs; how it ended."""
        child, self._child = self._child, None
        return await child.kill() if child is not None else "not running"

    async def _start(self) -> _Child:
        owner = self._owner
        try:
            process = await anyio.open_process(owner.command, **child_streams())
        except OSError as exc:
            raise RenderError(f"the renderer process did not start: {exc}") from None
        child = _Child(process)
        owner.started += 1
        try:
            with anyio.fail_after(owner.start_timeout):
                ready = await child.receive()
        except (TimeoutError, *_CHILD_GONE):
            ready = b""
        except BaseException:  # cancelled while it started: it must not outlive us
            await child.kill()
            raise
        if ready != READY:
            how = await child.kill()
            raise RenderError(f"the renderer process did not start ({how})")
        self._child = child
        return child


class RenderProcess:
    """The daemon's renderer: user templates in child processes, each render within its
    time budget (see the module docstring). Call :meth:`aclose` when done."""

    def __init__(
        self,
        *,
        command: Sequence[str] | None = None,
        start_timeout: float = 30.0,
        inline_bytes: int = INLINE_BYTES,
        max_children: int = MAX_CHILDREN,
    ) -> None:
        #: How a child is started (``python -m sessionhook.relay.delivery.render_child``).
        self.command = list(command or child_command())
        #: Seconds a new child has to say it is ready.
        self.start_timeout = start_timeout
        #: Children started (one per template, and one after each kill): for tests.
        self.started = 0
        self._inline_bytes = inline_bytes
        self._max_children = max_children
        #: One lane per template source (``None``: presets on big events), least recently
        #: used first.
        self._lanes: collections.OrderedDict[str | None, _Lane] = collections.OrderedDict()

    async def render(
        self, event_id: str, body: bytes, shape: Shape, *, time_budget: float
    ) -> tuple[bytes, str]:
        """The body and content type ``shape`` makes of the event within ``time_budget``
        seconds; :class:`~.render.RenderError` otherwise."""
        if shape.template is None and len(body) <= self._inline_bytes:
            return render.render(event_id, body, shape)
        lane = await self._lane(shape.template)
        meta, rendered = await lane.exchange(
            request(event_id, body, shape, time_budget), time_budget
        )
        if not meta.get("ok"):
            raise RenderError(str(meta.get("error")))
        return rendered, str(meta["content_type"])

    async def aclose(self) -> None:
        """Stop every child."""
        lanes = list(self._lanes.values())
        self._lanes.clear()
        for lane in lanes:
            await lane.close()

    async def _lane(self, template: str | None) -> _Lane:
        lane = self._lanes.get(template)
        if lane is None:
            lane = self._lanes[template] = _Lane(self)
            await self._retire_idle()
        self._lanes.move_to_end(template)
        return lane

    async def _retire_idle(self) -> None:
        """Past ``max_children`` (templates a reload replaced), retire the least recently
        used lanes: an idle one's child is stopped now, a busy one's after its render."""
        while len(self._lanes) > self._max_children:
            _, lane = self._lanes.popitem(last=False)
            lane.retired = True
            if not lane.lock.locked():
                await lane.close()
