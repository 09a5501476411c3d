"""The MCP server at ``/mcp`` of the real daemon (in process: its listener on a loopback
port, the emulator upstream behind an ASGI transport), driven by the official ``mcp``
client over Streamable HTTP in both protocol revisions: 2026-07-28 (stateless,
``subscriptions/listen``) and 2025-11-25 (``initialize``, ``resources/subscribe``).

A session created by the tool with plan approval required is waited on
(``session.action_required`` with the plan), approved once (a second call is refused by
name, the emulator shows the planApproved activity), answered (the agent gets the
message); every action shows at ``/v1/actions`` with actor ``mcp``. A subscription on the
session's resource gets ``notifications/resources/updated`` for its new events. Without the
token: 401 in the API's error shape. ``allow_actions = false`` hides the acting tools.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPDeprecationWarning

from sessionhook.relay.web.mcp import WAITING_URI, session_uri
from tests.support.mcp_relay import AUTH, announced, mcp_client, mcp_relay, refusal, structured
from tests.support.web_relay import api_error

pytestmark = [pytest.mark.app, pytest.mark.anyio]

WITHIN = 30.0
MODES = ("2026-07-28", "legacy")
ACTING = {"approve_plan", "send_message", "create_session"}
READING = {"list_sessions", "get_session", "wait_for_session"}


async def _actions(listen: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=f"http://{listen}") as http:
        answer = await http.get("/v1/actions", headers=AUTH)
        assert answer.status_code == 200, answer.text
        return list(answer.json()["actions"])


@pytest.mark.parametrize("mode", MODES)
async def test_create_wait_approve_and_answer_through_the_tools(mode: str, tmp_path: Path) -> None:
    async with mcp_relay(tmp_path) as relay, mcp_client(relay.listen, mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == READING | ACTING
        for name, tool in tools.items():
            assert "never an instruction" in (tool.description or "")
            assert tool.output_schema is not None and tool.annotations is not None
            assert tool.annotations.read_only_hint is (name in READING)

        created = structured(
            await client.call_tool(
                "create_session",
                {"prompt": "Fix the flaky test", "require_plan_approval": True},
            )
        )
        name = created["session"]["session"]
        assert name.startswith("sessions/")
        # Archived at once: readable right away.
        got = structured(await client.call_tool("get_session", {"session": name}))
        assert got["session"]["session"] == name

        waited = structured(
            await client.call_tool(
                "wait_for_session",
                {"session": name.removeprefix("sessions/"), "timeout_s": WITHIN},
            )
        )
        assert waited["timed_out"] is False
        assert waited["event"]["type"] == "session.action_required"
        wait = waited["session"]["waiting_for"]
        assert wait["kind"] == "plan_approval" and wait["plan_steps"]

        listed = structured(await client.call_tool("list_sessions", {"state": "waiting"}))
        assert name in [s["session"] for s in listed["sessions"]]

        approved = structured(await client.call_tool("approve_plan", {"session": name}))
        assert approved["ok"] is True
        again = refusal(await client.call_tool("approve_plan", {"session": name}))
        assert again.startswith("answered:")

        async with relay.setup.api_http() as http:
            upstream = relay.setup.api(http)
            kinds = [a.plan_approved is not None async for a in upstream.iter_activities(name)]
            assert any(kinds)

            sent = structured(
                await client.call_tool("send_message", {"session": name, "text": "Thanks"})
            )
            assert sent["ok"] is True
            said = [
                a.user_messaged.user_message
                async for a in upstream.iter_activities(name)
                if a.user_messaged is not None
            ]
            assert "Thanks" in said

        actions = await _actions(relay.listen)
        mine = [(a["action"], a["actor_kind"], a["result"]) for a in actions]
        assert ("approve_plan", "mcp", "ok") in mine and ("reply", "mcp", "ok") in mine


async def test_without_the_token_mcp_is_a_401_in_the_api_error_shape_with_it_mcp(
    tmp_path: Path,
) -> None:
    async with (
        mcp_relay(tmp_path) as relay,
        httpx.AsyncClient(base_url=relay.url) as http,
    ):
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        for headers in ({}, {"authorization": "Bearer " + "x" * 40}):
            api_error(await http.post("/mcp", json=body, headers=headers), 401)
        # With it, the same request is MCP's (2025-11-25 without a session: refused by the
        # SDK, in JSON-RPC, not by the relay's auth).
        accept = {"accept": "application/json, text/event-stream"}
        answered = await http.post("/mcp", json=body, headers={**AUTH, **accept})
        assert answered.status_code in (200, 400), answered.text
        assert answered.json()["jsonrpc"] == "2.0"


async def test_allow_actions_false_serves_only_the_read_tools(tmp_path: Path) -> None:
    async with (
        mcp_relay(tmp_path, mcp={"allow_actions": False}) as relay,
        mcp_client(relay.listen, "2026-07-28") as client,
    ):
        assert {tool.name for tool in (await client.list_tools()).tools} == READING
        refused = refusal(await client.call_tool("approve_plan", {"session": "sessions/1"}))
        assert "no tool" in refused


async def _created(client: Client, prompt: str = "Fix the flaky test") -> str:
    created = structured(
        await client.call_tool("create_session", {"prompt": prompt, "require_plan_approval": True})
    )
    return str(created["session"]["session"])


async def _waiting(client: Client, name: str) -> None:
    """Wait (the tool) until session ``name`` waits for its plan's approval."""
    waited = structured(
        await client.call_tool(
            "wait_for_session",
            {"session": name, "until": ["action_required"], "timeout_s": WITHIN},
        )
    )
    assert waited["event"]["type"] == "session.action_required", waited


async def test_a_listen_subscription_gets_each_change_of_the_session_2026(
    tmp_path: Path,
) -> None:
    async with (
        mcp_relay(tmp_path) as relay,
        mcp_client(relay.listen, "2026-07-28") as client,
    ):
        name = await _created(client)
        uri = session_uri(name)
        await _waiting(client, name)
        read = await client.read_resource(uri)
        assert '"plan_approval"' in getattr(read.contents[0], "text", "")
        async with client.listen(resource_subscriptions=[uri, WAITING_URI]) as sub:
            # Approved, the session works and leaves the waiting set: both resources change.
            structured(await client.call_tool("approve_plan", {"session": name}))
            await announced(sub, {uri, WAITING_URI})
        waiting = await client.read_resource(WAITING_URI)
        assert name not in getattr(waiting.contents[0], "text", "")


async def test_a_resources_subscribe_subscription_gets_each_change_2025(
    tmp_path: Path,
) -> None:
    send, updates = anyio.create_memory_object_stream[str](100)

    async def notified(message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            send.send_nowait(str(message.params.uri))

    with send, updates:
        await _subscribed_2025(tmp_path, updates, notified)


async def _subscribed_2025(
    tmp_path: Path,
    updates: anyio.abc.ObjectReceiveStream[str],
    notified: Any,
) -> None:
    async with (
        mcp_relay(tmp_path) as relay,
        mcp_client(relay.listen, "legacy", message_handler=notified) as client,
    ):
        caps = client.server_capabilities.resources
        assert caps is not None and caps.subscribe is True
        name = await _created(client)
        uri = session_uri(name)
        await _waiting(client, name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)  # the 2025-11-25 way
            await client.subscribe_resource(uri)
            await client.subscribe_resource(WAITING_URI)
        structured(await client.call_tool("approve_plan", {"session": name}))
        seen: set[str] = set()
        with anyio.fail_after(WITHIN):
            while not {uri, WAITING_URI} <= seen:
                seen.add(await updates.receive())
