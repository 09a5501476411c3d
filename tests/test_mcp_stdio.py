"""``sessionhook mcp --url`` (a real subprocess, spawned by the official ``mcp`` client over
stdio) in front of the real daemon (in process, the emulator upstream): the same tools and
resources as ``/mcp``, a wait answered through it, an approval recorded with actor ``mcp``,
subscriptions of both protocol revisions passed on; without its token, one line and exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPDeprecationWarning

from sessionhook.relay.web.mcp import WAITING_URI, session_uri
from tests.support.mcp_relay import AUTH, TOKEN, McpRelay, announced, mcp_relay, structured

pytestmark = [pytest.mark.process, pytest.mark.anyio]

WITHIN = 30.0
TOOLS = {
    "list_sessions",
    "get_session",
    "wait_for_session",
    "approve_plan",
    "send_message",
    "create_session",
}


@asynccontextmanager
async def bridged(relay: McpRelay, mode: str, **kwargs: Any) -> AsyncIterator[Client]:
    """``sessionhook mcp --url`` spawned by the official client, in protocol ``mode``."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "sessionhook", "mcp", "--url", relay.url],
        env={**os.environ, "SESSIONHOOK_WEB_TOKEN": TOKEN},
    )
    async with Client(params, mode=mode, cache=None, **kwargs) as client:
        yield client


async def _created_and_waiting(client: Client) -> str:
    created = structured(
        await client.call_tool(
            "create_session", {"prompt": "Through stdio", "require_plan_approval": True}
        )
    )
    name = str(created["session"]["session"])
    waited = structured(
        await client.call_tool(
            "wait_for_session",
            {"session": name, "until": ["action_required"], "timeout_s": WITHIN},
        )
    )
    assert waited["event"]["type"] == "session.action_required"
    assert waited["session"]["waiting_for"]["plan_steps"]
    return name


async def test_the_tools_through_stdio_and_a_listen_subscription(tmp_path: Path) -> None:
    async with mcp_relay(tmp_path) as relay, bridged(relay, "auto") as client:
        tools = (await client.list_tools()).tools
        assert {t.name for t in tools} == TOOLS
        assert all(t.output_schema for t in tools)
        name = await _created_and_waiting(client)
        uri = session_uri(name)
        async with client.listen(resource_subscriptions=[uri, WAITING_URI]) as sub:
            structured(await client.call_tool("approve_plan", {"session": name}))
            await announced(sub, {uri, WAITING_URI})
        again = await client.call_tool("approve_plan", {"session": name})
        assert again.is_error
        async with httpx.AsyncClient(base_url=relay.url, headers=AUTH) as http:
            actions = (await http.get("/v1/actions")).json()["actions"]
        assert ("approve_plan", "mcp", "ok") in [
            (a["action"], a["actor_kind"], a["result"]) for a in actions
        ]


async def test_a_resources_subscribe_subscription_through_stdio_2025(tmp_path: Path) -> None:
    send, updates = anyio.create_memory_object_stream[str](100)

    async def notified(message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            send.send_nowait(str(message.params.uri))

    with send, updates:
        async with (
            mcp_relay(tmp_path) as relay,
            bridged(relay, "legacy", message_handler=notified) as client,
        ):
            name = await _created_and_waiting(client)
            uri = session_uri(name)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)  # the 2025-11-25 way
                await client.subscribe_resource(uri)
            # The bridge listens on the relay for it; the approval's events follow.
            structured(await client.call_tool("approve_plan", {"session": name}))
            with anyio.fail_after(WITHIN):
                while await updates.receive() != uri:
                    pass


def test_without_its_token_the_bridge_says_so_and_exits_2() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SESSIONHOOK_WEB_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "sessionhook", "mcp", "--url", "http://127.0.0.1:9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert "SESSIONHOOK_WEB_TOKEN" in done.stderr and len(done.stderr.splitlines()) == 1
