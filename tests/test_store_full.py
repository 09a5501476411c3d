"""A full disk: a failed write commits nothing and leaves the store usable; the daemon's
AsyncStore waits out the full disk and commits once space returns.

The first tests fill a real (tiny tmpfs) filesystem; the AsyncStore tests use SQLite's
``max_page_count``, which raises the very same SQLITE_FULL and needs no privilege.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import httpx
import pytest

from sessionhook.relay.store import (
    AsyncStore,
    Ingest,
    MetaQueries,
    Round,
    Store,
    StoreFullError,
    StoreUnwritableError,
)
from tests.support.daemon_setup import Setup, completed
from tests.support.loopback import free_port
from tests.support.tinyfs import Ballast, tiny_filesystem

pytestmark = pytest.mark.app

BIG = "x" * 200_000


def test_a_write_on_a_full_disk_commits_nothing_and_works_once_space_returns(
    tmp_path: Path,
) -> None:
    with tiny_filesystem(tmp_path / "fs", 1024) as fs, Store.open(fs / "relay.db") as store:
        store.meta.set_meta("before", "1")
        ballast = Ballast(fs)
        ballast.fill()
        failed = None
        for i in range(50):  # SQLite may still reuse space it holds: write until it cannot
            try:
                store.meta.set_meta(f"k{i}", BIG)
            except StoreFullError as exc:
                failed = i
                assert "database or disk is full" in str(exc)
                break
        assert failed is not None, "the filesystem never filled up"
        assert store.meta.get_meta(f"k{failed}") is None  # nothing of the failed write
        assert store.meta.get_meta("before") == "1"
        ballast.free()
        # The same write goes through: the failed COMMIT did not leave a transaction open.
        store.meta.set_meta(f"k{failed}", BIG)
        assert store.meta.get_meta(f"k{failed}") == BIG


def test_an_existing_store_opens_again_once_space_returns(tmp_path: Path) -> None:
    with tiny_filesystem(tmp_path / "fs", 1024) as fs:
        with Store.open(fs / "relay.db") as store:
            store.meta.set_meta("kept", "yes")
        ballast = Ballast(fs)
        ballast.fill()
        # A cleanly closed WAL store needs room for its -shm index to open.
        with pytest.raises(StoreFullError):
            Store.open(fs / "relay.db")
        with pytest.raises(StoreFullError, match="the disk is full"):
            Store.open_readonly(fs / "relay.db")  # what `sessionhook status` says
        ballast.free()
        with Store.open(fs / "relay.db") as store:
            assert store.meta.get_meta("kept") == "yes"


class Observer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.full = anyio.Event()
        self.retried = anyio.Event()

    def store_unwritable(self, error: StoreFullError, *, first: bool, retry_in: float) -> None:
        assert retry_in > 0
        self.calls.append(("full", first))
        (self.full if first else self.retried).set()

    def store_writable_again(self, *, after: float) -> None:
        assert after >= 0
        self.calls.append(("recovered", True))


async def _capped(path: Path, *, wait: bool = True) -> tuple[AsyncStore, Observer]:
    observer = Observer()
    store = await AsyncStore.open(path, wait_for_space=wait, observer=observer)
    store._retry_base = 0.02  # a test's patience, not production's
    pages = await store.run(lambda s: s.db.conn.execute("PRAGMA page_count").fetchone()[0])
    await store.run(lambda s: s.db.conn.execute(f"PRAGMA max_page_count = {pages}"))
    return store, observer


async def _uncap(store: AsyncStore) -> None:
    await store.run(lambda s: s.db.conn.execute("PRAGMA max_page_count = 1073741823"))


@pytest.mark.anyio
async def test_a_write_waits_for_space_then_commits(tmp_path: Path) -> None:
    store, observer = await _capped(tmp_path / "relay.db")
    done = anyio.Event()

    async def write() -> None:
        await store.run(MetaQueries.set_meta, "big", BIG)
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(write)
        with anyio.fail_after(10):
            await observer.full.wait()
        assert store.unwritable is not None and not done.is_set()
        assert observer.calls[0] == ("full", True)
        # Statistics are skipped rather than waited for; loops can wait for space.
        assert await store.run(MetaQueries.probe, "stat", BIG) is False
        with anyio.fail_after(10):
            await observer.retried.wait()  # retried with growing delays
        assert not done.is_set()
        await _uncap(store)
        with anyio.fail_after(10):
            await done.wait()
            await store.wait_writable()
    assert store.unwritable is None
    assert observer.calls[-1] == ("recovered", True)
    assert await store.run(MetaQueries.get_meta, "big") == BIG
    await store.close()


@pytest.mark.anyio
async def test_without_waiting_a_full_store_raises_at_once(tmp_path: Path) -> None:
    store, observer = await _capped(tmp_path / "relay.db", wait=False)
    with pytest.raises(StoreFullError):
        await store.run(MetaQueries.set_meta, "big", BIG)
    assert observer.calls == [("full", True)]
    await store.close()


@pytest.mark.anyio
async def test_stop_waiting_releases_a_waiting_write(tmp_path: Path) -> None:
    store, observer = await _capped(tmp_path / "relay.db")
    store._retry_base = 3600.0  # the write sleeps long: stop_waiting must wake it
    outcome: list[BaseException] = []

    async def write() -> None:
        try:
            await store.run(MetaQueries.set_meta, "big", BIG)
        except StoreFullError as exc:
            outcome.append(exc)

    with anyio.fail_after(10):  # the task group ends when the woken write has raised
        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            await observer.full.wait()
            store.stop_waiting()
    assert len(outcome) == 1
    assert await store.run(MetaQueries.get_meta, "big") is None
    await store.close()


@pytest.mark.anyio
async def test_the_daemon_starts_on_a_full_disk_and_opens_the_store_once_space_returns(
    tmp_path: Path,
) -> None:
    """A cleanly closed store cannot even be opened on a full disk (no room for its -shm):
    the daemon stays up, /readyz says why, and it starts for real once space returns."""
    # Once space returns, room for the WAL up to its checkpoint (1,000 pages, about 4 MiB):
    # on 1 MiB it filled the disk again within a second of the session's deliveries.
    with tiny_filesystem(tmp_path / "fs", 8192) as fs:
        with Store.open(fs / "relay.db") as store:
            store.meta.set_meta("kept", "yes")
        port = free_port()
        setup = Setup(
            tmp_path,
            server={"listen": f"127.0.0.1:{port}"},
            store={"path": str(fs / "relay.db")},
        )
        ballast = Ballast(fs)
        ballast.fill()
        daemon = setup.daemon()
        async with (
            setup.api_http() as api_http,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(lambda: daemon.run(handle_signals=False))
            reasons: list[str] = []
            with anyio.fail_after(30):
                while not any("waiting for disk space" in r for r in reasons):
                    try:
                        answer = await http.get("/readyz")
                    except httpx.TransportError:
                        answer = None  # not listening yet
                    if answer is not None:
                        assert answer.status_code == 503
                        reasons = answer.json()["reasons"]
                    await anyio.sleep(0.05)
            assert daemon.store is None and not daemon.ready.is_set()
            ballast.free()
            with anyio.fail_after(30):
                await daemon.ready.wait()
            await setup.api(api_http).create_session("After the disk filled up")
            await setup.receiver.wait_for(lambda r: completed(r, 1), within=30)
            assert (await http.get("/readyz")).status_code == 200
            daemon.stop()
        with Store.open(fs / "relay.db") as store:
            assert store.meta.get_meta("kept") == "yes"


@pytest.mark.anyio
async def test_a_daemon_cancelled_while_a_delivery_waits_for_space_ends(tmp_path: Path) -> None:
    """Cancelled from outside (not stopped: a side task that died, a caller giving up)
    while a POST's result waits for disk space under its shield: the write gives up, the
    daemon ends and the delivery stays open (sent again later), rather than waiting for
    space that may never return."""
    setup = Setup(tmp_path)
    daemon = setup.daemon()
    scope = anyio.CancelScope()
    ended = anyio.Event()
    waiting = anyio.Event()
    loop = anyio.lowlevel.current_token()

    async def run() -> None:
        with scope:
            await daemon.run(handle_signals=False)
        ended.set()

    async with setup.api_http() as api_http, anyio.create_task_group() as tg:
        tg.start_soon(run)
        await daemon.ready.wait()
        store = daemon.store
        assert store is not None
        outbox = store.store.outbox
        real = outbox.dispatch_round

        def dispatch_round(round_: Round) -> Any:
            if round_.records:  # the disk is full from the first POST's result on
                anyio.from_thread.run_sync(waiting.set, token=loop)
                raise StoreFullError("database or disk is full")
            return real(round_)

        outbox.dispatch_round = dispatch_round  # type: ignore[method-assign]
        await setup.api(api_http).create_session("Sent, not recorded")
        with anyio.fail_after(30):
            await waiting.wait()
        scope.cancel()
        with anyio.move_on_after(30):
            await ended.wait()
        hung = not ended.is_set()
        if hung:
            store.stop_waiting()  # let it end: the test fails instead of hanging
    assert not hung, "the cancelled daemon went on waiting for disk space"
    assert setup.receiver.arrivals
    with Store.open(setup.config.store.path) as reopened:
        assert reopened.outbox.pending_count() > 0  # sent, not recorded: sent again later


@pytest.mark.anyio
async def test_the_pollers_reads_wait_out_an_unreachable_store(tmp_path: Path) -> None:
    # A PostgreSQL restart under a poller's read (latest_activity, get_session): the read
    # waits and retries like a write, instead of raising into the task (which ended the
    # relay); `call` still raises at once (the web console answers 503 with it).
    store = AsyncStore(Store.open(tmp_path / "relay.db"), retry_base=0.01)
    failures = [StoreUnwritableError("the database is restarting")] * 2
    real = store.store.ingest.get_session

    def get_session(name: str) -> object:
        if failures:
            raise failures.pop()
        return real(name)

    store.store.ingest.get_session = get_session  # type: ignore[method-assign,assignment]
    with pytest.raises(StoreUnwritableError):
        # Once (a function without a policy): the failure is raised.
        await store.run(lambda s, name: s.ingest.get_session(name), "sessions/1")
    with anyio.fail_after(10):
        assert await store.run(Ingest.get_session, "sessions/1") is None
    assert not failures
    store.stop_waiting()
    failures.append(StoreUnwritableError("gone for good"))
    with pytest.raises(StoreUnwritableError):
        await store.run(Ingest.get_session, "sessions/1")  # a stopping daemon is not held up
    await store.close()
