"""The daemon's lifecycle, in process: start, ready, stop and drain, crash, reload, --once,
systemd notifications, the health server and the request budget.

The emulator and the consumer (tests/support/receiver.py) sit behind ASGI transports; the daemon is
the real one, configured from a real TOML file.
"""

from __future__ import annotations

import functools
import json
import socket
import time
from pathlib import Path

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from sessionhook.relay.daemon import daemon as daemon_module
from sessionhook.relay.daemon import wiring
from sessionhook.relay.daemon.daemon import DaemonError
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.polling.budget import RateLimiter
from sessionhook.relay.store import EndpointQueries, Store
from tests.support import virtual_time
from tests.support.daemon_setup import Setup, completed
from tests.support.loopback import free_port
from tests.support.receiver import Receiver

pytestmark = pytest.mark.app

#: For a test that creates its sessions before the daemon starts: they are delivered. Without
#: it, a session that finished before the daemon's first look is history (archived, not
#: delivered): on a loaded machine the start takes longer than the emulator's 0.05 s steps.
BACKFILL = {"backfill": True}


def _settled(receiver: Receiver) -> bool:
    """A session's final state was delivered (its last event)."""
    return any(
        a.type == "session.state_changed" and a.body["data"]["session"]["state"] == "COMPLETED"
        for a in receiver.first_deliveries()
    )


@pytest.mark.anyio
async def test_runs_until_stopped_and_returns_cleanly(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    daemon = setup.daemon()
    async with setup.api_http() as http, anyio.create_task_group() as tg:
        api = setup.api(http)
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        await api.create_session("A short task")
        await setup.receiver.wait_for(lambda r: completed(r, 1), within=30)
        started = time.monotonic()
        daemon.stop()
    assert time.monotonic() - started < 2
    assert daemon.store is None  # closed
    assert setup.receiver.rejected == []


@pytest.mark.anyio
async def test_stop_lets_a_delivery_in_flight_finish(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    setup.receiver.delay = 1.0
    daemon = setup.daemon()
    async with setup.api_http() as http:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: daemon.run(handle_signals=False))
            # Created once the daemon runs: a session that finished before its first look
            # is history (archived, not delivered), as a loaded machine once made it.
            await daemon.ready.wait()
            await setup.api(http).create_session("Slow consumer")
            await setup.receiver.wait_for(lambda r: r.in_flight > 0, within=30)
            started = time.monotonic()
            daemon.stop()
        took = time.monotonic() - started
    assert took < daemon_module.DRAIN_SECONDS
    # What was in flight was answered and recorded as delivered, not cut off.
    with Store.open(setup.config.store.path) as store:
        delivered = {r.event_id for r in store.operator.list_deliveries(status="delivered")}
    assert {a.event_id for a in setup.receiver.arrivals} <= delivered
    assert delivered


@pytest.mark.anyio
async def test_drain_is_bounded_and_the_cut_delivery_stays_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(daemon_module, "DRAIN_SECONDS", 0.5)
    setup = Setup(tmp_path, poll=BACKFILL)
    setup.receiver.delay = 60.0
    daemon = setup.daemon()
    async with setup.api_http() as http:
        await setup.api(http).create_session("Stuck consumer")
    with capture_logs() as logs, anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: daemon.run(handle_signals=False))
            await setup.receiver.wait_for(lambda r: r.in_flight > 0, within=20)
            started = time.monotonic()
            daemon.stop()
        assert time.monotonic() - started < 5
    assert any(e["event"] == "relay.drain_timeout" for e in logs)
    with Store.open(setup.config.store.path) as store:
        assert store.outbox.pending_count() > 0  # the interrupted one is retried at the next start


@pytest.mark.anyio
async def test_a_dying_side_task_stops_the_daemon_loudly(tmp_path: Path) -> None:
    class Broken(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            raise RuntimeError("a bug in the sender")

    setup = Setup(tmp_path, poll=BACKFILL)
    daemon = setup.daemon(delivery_transport=Broken())
    async with setup.api_http() as http:
        await setup.api(http).create_session("Triggers the bug")
    with capture_logs() as logs, anyio.fail_after(30), pytest.raises(BaseExceptionGroup) as info:
        await daemon.run(handle_signals=False)
    assert info.group_contains(RuntimeError, match="a bug in the sender")
    assert any(e["event"] == "relay.crashed" and e["log_level"] == "error" for e in logs)
    assert daemon.store is None  # closed on the way out


@pytest.mark.anyio
async def test_reload_keeps_the_running_config_on_error_and_applies_a_good_one(
    tmp_path: Path,
) -> None:
    setup = Setup(tmp_path)
    daemon = setup.daemon()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        good = setup.config_path.read_text()
        setup.config_path.write_text(good + "\nunknown_key = 1\n")
        with capture_logs() as logs:
            assert await daemon.reload() is False
        failed = next(e for e in logs if e["event"] == "config.reload_failed")
        assert "unknown_key" in failed["error"]
        assert daemon.config is setup.config
        setup.config_path.write_text(
            good
            + "\n".join(
                [
                    "[[endpoints]]",
                    'name = "second"',
                    'url = "http://rx.test/second"',
                    f'secret = "{generate_secret()}"',
                ]
            )
            + "\n"
        )
        assert await daemon.reload() is True
        assert [e.name for e in daemon.config.endpoints] == ["rx", "second"]
        assert daemon.store is not None
        states = await daemon.store.run(EndpointQueries.endpoint_states)
        assert {s.name for s in states if s.active} == {"rx", "second"}
        assert daemon.dispatcher is not None
        assert set(daemon.dispatcher.settings.endpoints) == {"rx", "second"}
        daemon.stop()


@pytest.mark.anyio
async def test_a_reload_checks_templates_off_the_event_loop(tmp_path: Path) -> None:
    """Issue 20: a reload renders each template against every sample event (the start-up
    check): a template that takes long on them must not hold the daemon meanwhile."""
    setup = Setup(tmp_path)
    daemon = setup.daemon()
    busy = "{% for i in range(3000) %}{% for j in range(3) %}{% endfor %}{% endfor %}{}"
    ticks = 0
    reloaded = anyio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not reloaded.is_set():
            await anyio.sleep(0.01)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        setup.config_path.write_text(
            setup.config_path.read_text()
            + "\n".join(
                [
                    "[[endpoints]]",
                    'name = "busy"',
                    'url = "http://rx.test/busy"',
                    f'secret = "{generate_secret()}"',
                    f"template = {json.dumps(busy)}",
                ]
            )
            + "\n"
        )
        tg.start_soon(ticker)
        before = ticks
        assert await daemon.reload() is True
        reloaded.set()
        assert ticks > before  # the loop ran while 15 samples x 24,000 steps were checked
        daemon.stop()


@pytest.mark.anyio
async def test_once_delivers_everything_due_and_exits_zero(tmp_path: Path) -> None:
    now = [time.time()]
    setup = Setup(tmp_path, clock=lambda: now[0], poll={"backfill": True})
    async with setup.api_http() as http:
        api = setup.api(http)
        sources = (await api.list_sources()).sources
        await api.create_session("One", source=sources[0].name, automation_mode="AUTO_CREATE_PR")
        await api.create_session("Two")
        now[0] += 3600  # both sessions are long finished
        expected: set[str] = set()
        async for session in api.iter_sessions():
            expected |= {a.name async for a in api.iter_activities(session.name)}
    with anyio.fail_after(60):
        assert await setup.daemon().run_once() == 0
    delivered = setup.receiver.first_deliveries()
    activity_names = {
        a.body["data"]["activity"]["name"] for a in delivered if "activity" in a.body["data"]
    }
    assert activity_names == expected
    assert "session.pull_request_opened" in {a.type for a in delivered}
    # A second pass finds nothing new and sends nothing again.
    arrivals = len(setup.receiver.arrivals)
    with anyio.fail_after(60):
        assert await setup.daemon().run_once() == 0
    assert len(setup.receiver.arrivals) == arrivals


@pytest.mark.anyio
async def test_once_with_a_rejected_key_fails_with_one_clear_error(tmp_path: Path) -> None:
    setup = Setup(tmp_path, api_key="not-the-key")
    with pytest.raises(DaemonError, match="rejected the API key"):
        await setup.daemon().run_once()


@pytest.mark.anyio
async def test_a_store_that_cannot_be_opened_is_a_clean_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    setup = Setup(tmp_path, store={"path": str(blocker / "relay.db")})
    with pytest.raises(DaemonError, match="cannot open the store"):
        await setup.daemon().run_once()


@pytest.mark.anyio
async def test_systemd_hears_ready_watchdog_and_stopping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    messages: list[str] = []
    heard = {"WATCHDOG=1": anyio.Event(), "STOPPING=1": anyio.Event()}

    async def collect() -> None:
        watchdogs = 0
        while True:
            await anyio.wait_readable(sock)
            message = sock.recv(4096).decode()
            messages.append(message)
            watchdogs += message.startswith("WATCHDOG=1")
            if watchdogs >= 2:
                heard["WATCHDOG=1"].set()
            if message.startswith("STOPPING=1"):
                heard["STOPPING=1"].set()

    setup = Setup(tmp_path)
    daemon = setup.daemon()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            tg.start_soon(lambda: daemon.run(handle_signals=False))
            with anyio.fail_after(30):
                await heard["WATCHDOG=1"].wait()  # two pings, not just one
            daemon.stop()
            with anyio.fail_after(10):
                await heard["STOPPING=1"].wait()
            tg.cancel_scope.cancel()
    finally:
        sock.close()
    assert messages[0].startswith("READY=1")


@pytest.mark.anyio
async def test_health_server_answers_ready_and_metrics(tmp_path: Path) -> None:
    port = free_port()
    setup = Setup(tmp_path, server={"listen": f"127.0.0.1:{port}"})
    daemon = setup.daemon()
    async with setup.api_http() as api_http, anyio.create_task_group() as tg:
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        # Created once the daemon has made its first pass: a session it first sees already
        # finished is history and never gets a live COMPLETED state change.
        await daemon.ready.wait()
        await setup.api(api_http).create_session("Watched")
        await setup.receiver.wait_for(lambda r: completed(r, 1), within=30)
        # The session's last events (its pull request, COMPLETED) too: nothing is being
        # written when the store is made read-only below.
        await setup.receiver.wait_for(_settled, within=30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            ready = await http.get("/readyz")
            metrics = (await http.get("/metrics")).text
            # A store that can no longer be written (read-only mount, full disk) is not ready.
            store = daemon.store
            assert store is not None
            await store.run(lambda s: s.db.conn.execute("PRAGMA query_only = 1"))
            unwritable = await http.get("/readyz")
            await store.run(lambda s: s.db.conn.execute("PRAGMA query_only = 0"))
        daemon.stop()
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert unwritable.status_code == 503
    assert any("store" in reason for reason in unwritable.json()["reasons"]), unwritable.json()
    assert 'sessionhook_deliveries_total{endpoint="rx",outcome="delivered"}' in metrics
    assert 'sessionhook_upstream_requests_total{endpoint="list_activities",status="200"}' in metrics
    assert 'sessionhook_outbox_pending{endpoint="rx"}' in metrics


def _stored_upstream_requests(store: Store) -> int:
    return int(
        store.db.conn.execute("SELECT COALESCE(SUM(count), 0) FROM upstream_requests").fetchone()[0]
    )


@pytest.mark.anyio
async def test_every_upstream_request_reaches_the_stores_counters(tmp_path: Path) -> None:
    """The requests are counted in the store while the relay runs (not only at its stop),
    and after the stop the store counted exactly the requests the metrics counted: none
    lost on the way (they are written by a flusher, not by each request)."""
    setup = Setup(tmp_path, poll=BACKFILL)
    daemon = setup.daemon()
    async with setup.api_http() as http:
        for i in range(2):
            await setup.api(http).create_session(f"Counted {i}")
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await setup.receiver.wait_for(lambda r: completed(r, 2), within=30)
        store = daemon.store
        assert store is not None
        with anyio.fail_after(10):
            while True:
                if await store.run(_stored_upstream_requests) > 0:
                    break
                await anyio.sleep(0.05)
        daemon.stop()
    counted = sum(
        sample.value
        for family in daemon.metrics.upstream_requests.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )
    with Store.open(setup.config.store.path) as stored:
        assert _stored_upstream_requests(stored) == counted > 0


def test_upstream_requests_stay_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 s of the daemon on a fake clock (tests/support/virtual_time.py): the budget's
    clock is the loop's, which stands still while the store's thread works."""
    sent: list[float] = []
    busy = virtual_time.store_busy(monkeypatch)

    async def main(loop: virtual_time.VirtualTimeLoop) -> None:
        class Counting(httpx.AsyncBaseTransport):
            def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
                self._inner = inner

            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                sent.append(loop.time())
                return await self._inner.handle_async_request(request)

        monkeypatch.setattr(wiring, "RateLimiter", functools.partial(RateLimiter, clock=loop.time))
        setup = Setup(tmp_path, api={"requests_per_minute": 60})
        daemon = setup.daemon(upstream_transport=Counting(httpx.ASGITransport(setup.emulator)))
        async with setup.api_http() as http:
            for i in range(5):
                await setup.api(http).create_session(f"Busy {i}")
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: daemon.run(handle_signals=False))
            await daemon.ready.wait()
            await anyio.sleep(3.0)
            daemon.stop()

    virtual_time.run(main, busy=busy)
    # 60 a minute with a burst of 5: at most 5 + one a second, whatever the demand
    # (5 working sessions polled every 0.05 s would want hundreds).
    span = sent[-1] - sent[0]
    assert len(sent) <= 5 + span * 1.0 + 1
    assert len(sent) >= 3
