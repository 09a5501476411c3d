"""A Slack app's buttons end to end (issue 23 items 3 and 4): the real daemon (in process, its
web server on a loopback port) with ``[actions]`` and ``[slack]``, polling the emulator, a
Slack endpoint receiving the chat message with its buttons, and Slack itself played by
this test: clicks signed as Slack's documentation describes, the message's
``response_url`` a loopback stand-in. Every upstream call the daemon makes is counted: a
click that must not act is checked to have made none."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sessionhook.relay.web.server import serve
from tests.support.daemon_setup import Setup
from tests.support.loopback import free_port
from tests.support.slack import INTERACTIONS, ResponseUrl, slack_headers

pytestmark = [pytest.mark.app, pytest.mark.anyio]

WITHIN = 30.0
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
PATH = INTERACTIONS


class CountingTransport(httpx.AsyncBaseTransport):
    """The emulator, with every action the relay asks of it counted."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.acts: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith((":approvePlan", ":sendMessage")):
            self.acts.append(request.url.path)
        return await self.inner.handle_async_request(request)


@dataclass
class Chat:
    """The Slack incoming webhook the relay posts its messages to."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    async def receive(self, request: Request) -> Response:
        self.messages.append(json.loads(await request.body()))
        return Response("ok")


def signed(body: bytes, *, secret: str = SIGNING_SECRET, at: float | None = None) -> dict[str, str]:
    return slack_headers(body, secret=secret, at=at)


def click(message: dict[str, Any], action_id: str, response_url: str, reply: str = "") -> bytes:
    """What Slack sends when someone clicks the button ``action_id`` of ``message``."""
    button = next(
        e
        for b in message["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"] == action_id
    )
    payload: dict[str, Any] = {
        "type": "block_actions",
        "user": {"id": "U0123", "username": "alice", "team_id": "T1"},
        "message": {"type": "message", "text": message["text"], "blocks": message["blocks"]},
        "response_url": response_url,
        "actions": [
            {
                "type": "button",
                "block_id": "sessionhook_actions",
                "action_id": action_id,
                "value": button.get("value"),
                "action_ts": "1.2",
            }
        ],
    }
    if reply:
        payload["state"] = {
            "values": {"sessionhook_reply": {"sessionhook_reply_text": {"value": reply}}}
        }
    return urlencode({"payload": json.dumps(payload)}).encode()


@dataclass
class Running:
    setup: Setup
    counting: CountingTransport
    http: httpx.AsyncClient
    response_url: ResponseUrl
    chat: Chat
    client: Any


@asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    secret_file = tmp_path / "slack-signing-secret"
    secret_file.write_text(SIGNING_SECRET + "\n")
    secret_file.chmod(0o600)
    setup = Setup(
        tmp_path,
        server={"listen": f"127.0.0.1:{port}", "allow_unauthenticated": True},
        actions={"enabled": True, "public_url": base},
        slack={"signing_secret_file": str(secret_file), "response_url_hosts": ["127.0.0.1"]},
        extra='format = "slack"\nevents = ["session.action_required"]',
    )
    counting = CountingTransport(httpx.ASGITransport(setup.emulator))
    chat = Chat()
    chat_app = Starlette(routes=[Route("/hook", chat.receive, methods=["POST"])])
    daemon = setup.daemon(
        upstream_transport=counting, delivery_transport=httpx.ASGITransport(chat_app)
    )
    response_url = ResponseUrl()
    async with (
        setup.api_http() as api_http,
        httpx.AsyncClient(base_url=base, timeout=10) as http,
        anyio.create_task_group() as tg,
    ):
        _, response_url.port = await tg.start(
            lambda task_status: serve("127.0.0.1:0", response_url.app, task_status=task_status)
        )
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        yield Running(setup, counting, http, response_url, chat, setup.api(api_http))
        daemon.stop()
        tg.cancel_scope.cancel()


async def _message(run: Running, title: str) -> dict[str, Any]:
    """The Slack message of the wait of the session titled ``title``."""

    async def found() -> bool:
        return any(title in m.get("text", "") for m in run.chat.messages)

    await _until(found)
    return next(m for m in run.chat.messages if title in m.get("text", ""))


async def _until(check: Any, within: float = WITHIN) -> None:
    with anyio.fail_after(within):
        for _ in range(int(within / 0.05) + 1):
            if await check():
                return
            await anyio.sleep(0.05)


async def test_a_plan_approved_from_slack_moves_the_session_on(tmp_path: Path) -> None:
    async with running(tmp_path) as run:
        created = await run.client.create_session("Ship <!channel> it", require_plan_approval=True)
        message = await _message(run, "Ship &lt;!channel&gt; it")
        ids = [
            e["action_id"]
            for b in message["blocks"]
            if b["type"] == "actions"
            for e in b["elements"]
        ]
        assert ids == ["sessionhook_approve", "sessionhook_open"]

        body = click(message, "sessionhook_approve", run.response_url.url)
        # Not Slack's: forged, replayed, unsigned. No call, no update.
        for headers in (
            signed(body, secret="another app's secret"),
            signed(body, at=time.time() - 600),
            {"content-type": "application/x-www-form-urlencoded"},
        ):
            assert (await run.http.post(PATH, content=body, headers=headers)).status_code == 401
        assert run.counting.acts == []

        answer = await run.http.post(PATH, content=body, headers=signed(body))
        assert answer.status_code == 200
        await _until(lambda: _true(len(run.response_url.updates) == 1))
        assert run.counting.acts == [f"/v1alpha/{created.name}:approvePlan"]
        update = run.response_url.updates[0]
        assert update["replace_original"] is True and update["text"] == "Plan approved by alice"

        async def moved_on() -> bool:
            session = await run.client.get_session(created.name)
            return session.state != "AWAITING_PLAN_APPROVAL"

        await _until(moved_on)
        # The same click again (a second Slack user, or a retry): the link is used.
        again = await run.http.post(PATH, content=body, headers=signed(body))
        assert again.status_code == 200
        await _until(lambda: _true(len(run.response_url.updates) == 2))
        assert run.response_url.updates[1]["response_type"] == "ephemeral"
        assert len(run.counting.acts) == 1


async def test_a_reply_from_slack_reaches_the_agent(tmp_path: Path) -> None:
    async with running(tmp_path) as run:
        created = await run.client.create_session("Tidy the parser [ask]")
        message = await _message(run, "Tidy the parser")
        assert any(b["type"] == "input" for b in message["blocks"])
        said = "Keep <!here> & the old one"
        body = click(message, "sessionhook_reply", run.response_url.url, reply=said)
        assert (await run.http.post(PATH, content=body, headers=signed(body))).status_code == 200
        await _until(lambda: _true(len(run.response_url.updates) == 1))
        assert run.counting.acts == [f"/v1alpha/{created.name}:sendMessage"]
        assert run.response_url.updates[0]["text"] == "Answer sent by alice"

        async def reached() -> bool:
            told = [
                a.user_messaged.user_message
                async for a in run.client.iter_activities(created.name)
                if a.user_messaged is not None
            ]
            return said in told

        await _until(reached)


async def _true(value: bool) -> bool:
    return value
