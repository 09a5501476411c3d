"""The SQLite store's own thread (``store/thread.py``): order, errors, cancellation, stop."""

from __future__ import annotations

import contextvars
import threading
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from sessionhook.relay.store import AsyncStore
from sessionhook.relay.store.thread import StoreThread

pytestmark = [pytest.mark.app, pytest.mark.anyio]

_who = contextvars.ContextVar("who", default="nobody")


async def test_calls_run_in_order_in_one_thread_off_the_loop() -> None:
    worker = StoreThread()
    seen: list[tuple[int, int]] = []
    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(worker.run, lambda i=i: seen.append((i, threading.get_ident())))
            await anyio.lowlevel.checkpoint()  # submitted in this order
    worker.stop()
    assert [i for i, _ in seen] == list(range(20))
    assert len({ident for _, ident in seen}) == 1
    assert seen[0][1] != threading.get_ident()


async def test_a_result_and_an_error_come_back_to_the_caller() -> None:
    worker = StoreThread()
    assert await worker.run(lambda: 6 * 7) == 42

    def boom() -> None:
        raise ValueError("no such row")

    with pytest.raises(ValueError, match="no such row"):
        await worker.run(boom)
    assert await worker.run(lambda: "still working") == "still working"
    worker.stop()


async def test_the_callers_context_variables_are_visible() -> None:
    worker = StoreThread()
    _who.set("dispatcher")
    assert await worker.run(_who.get) == "dispatcher"
    worker.stop()


async def test_a_cancelled_caller_waits_for_its_call_to_end() -> None:
    """Cancellation never abandons a call half-way (a transaction runs whole): the caller
    sees the cancel only once the call has ended."""
    worker = StoreThread()
    started, release = threading.Event(), threading.Event()
    done: list[str] = []

    def slow_write() -> None:
        started.set()
        release.wait(30)
        done.append("committed")

    finished_before_cancel_seen: list[bool] = []
    with anyio.CancelScope() as outer:

        async def caller() -> None:
            try:
                await worker.run(slow_write)
            finally:
                finished_before_cancel_seen.append(done == ["committed"])

        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            await anyio.to_thread.run_sync(started.wait, 30)
            outer.cancel()  # while the call runs
            with anyio.CancelScope(shield=True):
                for _ in range(20):  # the cancel reaches the caller meanwhile
                    await anyio.lowlevel.checkpoint()
                release.set()
    assert outer.cancelled_caught
    assert finished_before_cancel_seen == [True]
    worker.stop()


async def test_a_stopped_thread_takes_no_more_calls() -> None:
    worker = StoreThread()
    assert await worker.run(lambda: 1) == 1
    worker.stop()
    worker.stop()  # idempotent
    with pytest.raises(RuntimeError, match="stopped"):
        await worker.run(lambda: 2)


async def test_the_sqlite_async_store_uses_its_own_thread_until_closed(tmp_path: Path) -> None:
    astore = await AsyncStore.open(tmp_path / "relay.db")
    idents = {await astore.run(lambda _: threading.get_ident()) for _ in range(5)}
    assert len(idents) == 1 and threading.get_ident() not in idents
    assert astore._thread is not None and not astore._thread.stopped
    await astore.close()
    assert astore._thread.stopped


async def test_an_idle_thread_keeps_nothing_alive_and_ends_with_its_store(tmp_path: Path) -> None:
    """The thread holds no finished call (its store, its result) while it waits, and a
    handle dropped without close() stops its thread."""
    import gc
    import weakref

    class Result:
        pass

    worker = StoreThread()
    result = await worker.run(Result)
    seen = weakref.ref(result)
    del result
    await worker.run(lambda: None)  # the thread is past the first call
    gc.collect()
    assert seen() is None  # the idle thread does not hold the last result
    worker.stop()

    astore = await AsyncStore.open(tmp_path / "relay.db")
    await astore.run(lambda _: threading.get_ident())
    thread = astore._thread
    assert thread is not None and thread._thread is not None
    os_thread = thread._thread
    await astore.run(lambda s: s.close())
    del astore
    gc.collect()
    assert thread.stopped
    os_thread.join(5)
    assert not os_thread.is_alive()
