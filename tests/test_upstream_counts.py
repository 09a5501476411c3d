"""Upstream answers are counted as what they are: a 2xx answer that does not parse is
``malformed`` (never ``200``), and a refused key (401/403) is an error in ``status``."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import httpx
import pytest

from sessionhook.api import RetryPolicy
from sessionhook.api.client import SessionsClient
from sessionhook.api.errors import MalformedResponseError, TransportError, UnauthenticatedError
from sessionhook.relay.daemon.upstream import UpstreamCounter, UpstreamTally
from sessionhook.relay.polling.budget import MALFORMED, LimitedTransport, RateLimiter
from sessionhook.relay.store import AsyncStore, Store
from sessionhook.relay.telemetry.metrics import Metrics

pytestmark = pytest.mark.app

GOOD = {"sessions": [{"name": "sessions/1", "id": "1", "state": "QUEUED"}]}


def recording(
    handler: Callable[[httpx.Request], httpx.Response], *, settle_success: bool
) -> tuple[LimitedTransport, list[tuple[str, object]]]:
    """A budgeted transport over ``handler`` that records (label, status) of each request."""
    recorded: list[tuple[str, object]] = []

    async def record(label: str, status: object) -> None:
        recorded.append((label, status))

    transport = LimitedTransport(
        httpx.MockTransport(handler),
        RateLimiter(6000),
        record=record,
        settle_success=settle_success,
    )
    return transport, recorded


def rig(
    answers: list[httpx.Response],
) -> tuple[SessionsClient, LimitedTransport, list[tuple[str, object]], httpx.AsyncClient]:
    transport, recorded = recording(lambda request: answers.pop(0), settle_success=True)
    http = httpx.AsyncClient(transport=transport)
    client = SessionsClient(
        http,
        base_url="http://api.test",
        api_key="k",
        retry=RetryPolicy(max_attempts=1),
        on_answer=transport.settle,
    )
    return client, transport, recorded, http


@pytest.mark.anyio
async def test_malformed_2xx_is_counted_as_malformed_not_200() -> None:
    client, _, recorded, http = rig(
        [
            httpx.Response(200, json=GOOD),
            httpx.Response(200, text="<html>Bad gateway</html>"),
            httpx.Response(200, json={"sessions": "not a list"}),
            httpx.Response(200, json=[1, 2]),
        ]
    )
    async with http:
        await client.list_sessions()
        for _ in range(3):
            with pytest.raises(MalformedResponseError):
                await client.list_sessions()
    assert recorded == [
        ("list_sessions", 200),
        ("list_sessions", MALFORMED),
        ("list_sessions", MALFORMED),
        ("list_sessions", MALFORMED),
    ]


@pytest.mark.anyio
async def test_errors_and_failures_are_recorded_by_the_transport_once() -> None:
    client, transport, recorded, http = rig(
        [
            httpx.Response(401, json={"error": {"code": 401, "status": "UNAUTHENTICATED"}}),
            httpx.Response(204),
        ]
    )
    async with http:
        with pytest.raises(UnauthenticatedError):
            await client.list_sessions()
        await client.delete_session("sessions/1")
        # settle() again for an answer already counted changes nothing.
        response = httpx.Response(200, request=httpx.Request("GET", "http://api.test/x"))
        await transport.settle(response, True)
    assert recorded == [("list_sessions", 401), ("delete_session", 204)]


@pytest.mark.anyio
async def test_without_settling_the_transport_records_2xx_itself() -> None:
    transport, recorded = recording(lambda r: httpx.Response(200, json=GOOD), settle_success=False)
    async with httpx.AsyncClient(transport=transport) as http:
        await SessionsClient(http, base_url="http://api.test", api_key="k").list_sessions()
    assert recorded == [("list_sessions", 200)]


def test_metrics_label_malformed() -> None:
    metrics = Metrics()
    metrics.upstream_request("list_sessions", MALFORMED)
    metrics.upstream_request("list_sessions", 401)
    text = metrics.render().decode()
    assert 'upstream_requests_total{endpoint="list_sessions",status="malformed"} 1.0' in text
    assert 'status="200"' not in text


def test_status_counts_refused_keys_and_malformed_answers_as_errors(tmp_path: Path) -> None:
    now = time.time()
    with Store.open(tmp_path / "s.db") as store:
        for status in (200, 200, 401, 401, 403, MALFORMED, MALFORMED, 429, 500, None, 404):
            store.economy.record_upstream("list_sessions", status, now)
        up = store.operator.status_summary(now).upstream
    assert up.requests_last_hour == 11
    assert up.throttled_last_hour == 1
    assert up.errors_last_hour == 8  # 3 refused, 2 malformed, 500, no answer, 404
    assert up.rejected_last_hour == 3
    assert up.malformed_last_hour == 2


class _Drip(httpx.AsyncByteStream):
    """A body that sends one chunk, then fails (``fail``) or goes on forever."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"sessions": ['
        if self.fail:
            raise httpx.ReadError("connection reset mid-body")
        while True:
            await anyio.sleep(0.01)  # a slow drip: each chunk waits (and can be cancelled)
            yield b" " * 1024


def counted(stream: httpx.AsyncByteStream) -> tuple[LimitedTransport, list[tuple[str, object]]]:
    return recording(lambda r: httpx.Response(200, stream=stream), settle_success=True)


@pytest.mark.anyio
async def test_a_2xx_body_the_reader_gives_up_on_is_malformed() -> None:
    """A bound on the answer's size (the reader stops and closes) counts it as malformed,
    even when the client never gets to settle it."""
    transport, recorded = counted(_Drip(fail=False))
    async with httpx.AsyncClient(transport=transport) as http:
        request = http.build_request("GET", "http://api.test/v1alpha/sessions")
        response = await http.send(request, stream=True)
        read = 0
        async for chunk in response.aiter_raw():
            read += len(chunk)
            if read > 4096:
                break
        await response.aclose()
        await transport.settle(response, False)  # too late: counted once, as malformed
    assert recorded == [("list_sessions", MALFORMED)]


@pytest.mark.anyio
async def test_a_2xx_body_cut_by_a_read_error_or_deadline_is_no_answer() -> None:
    transport, recorded = counted(_Drip(fail=True))
    async with httpx.AsyncClient(transport=transport) as http:
        client = SessionsClient(
            http, base_url="http://api.test", api_key="k", retry=RetryPolicy(max_attempts=1)
        )
        with pytest.raises(TransportError):
            await client.list_sessions()
    assert recorded == [("list_sessions", None)]

    transport, recorded = counted(_Drip(fail=False))
    async with httpx.AsyncClient(transport=transport) as http:
        with anyio.move_on_after(0.2):
            await http.get("http://api.test/v1alpha/sessions")
    assert recorded == [("list_sessions", None)]


def _host(store: AsyncStore, tally: UpstreamTally | None) -> UpstreamCounter:
    """The daemon's upstream counter on a store, with its own metrics and a fixed clock."""
    counter = UpstreamCounter(Metrics(), lambda: 1_750_000_000.0, lambda: store)
    counter.tally = tally
    return counter


@pytest.mark.anyio
async def test_a_request_is_counted_without_waiting_for_the_store(tmp_path: Path) -> None:
    """While the relay runs, an answered request is counted at once (metrics) and on its
    way to the store's counters: it does not wait behind the store's queue (one thread on
    SQLite, busy with page ingests in a backfill). The flusher writes the batch later."""
    astore = await AsyncStore.open(tmp_path / "s.db")
    gate = threading.Event()
    tally = UpstreamTally()
    host = _host(astore, tally)
    try:
        async with anyio.create_task_group() as tg:
            # The store's one thread is busy (a function over the store: a call).
            tg.start_soon(astore.run, lambda _store: gate.wait())
            await anyio.sleep(0.05)
            with anyio.fail_after(5):
                for status in (200, 200, 429):
                    await host.record("get_session", status)
            gate.set()
        await tally.flush(astore)
        await tally.flush(astore)  # nothing left: nothing written twice
        rows = await astore.run(
            lambda s: sorted(
                s.db.conn.execute("SELECT label, status, count FROM upstream_requests")
            )
        )
        assert rows == [("get_session", 200, 2), ("get_session", 429, 1)]
        assert 'upstream_requests_total{endpoint="get_session",status="200"} 2.0' in (
            host.metrics.render().decode()
        )
    finally:
        gate.set()
        await astore.close()


@pytest.mark.anyio
async def test_the_tally_writes_what_is_added_while_it_runs(tmp_path: Path) -> None:
    astore = await AsyncStore.open(tmp_path / "s.db")
    tally = UpstreamTally()

    async def total() -> int:
        return int(
            (
                await astore.run(
                    lambda s: s.db.conn.execute(
                        "SELECT COALESCE(SUM(count), 0) FROM upstream_requests"
                    ).fetchone()
                )
            )[0]
        )

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(tally.run, astore)
            for n in range(1, 4):
                tally.add("list_activities", 200, 1_750_000_000.0)
                with anyio.fail_after(5):
                    while True:
                        if await total() >= n:
                            break
                        await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        assert await total() == 3
    finally:
        await astore.close()
