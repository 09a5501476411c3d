"""The MCP server of two relays on one PostgreSQL store (the real daemons, in process, one
emulator upstream): a wait and a subscription on the relay that did not archive the
session's events (the other created it and holds the account's poller, or not: either
way) are answered through the store's notification or its read of the archive.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionhook.relay.web.mcp import WAITING_URI, session_uri
from tests.support.mcp_relay import announced, mcp_client, mcp_relay, structured

pytestmark = [pytest.mark.app, pytest.mark.anyio]

WITHIN = 30.0


async def test_a_wait_and_a_subscription_on_the_other_replica(pg_url: str, tmp_path: Path) -> None:
    store = {"store": {"url": pg_url}}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with (
        mcp_relay(tmp_path / "a", **store) as a,
        mcp_relay(tmp_path / "b", emulator=a.setup.emulator, **store) as b,
        mcp_client(a.listen) as on_a,
        mcp_client(b.listen) as on_b,
    ):
        created = structured(
            await on_a.call_tool(
                "create_session", {"prompt": "Two relays", "require_plan_approval": True}
            )
        )
        name = created["session"]["session"]
        waited = structured(
            await on_b.call_tool(
                "wait_for_session",
                {"session": name, "until": ["action_required"], "timeout_s": WITHIN},
            )
        )
        assert waited["event"]["type"] == "session.action_required"
        uri = session_uri(name)
        async with on_b.listen(resource_subscriptions=[uri, WAITING_URI]) as sub:
            structured(await on_a.call_tool("approve_plan", {"session": name}))
            await announced(sub, {uri, WAITING_URI})
