"""The real daemon with its MCP server, for the MCP tests and the bench: in process, its
listener on a loopback port behind a token, the emulator upstream behind an ASGI transport
(each request counted); the official ``mcp`` client on its ``/mcp``; the daemon's
``sessionhook_mcp_open`` gauge read from ``/metrics``."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.subscriptions import ResourceUpdated
from starlette.applications import Starlette

from sessionhook.relay.daemon.daemon import Daemon
from tests.support.daemon_setup import Setup, token_server

TOKEN = "mcp-relay-token-" + "m" * 30
AUTH = {"authorization": f"Bearer {TOKEN}"}
#: ``poll`` settings for a poller that, once a session waits, asks nothing for an hour (no
#: list read either): what is counted upstream is what the waits cost.
QUIET = {
    "mode": "timer",
    "active_interval": 0.05,
    "idle_interval": 3600,
    "discovery_interval": 3600,
    "list_interval": 3600,
}


class Counting(httpx.AsyncBaseTransport):
    """A transport that counts the requests it passes on."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.requests = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return await self.inner.handle_async_request(request)


@dataclass
class McpRelay:
    """A running daemon: its setup, the daemon, its listen address, the counted upstream."""

    setup: Setup
    daemon: Daemon
    listen: str
    upstream: Counting

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    async def gauge(self, kind: str) -> float:
        """``sessionhook_mcp_open{kind=...}`` as /metrics says (0 when absent)."""
        async with httpx.AsyncClient(base_url=self.url) as http:
            text = (await http.get("/metrics")).text
        prefix = f'sessionhook_mcp_open{{kind="{kind}"}} '
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        return float(lines[0][len(prefix) :]) if lines else 0.0


@asynccontextmanager
async def mcp_relay(
    tmp_path: Path, *, emulator: Starlette | None = None, **sections: dict[str, Any]
) -> AsyncIterator[McpRelay]:
    """The daemon with its listener (and token) up, until the block ends; ``emulator``:
    another relay's (replicas of one account), else its own."""
    server = token_server(tmp_path, TOKEN)
    setup = Setup(tmp_path, server=server, **sections)
    if emulator is not None:
        setup.emulator = emulator
    upstream = Counting(httpx.ASGITransport(setup.emulator))
    daemon = setup.daemon(upstream_transport=upstream)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        try:
            yield McpRelay(setup, daemon, server["listen"], upstream)
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def mcp_client(
    listen: str, mode: str = "2026-07-28", token: str = TOKEN, **kwargs: Any
) -> AsyncIterator[Client]:
    """The official client on ``/mcp`` with the bearer token, in protocol ``mode``
    (``legacy``: 2025-11-25's handshake)."""
    limits = httpx2.Limits(max_connections=250, max_keepalive_connections=250)
    async with httpx2.AsyncClient(
        headers={"authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(30, read=120),
        limits=limits,
    ) as http:
        transport = streamable_http_client(f"http://{listen}/mcp", http_client=http)
        async with Client(transport, mode=mode, cache=None, **kwargs) as client:
            yield client


def structured(result: types.CallToolResult) -> dict[str, Any]:
    """A tool's structured answer (it must not be an error, and carry a text summary)."""
    assert not result.is_error, result.content
    assert result.structured_content is not None
    assert result.content and isinstance(result.content[0], types.TextContent)
    return result.structured_content


def refusal(result: types.CallToolResult) -> str:
    """A tool error's one line."""
    assert result.is_error, result
    text = result.content[0]
    assert isinstance(text, types.TextContent) and text.text and "\n" not in text.text
    assert len(text.text) <= 600
    return text.text


async def until(check: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    """Ask ``check`` until it says yes (the daemon's /metrics, say: no event to wait on
    over HTTP); a :class:`TimeoutError` after ``within`` seconds."""
    with anyio.fail_after(within):
        while not await check():  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def announced(sub: AsyncIterable[object], uris: set[str], within: float = 30.0) -> None:
    """Read ``sub`` (a ``subscriptions/listen`` stream) until each of ``uris`` was announced
    changed; anything but a resource update fails, and so does ``within`` seconds."""
    seen: set[str] = set()
    with anyio.fail_after(within):
        async for event in sub:
            assert isinstance(event, ResourceUpdated), event
            seen.add(event.uri)
            if uris <= seen:
                return
    raise AssertionError(f"the stream ended with {sorted(seen)} of {sorted(uris)} announced")
