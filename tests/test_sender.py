# Confusable characters (fullwidth digits, ideographic full stops) are what this tests.
# ruff: noqa: RUF001, RUF002
"""The daemon's webhook client (aiohttp) keeps post_event's contract over real sockets:
signed, no redirects, the answer read only up to the limit, the whole exchange bounded,
network failures as results, keep-alive connections reused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from sessionhook.relay.delivery.dispatcher import DeliverySettings, Dispatcher
from sessionhook.relay.delivery.post import post_event
from sessionhook.relay.delivery.sender import AiohttpPoster
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.store import AsyncStore, EndpointQueries
from tests.support.dispatch_rig import PER_SESSION, seed_sessions
from tests.support.rebinding import PRIVATE, PUBLIC, Listener, Rebinder, rebinding_config
from tests.support.spellings import loopback_spellings

pytestmark = pytest.mark.app

SECRET = generate_secret()
BODY = json.dumps({"type": "activity.plan_generated", "timestamp": "t", "data": {}}).encode()

Answerer = Callable[[bytes, bytes, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def server(answer: Answerer) -> AsyncIterator[tuple[str, dict[str, int]]]:
    """A raw HTTP/1.1 server on 127.0.0.1: ``answer(head, body, writer)`` per request."""
    stats = {"connections": 0, "requests": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stats["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                stats["requests"] += 1
                await answer(head, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/hook", stats
    finally:
        srv.close()


async def _post(url: str, poster: AiohttpPoster, *, limit_s: float = 5.0, limit: int = 64) -> Any:
    return await post_event(
        poster,
        url=url,
        secrets=[SECRET],
        event_id="evt_0123",
        body=BODY,
        timeout=limit_s,
        body_limit=limit,
    )


def reply(status: int, body: bytes = b"", extra: str = "") -> Answerer:
    async def answer(head: bytes, _body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body
        )
        await writer.drain()

    return answer


@pytest.mark.anyio
async def test_signed_post_and_keep_alive_connections() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def answer(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        seen.append((head, body))
        await reply(204)(head, body, writer)

    poster = AiohttpPoster(allow_private=True)
    try:
        async with server(answer) as (url, stats):
            results = [await _post(url, poster) for _ in range(20)]
    finally:
        await poster.aclose()
    assert all(r.status_code == 204 and r.error is None for r in results)
    assert stats == {"connections": 1, "requests": 20}  # one connection, kept alive
    head, body = seen[0]
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /hook HTTP/1.1"
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
    assert body == BODY
    assert Webhook(SECRET).verify(body, headers)["type"] == "activity.plan_generated"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"].startswith("sessionhook/")


@pytest.mark.anyio
async def test_redirects_are_not_followed_and_retry_after_is_read() -> None:
    poster = AiohttpPoster(allow_private=True)
    try:
        async with server(reply(307, b"", "location: /elsewhere\r\n")) as (url, stats):
            moved = await _post(url, poster)
            assert stats["requests"] == 1  # the Location was not followed
        async with server(reply(429, b"slow down", "retry-after: 7\r\n")) as (url, _stats):
            throttled = await _post(url, poster)
    finally:
        await poster.aclose()
    assert moved.status_code == 307
    assert throttled.status_code == 429 and throttled.retry_after == 7.0
    assert throttled.response_body == "slow down"


@pytest.mark.anyio
async def test_a_huge_answer_is_read_only_up_to_the_limit() -> None:
    poster = AiohttpPoster(allow_private=True)
    try:
        async with server(reply(200, b"x" * 5_000_000)) as (url, _stats):
            result = await _post(url, poster, limit=100)
    finally:
        await poster.aclose()
    assert result.status_code == 200 and result.response_body == "x" * 100


@pytest.mark.anyio
async def test_a_dripping_answer_is_a_timeout_of_the_whole_exchange() -> None:
    async def drip(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
        for _ in range(1000):  # one byte every 50 ms: each read is quick, the whole is not
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.05)

    poster = AiohttpPoster(allow_private=True)
    try:
        async with server(drip) as (url, _stats):
            result = await _post(url, poster, limit_s=0.5, limit=10_000)
    finally:
        await poster.aclose()
    assert result.status_code is None
    assert result.error == "timeout after 0.5 s"


@pytest.mark.anyio
async def test_network_failures_are_results_not_exceptions() -> None:
    poster = AiohttpPoster(allow_private=True)

    async def hang_up(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()

    try:
        async with server(reply(204)) as (url, _stats):
            pass  # closed: nothing listens on that port any more
        refused = await _post(url, poster)
        async with server(hang_up) as (url, _stats):
            reset = await _post(url, poster)
    finally:
        await poster.aclose()
    for result in (refused, reset):
        assert result.status_code is None
        assert result.error and "\n" not in result.error


@pytest.mark.anyio
async def test_a_post_on_a_connection_closed_before_the_answer_is_sent_once_more() -> None:
    """A receiver closing a kept-alive connection as the next POST goes out on it (Node's
    and uvicorn's servers close idle ones after 5 s): the POST goes again on a new one."""
    requests_on: dict[int, int] = {}

    async def close_when_reused(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        connection = id(writer)
        requests_on[connection] = requests_on.get(connection, 0) + 1
        if requests_on[connection] > 1:
            writer.transport.abort()  # the idle connection closed as the POST arrived
            return
        await reply(204)(head, body, writer)

    poster = AiohttpPoster(allow_private=True)
    try:
        async with server(close_when_reused) as (url, stats):
            first = await _post(url, poster)
            second = await _post(url, poster)
    finally:
        await poster.aclose()
    assert first.status_code == 204
    assert second.status_code == 204 and second.error is None
    # The second POST: on the kept connection (closed), then on a new one.
    assert stats == {"connections": 2, "requests": 3}


@pytest.mark.anyio
async def test_a_receiver_that_always_hangs_up_gets_two_sends_then_a_failed_attempt() -> None:
    async def hang_up(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()

    async def answer_then_drop(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        writer.transport.abort()

    poster = AiohttpPoster(allow_private=True)
    try:
        async with server(hang_up) as (url, hung):
            hung_up = await _post(url, poster)
        async with server(answer_then_drop) as (url, dropped):
            cut = await _post(url, poster)
    finally:
        await poster.aclose()
    assert hung_up.status_code is None and hung_up.error
    assert hung == {"connections": 2, "requests": 2}  # once more, never a third time
    # An answer had begun: what came is the attempt's result, nothing is sent again.
    assert dropped == {"connections": 1, "requests": 1}
    assert cut.status_code is None and (cut.error or "").startswith("ClientPayloadError")


@pytest.mark.anyio
async def test_a_resend_stays_within_the_attempts_timeout() -> None:
    async def slow_hang_up(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(1.0)
        writer.transport.abort()

    poster = AiohttpPoster(allow_private=True)
    try:
        async with server(slow_hang_up) as (url, stats):
            result = await _post(url, poster, limit_s=1.5)
    finally:
        await poster.aclose()
    assert result.error == "timeout after 1.5 s"
    assert stats["requests"] == 2  # the second send was cut by what was left of 1.5 s


@pytest.mark.anyio
async def test_an_idle_connection_is_not_kept_past_idle_keep_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(AiohttpPoster, "IDLE_KEEP_S", 1.0)
    poster = AiohttpPoster(allow_private=True)
    try:
        async with server(reply(204)) as (url, stats):
            await _post(url, poster)
            await _post(url, poster)  # at once: the same connection
            await asyncio.sleep(2.5)
            await _post(url, poster)  # idle past the keep: a new one
    finally:
        await poster.aclose()
    assert stats == {"connections": 2, "requests": 3}


# --------------------------------------------------------------------------- normalized hosts


def _port(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


@pytest.mark.anyio
async def test_a_stored_url_spelling_loopback_otherwise_is_refused_with_nothing_sent() -> None:
    """yarl (aiohttp's URLs) reads ``127。0。0。1`` as ``127.0.0.1`` and aiohttp connects to a
    literal without asking its resolver. A URL that reached the sender unchecked (written
    into the store directly, by an older version) is judged on the host the client will
    connect to: every spelling refused, not one connection."""
    poster = AiohttpPoster(allow_private=False)
    try:
        async with server(reply(204)) as (url, stats):
            spellings = loopback_spellings(_port(url))
            results = [await _post(spelled, poster) for spelled in spellings]
            again = await _post(spellings[0], poster)  # the verdict kept per URL
    finally:
        await poster.aclose()
    assert stats["connections"] == 0
    for spelled, result in zip(spellings, results, strict=True):
        assert result.status_code is None, spelled
        assert result.error is not None and result.error.startswith("refused: "), spelled
        assert "is a loopback" in result.error and "\n" not in result.error, result.error
    assert again.error == results[0].error


@pytest.mark.anyio
async def test_the_client_is_handed_the_url_rebuilt_on_the_host_it_was_judged_by() -> None:
    """With private addresses allowed, each spelling reaches the listener, as
    ``127.0.0.1``: the URL aiohttp is handed is the normalized one."""
    heads: list[bytes] = []

    async def answer(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        heads.append(head)
        await reply(204)(head, body, writer)

    poster = AiohttpPoster(allow_private=True)
    try:
        async with server(answer) as (url, _stats):
            port = _port(url)
            spellings = [
                f"http://１２７.0.0.1:{port}/hook",
                f"http://127。0。0。1:{port}/hook",
                f"http://%31%32%37.0.0.1:{port}/hook",  # yarl keeps the escapes: no such name
                f"http://127.0.0.1.:{port}/hook",
                f"http://2130706433:{port}/hook",  # aiohttp refuses the legacy form
            ]
            results = [await _post(spelled, poster) for spelled in spellings]
    finally:
        await poster.aclose()
    assert [r.status_code for r in results] == [204] * len(spellings), [r.error for r in results]
    assert all(f"\r\nHost: 127.0.0.1:{port}\r\n".encode() in head for head in heads), heads


@pytest.mark.anyio
async def test_an_httpx_client_gets_the_normalized_url_and_never_raises() -> None:
    """httpx refuses ``１２７.0.0.1`` (``InvalidURL``, which is no ``HTTPError``: it became a
    500 of ``:test``): it is handed the normalized URL; a host that is no plain name is a
    refused attempt, nothing sent."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(204)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        normalized = await post_event(
            http,
            url="http://public.example@１２７.0.0.1/hook",
            secrets=[SECRET],
            event_id="evt_1",
            body=BODY,
            timeout=5.0,
            body_limit=64,
        )
        unusable = await post_event(
            http,
            url="http://hooks..example/hook",
            secrets=[SECRET],
            event_id="evt_2",
            body=BODY,
            timeout=5.0,
            body_limit=64,
        )
    assert normalized.status_code == 204
    assert seen == ["http://public.example@127.0.0.1/hook"]
    assert unusable.status_code is None
    assert unusable.error == "refused: the host hooks..example is no host name or IP address"


# --------------------------------------------------------------------------- DNS rebinding
# A rebinding DNS and two listeners (tests/support/rebinding.py) against the daemon's
# aiohttp client; ``endpoints test`` through the same client: tests/test_pinning.py.


@pytest.mark.anyio
async def test_aiohttp_connects_only_to_the_vetted_address(
    listeners: tuple[Listener, Listener],
) -> None:
    public, private = listeners
    resolver = Rebinder(PUBLIC, PRIVATE)
    poster = AiohttpPoster(allow_private=False, resolve=resolver, policy=Rebinder.policy)
    try:
        first = await _post(public.rebind_url, poster)
        # The listener closes each connection: the next POST resolves anew, gets 127.0.0.1.
        second = await _post(public.rebind_url, poster)
    finally:
        await poster.aclose()
    assert first.status_code == 200
    assert second.status_code is None
    assert second.error == (
        "refused: hooks.rebind.test resolves to 127.0.0.1, a private address (test policy) "
        "(set delivery.allow_private_networks = true to allow)"
    )
    assert private.connections == 0 and len(public.requests) == 1
    _path, headers, _body = public.requests[0]
    assert headers["Host"] == f"hooks.rebind.test:{public.port}"  # the URL's name
    assert resolver.asked == [("hooks.rebind.test", public.port)] * 2


@pytest.mark.anyio
async def test_aiohttp_judges_ip_literals_it_does_not_resolve(
    listeners: tuple[Listener, Listener],
) -> None:
    public, private = listeners
    poster = AiohttpPoster(allow_private=False, resolve=Rebinder(PUBLIC), policy=Rebinder.policy)
    try:
        refused = await _post(f"http://{PRIVATE}:{private.port}/hook", poster)
        allowed = await _post(f"http://{PUBLIC}:{public.port}/hook", poster)
    finally:
        await poster.aclose()
    assert refused.status_code is None and refused.error is not None
    assert refused.error.startswith("refused: 127.0.0.1 is a private address (test policy)")
    assert allowed.status_code == 200
    assert private.connections == 0


@pytest.mark.anyio
async def test_the_dispatcher_on_aiohttp_never_reaches_the_rebound_address(
    tmp_path: Path, listeners: tuple[Listener, Listener]
) -> None:
    public, private = listeners
    secret = generate_secret()
    config = rebinding_config(public.rebind_url, secret)
    resolver = Rebinder.alternating()
    store = await AsyncStore.open(tmp_path / "relay.db")
    poster = AiohttpPoster(allow_private=False, resolve=resolver, policy=Rebinder.policy)
    try:
        await store.run(EndpointQueries.sync_endpoints, config.endpoints)
        await seed_sessions(store, sessions=2)
        dispatcher = Dispatcher(store, poster, DeliverySettings.from_config(config))
        await dispatcher.run_until_idle()
        rows = store.store.operator.list_deliveries()
    finally:
        await poster.aclose()
        await store.close()
    assert private.connections == 0
    assert {r.status for r in rows} == {"delivered"}
    assert len(public.requests) == 2 * PER_SESSION
    assert any(r.attempts > 1 for r in rows), "the resolver rebound: some were refused"
