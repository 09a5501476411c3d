"""One dedicated thread for a store that has one connection (SQLite): the hand-off of every
:class:`~.aio.AsyncStore` call (a ``queue.SimpleQueue`` in, one ``call_soon_threadsafe``
out), about a third of the CPU of ``anyio.to_thread.run_sync`` under a limiter, for the
dispatcher's hundreds of rounds a second. Calls run one at a time, in the order made.

Contract (anyio's, which :class:`~.aio.AsyncStore` relied on): a caller already cancelled
raises at once, nothing queued; a call runs once, whole, its exception raised in the
caller; a caller cancelled while its call is queued or running still waits for it to end,
then sees the cancellation; the caller's context variables are visible in the call. The
daemon thread starts at the first call; after :meth:`stop` (which lets the queued calls
run) a call raises :class:`RuntimeError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

T = TypeVar("T")

#: (call, the caller's future, its loop); None stops the thread.
_Job = tuple[Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop] | None


class StoreThread:
    """Runs the calls of one store connection one after another in a thread of its own."""

    def __init__(self, name: str = "sessionhook-store") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: True once :meth:`stop` was called: calls must go elsewhere.
        self.stopped = False
        self._lock = threading.Lock()

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` in the thread; its result or exception. See the module docstring."""
        await anyio.lowlevel.checkpoint_if_cancelled()  # as anyio: not even queued then
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        context = contextvars.copy_context()
        self._submit((lambda: context.run(fn), future, loop))
        # Shielded like anyio's run_sync: the call is never abandoned; a cancellation
        # arrives at the caller's next checkpoint, once the call has ended.
        with anyio.CancelScope(shield=True):
            result = await future
        return result

    def stop(self) -> None:
        """End the thread once the calls already queued have run (idempotent)."""
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
            if self._thread is not None:
                self._jobs.put(None)

    def _submit(self, job: _Job) -> None:
        with self._lock:
            if self.stopped:
                raise RuntimeError("the store's thread is stopped (the store was closed)")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future, loop = job
            try:
                result = fn()
            except BaseException as exc:  # handed to the caller, whatever it is
                _hand_back(loop, future, None, exc)
                del exc
            else:
                _hand_back(loop, future, result, None)
                del result
            # Nothing of a finished call is kept while waiting for the next one: an idle
            # thread must not keep a store (its connection) or a result alive.
            del job, fn, future, loop


def _hand_back(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> None:
    def settle() -> None:
        if future.done():  # its loop cancelled it (the loop is shutting down)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    # RuntimeError: the caller's loop is closed, nobody is waiting any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle)
