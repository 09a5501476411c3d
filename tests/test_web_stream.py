"""``GET /v1/events/stream`` over a real loopback socket: live append, resume with
Last-Event-ID (nothing missed, nothing repeated), filters, access, the stream cap, heartbeats
and a consumer that stops reading. Every test runs on both store engines (``backend``)."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from sessionhook.relay.domain.rows import EventRow
from sessionhook.relay.store import AsyncStore, StoreUnwritableError, postgres
from sessionhook.relay.web import Bell, create_app
from sessionhook.relay.web import server as health
from sessionhook.relay.web import stream as stream_module
from tests.support.backends import Backend
from tests.support.loopback import free_port
from tests.support.pg import Cluster
from tests.support.web_relay import AUTH, TOKEN, Message, WebRelay, read_messages, web_context

pytestmark = [pytest.mark.app, pytest.mark.anyio]


@asynccontextmanager
async def relay(backend: Backend, **server: Any) -> AsyncIterator[WebRelay]:
    """The web app over ``backend``'s store (each test runs on SQLite and PostgreSQL)."""
    listen = f"127.0.0.1:{free_port()}"
    astore = AsyncStore(backend.open())
    ctx = web_context(astore, listen, **server)
    app = create_app(ctx)
    try:
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(health.serve, listen, app)
            yield WebRelay(astore, f"http://{host}:{port}", ctx.bell)
            tg.cancel_scope.cancel()
    finally:
        await astore.close()


def _same(message: Message, row: EventRow) -> None:
    assert message.id == row.id and message.event == row.type
    assert message.data.encode() == row.body  # the exact bytes the webhook gets


async def test_live_events_arrive_with_webhook_id_type_and_body(backend: Backend) -> None:
    async with relay(backend) as r, httpx.AsyncClient(base_url=r.url, headers=AUTH) as http:
        await r.archive(3)  # before the stream opened: not sent
        async with http.stream("GET", "/v1/events/stream") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            rows = await r.archive(2)
            got = await read_messages(response, 2)
    for message, row in zip(got, rows, strict=True):
        _same(message, row)
        assert json.loads(message.data)["data"]["text"] == "é\nline"


async def test_resume_after_a_killed_consumer_misses_and_repeats_nothing(backend: Backend) -> None:
    async with relay(backend) as r, httpx.AsyncClient(base_url=r.url, headers=AUTH) as http:
        rows = await r.archive(10)
        seen: list[Message] = []
        headers = {"last-event-id": rows[2].id}
        async with http.stream("GET", "/v1/events/stream", headers=headers) as response:
            seen += await read_messages(response, 4)
            # The consumer dies here, with events it never read still coming.
        rows += await r.archive(5)
        headers = {"last-event-id": seen[-1].id}
        async with http.stream("GET", "/v1/events/stream", headers=headers) as response:
            later = r.archive(3)
            seen += await read_messages(response, 3 + 5)
            rows += await later
            seen += await read_messages(response, 3)
    assert [m.id for m in seen] == [row.id for row in rows[3:]]
    for message, row in zip(seen, rows[3:], strict=True):
        _same(message, row)


async def test_resume_position_from_the_query_and_unknown_ids(backend: Backend) -> None:
    async with relay(backend) as r, httpx.AsyncClient(base_url=r.url, headers=AUTH) as http:
        rows = await r.archive(4)
        url = f"/v1/events/stream?last_event_id={rows[0].id}"
        async with http.stream("GET", url) as response:
            assert [m.id for m in await read_messages(response, 3)] == [x.id for x in rows[1:]]
        # The header (an EventSource reconnecting) wins over the URL it was opened with.
        async with http.stream("GET", url, headers={"last-event-id": rows[2].id}) as response:
            assert [m.id for m in await read_messages(response, 1)] == [rows[3].id]
        unknown = await http.get("/v1/events/stream", headers={"last-event-id": "evt_nope"})
        assert unknown.status_code == 400 and "evt_nope" in unknown.json()["error"]["message"]
        too_many = await http.get("/v1/events/stream", params=[("type", "a")] * 40)
        assert too_many.status_code == 400


async def test_type_globs_and_session_filter(backend: Backend) -> None:
    async with relay(backend) as r, httpx.AsyncClient(base_url=r.url, headers=AUTH) as http:
        start = (await r.archive(1))[0].id
        wanted = []
        await r.archive(2, kind="activity.progress_updated")
        wanted += await r.archive(2, kind="session.completed")
        await r.archive(2, kind="session.completed", session="sessions/2")
        wanted += await r.archive(1, kind="session.failed")
        wanted += await r.archive(1, kind="activity.plan_generated")
        params = [("type", "session.*"), ("type", "*.plan_*"), ("session", "sessions/1")]
        headers = {"last-event-id": start}
        async with http.stream(
            "GET", "/v1/events/stream", params=params, headers=headers
        ) as response:
            got = await read_messages(response, len(wanted))
    assert [m.id for m in got] == [row.id for row in wanted]
    assert [m.event for m in got] == [
        "session.completed",
        "session.completed",
        "session.failed",
        "activity.plan_generated",
    ]


async def test_access_needs_the_token(backend: Backend) -> None:
    async with relay(backend) as r, httpx.AsyncClient(base_url=r.url) as http:
        assert (await http.get("/v1/events/stream")).status_code == 401
        wrong = await http.get("/v1/events/stream", headers={"authorization": "Bearer x" * 5})
        assert wrong.status_code == 401
        # A browser logged in with the cookie (EventSource sends cookies, not headers).
        login = await http.post("/login", data={"token": TOKEN})
        assert login.status_code == 303
        rows = await r.archive(2)
        headers = {"last-event-id": rows[0].id}
        async with http.stream("GET", "/v1/events/stream", headers=headers) as response:
            assert response.status_code == 200
            assert [m.id for m in await read_messages(response, 1)] == [rows[1].id]


async def test_the_number_of_streams_is_capped(backend: Backend) -> None:
    async with (
        relay(backend, max_streams=1) as r,
        httpx.AsyncClient(base_url=r.url, headers=AUTH) as http,
    ):
        async with http.stream("GET", "/v1/events/stream") as first:
            assert first.status_code == 200
            second = await http.get("/v1/events/stream")
            assert second.status_code == 503 and second.headers["retry-after"]
        # The slot is given back when the first consumer leaves.
        with anyio.fail_after(10):
            while True:
                rows = await r.archive(2)
                async with http.stream(
                    "GET", "/v1/events/stream", headers={"last-event-id": rows[0].id}
                ) as again:
                    if again.status_code == 200:
                        assert [m.id for m in await read_messages(again, 1)] == [rows[1].id]
                        break
                await anyio.sleep(0.05)


async def test_an_idle_stream_gets_heartbeats(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_module, "HEARTBEAT_SECONDS", 0.2)
    monkeypatch.setattr(stream_module, "POLL_SECONDS", 0.05)
    async with (
        relay(backend) as r,
        httpx.AsyncClient(base_url=r.url, headers=AUTH) as http,
        http.stream("GET", "/v1/events/stream") as response,
    ):
        beats = 0
        with anyio.fail_after(10):
            async for line in response.aiter_lines():
                beats += line == ": keep-alive"
                if beats == 2:
                    break
    assert beats == 2


async def test_events_from_another_writer_arrive_without_a_ring(backend: Backend) -> None:
    """Another replica's events reach the stream through the store poll."""
    async with (
        relay(backend) as r,
        httpx.AsyncClient(base_url=r.url, headers=AUTH) as http,
        http.stream("GET", "/v1/events/stream") as response,
    ):
        r.bell = Bell()  # this "replica" rings a bell nobody listens to
        rows = await r.archive(1)
        got = await read_messages(response, 1, within=10)
    assert [m.id for m in got] == [rows[0].id]


async def test_a_consumer_that_stops_reading_is_dropped_not_buffered(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_module, "SEND_TIMEOUT", 0.5)
    async with relay(backend) as r:
        host, port = r.url.removeprefix("http://").split(":")
        with capture_logs() as logs, socket.create_connection((host, int(port))) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(
                f"GET /v1/events/stream HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
            )
            # Far more than the socket buffers hold; the consumer never reads.
            for _ in range(40):
                await r.archive(10, size=64 * 1024)
                if any(e["event"] == "stream.stalled" for e in logs):
                    break
            with anyio.fail_after(20):
                # The log is the only signal the server gives; poll it under the deadline.
                while not any(e["event"] == "stream.closed" for e in logs):  # noqa: ASYNC110
                    await anyio.sleep(0.05)
    assert any(e["event"] == "stream.stalled" for e in logs)
    closed = next(e for e in logs if e["event"] == "stream.closed")
    assert closed["sent"] < r.count  # it fell behind and was let go


async def test_a_database_outage_ends_the_stream_and_it_resumes_after(
    pg_cluster: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL stops under an open stream and the console: the stream ends
    (``stream.failed``), a reconnect while the database is down and the console's pages
    are a 503 with one log line (no traceback); once the database is back, the consumer
    resumes with Last-Event-ID and misses nothing, repeats nothing."""
    monkeypatch.setattr(postgres, "CONNECT_TIMEOUT", 1.0)  # each failed read waits less
    async with (
        relay(Backend("postgresql", pg_url)) as r,
        httpx.AsyncClient(base_url=r.url, headers=AUTH, timeout=30) as http,
    ):
        rows = await r.archive(3)
        with capture_logs() as logs:
            headers = {"last-event-id": rows[0].id}
            async with http.stream("GET", "/v1/events/stream", headers=headers) as response:
                seen = await read_messages(response, 2)
                # A fast stop: the test cluster commits asynchronously (tests/support/pg.py), so an
                # immediate one could lose what was just written; a real server would not.
                await anyio.to_thread.run_sync(pg_cluster.stop)
                try:
                    with pytest.raises(AssertionError, match="stream ended"):
                        await read_messages(response, 1, within=30)
                    page = await http.get("/console")
                    again = await http.get(
                        "/v1/events/stream", headers={"last-event-id": seen[-1].id}
                    )
                finally:
                    await anyio.to_thread.run_sync(pg_cluster.start)
        assert page.status_code == 503 and "database" in page.text
        assert again.status_code == 503 and again.headers["retry-after"]
        events = [e["event"] for e in logs]
        assert "stream.failed" in events and "web.store_failed" in events
        assert not [e for e in logs if e.get("exc_info")]
        with anyio.fail_after(60):
            while True:  # until the pool has reconnected (it backs off while the server is down)
                try:
                    rows += await r.archive(2)
                    break
                except StoreUnwritableError:
                    await anyio.sleep(0.5)
        headers = {"last-event-id": seen[-1].id}
        async with http.stream("GET", "/v1/events/stream", headers=headers) as response:
            seen += await read_messages(response, 2)
    assert [m.id for m in seen] == [row.id for row in rows[1:]]


class CountingStore:
    """A store that adds up the bytes of the event bodies it hands out."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.read_bytes = 0
        self.operator = _CountingOperator(self, inner.operator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _CountingOperator:
    """The operator role of a :class:`CountingStore`: its ``events_after`` counted."""

    def __init__(self, store: CountingStore, role: Any) -> None:
        self.store = store
        self.role = role

    def __getattr__(self, name: str) -> Any:
        return getattr(self.role, name)

    def events_after(self, seq: int, **kwargs: Any) -> list[EventRow]:
        rows: list[EventRow] = self.role.events_after(seq, **kwargs)
        self.store.read_bytes += sum(len(r.body) for r in rows)
        return rows


async def test_a_stream_holds_a_bounded_number_of_bytes_whatever_the_consumer(
    backend: Backend,
) -> None:
    """A consumer that reads nothing, modelled at the ASGI boundary as uvicorn behaves:
    each write goes into the transport's buffer, and the next one waits while that holds
    more than 64 KiB (it never drains here). The stream may hold a page of bytes, never a
    page of events: 30 events of 100 KB, resumed from the first."""
    counting = CountingStore(backend.open())
    astore = AsyncStore(counting)  # type: ignore[arg-type]
    ctx = web_context(astore, "127.0.0.1:9187")
    r = WebRelay(astore, "", ctx.bell)
    size = 100_000
    rows = await r.archive(31, size=size)
    counting.read_bytes = 0
    app = create_app(ctx)
    high_water = 64 * 1024
    buffered = 0
    blocked = anyio.Event()

    async def send(message: Any) -> None:
        nonlocal buffered
        if buffered > high_water:  # uvicorn's flow control: wait for a drain
            blocked.set()
            await anyio.sleep_forever()
        buffered += len(message.get("body", b""))

    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> Any:
        if requests:
            return requests.pop()
        await anyio.sleep_forever()  # the consumer never hangs up

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/events/stream",
        "raw_path": b"/v1/events/stream",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", f"Bearer {TOKEN}".encode()),
            (b"last-event-id", rows[0].id.encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 9187),
        "scheme": "http",
        "http_version": "1.1",
        "root_path": "",
    }
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(app, scope, receive, send)
            with anyio.fail_after(20):
                await blocked.wait()
            tg.cancel_scope.cancel()
    finally:
        await astore.close()
    largest = max(len(row.body) for row in rows)
    assert counting.read_bytes <= stream_module.PAGE_BYTES + largest
    assert buffered <= high_water + stream_module.WRITE_BYTES


async def test_a_message_is_made_in_pieces_of_bounded_size() -> None:
    """A big body (its lines too: each one is a ``data:`` line) is formatted piece by piece
    as it is written, never copied whole; the pieces make the SSE message exactly."""
    limit = stream_module.WRITE_BYTES
    lines = [b"x" * 70_000, b"", b"\n" * 20_000, b'{"a":1}']
    for body in (b"{}", b"y" * (3 * limit + 5), b"\n".join(lines)):
        row = EventRow(1, "evt_1", "sessions/1", "t.x", None, "", 0.0, 0.0, body)
        pieces = list(stream_module.message_pieces(row))
        assert all(len(piece) <= limit for piece in pieces)
        message = b"".join(pieces)
        expected = b"id: evt_1\nevent: t.x\n" + b"".join(
            b"data: " + line + b"\n" for line in body.split(b"\n")
        )
        assert message == expected + b"\n"
