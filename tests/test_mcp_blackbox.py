"""``/mcp`` of ``sessionhook run`` as a process (the stand-in upstream, the official ``mcp``
client): a wait is answered when the session completes upstream, and a relay stopped with
waits and a listen stream open exits 0, in time, without a traceback.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import anyio.to_thread
import pytest

from tests.support.loopback import free_port
from tests.support.mcp_relay import TOKEN, mcp_client, structured
from tests.support.relay_process import Harness, assert_clean_exit, wait_ready

pytestmark = [pytest.mark.process, pytest.mark.anyio]

WITHIN = 30.0


async def test_a_wait_answered_from_a_real_relay_which_stops_cleanly_with_waits_open(
    harness: Harness,
) -> None:
    standin = harness.standin()
    session = standin.add_session("Black box", state="IN_PROGRESS")
    port = free_port()
    relay = harness.relay(
        standin,
        "relay",
        env={"SESSIONHOOK_WEB_TOKEN": TOKEN},
        endpoints=[],
        listen=f"127.0.0.1:{port}",
        more={"server": ['token_env = "SESSIONHOOK_WEB_TOKEN"']},
    )
    await anyio.to_thread.run_sync(wait_ready, standin, relay)
    listen = f"127.0.0.1:{port}"
    async with mcp_client(listen) as client:
        with anyio.fail_after(WITHIN):
            while (await client.call_tool("get_session", {"session": session})).is_error:  # noqa: ASYNC110
                await anyio.sleep(0.1)  # until the relay archived it (its poll: no event here)
        results: list[Any] = []
        arguments = {"session": session, "until": ["completed"], "timeout_s": 3000}

        async def wait() -> None:
            results.append(await client.call_tool("wait_for_session", arguments))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await _until_open(port, 1)
            standin.append_activity(session, "sessionCompleted")
            standin.set_state(session, "COMPLETED")
        answer = structured(results[0])
        assert answer["event"]["type"] == "session.completed"

    # Stopped with five waits and a listen stream open: the clients lose their connections
    # (their errors are theirs), the relay exits 0 in time.
    stopped = False
    other = {"session": session, "until": ["activity.user_messaged"], "timeout_s": 3000}
    with contextlib.suppress(Exception):
        async with mcp_client(listen) as client, anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(client.call_tool, "wait_for_session", other)
            await _until_open(port, 5)
            async with client.listen(resource_subscriptions=["sessionhook://sessions/waiting"]):
                await anyio.to_thread.run_sync(assert_clean_exit, relay)
                stopped = True
            tg.cancel_scope.cancel()
    assert stopped


async def _until_open(port: int, count: int) -> None:
    with anyio.fail_after(WITHIN):
        while await _open_waits(port) < count:  # noqa: ASYNC110 (the relay's /metrics)
            await anyio.sleep(0.05)


async def _open_waits(port: int) -> float:
    import httpx

    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    prefix = 'sessionhook_mcp_open{kind="waits"} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(lines[0][len(prefix) :]) if lines else 0.0
