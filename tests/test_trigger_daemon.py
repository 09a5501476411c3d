"""``trigger`` through a running relay: ``POST /v1/endpoints/{name}:trigger`` and ``sessionhook
trigger --url``, with ``[actions]`` on. The real daemon runs in process (its web server on a
loopback port) over the emulator; every upstream call goes through a transport that counts
``:approvePlan`` and ``:sendMessage``, so a sample's link is seen to act on nothing."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from click.testing import CliRunner, Result

from sessionhook.api.client import SessionsClient
from sessionhook.cli import cli
from sessionhook.cli._output import Runtime
from sessionhook.relay.daemon.daemon import Daemon
from tests.support.daemon_setup import Setup, token_server

pytestmark = [pytest.mark.app, pytest.mark.anyio]

WITHIN = 30.0
TOKEN = "trigger-test-token-0123456789abcdef0123"


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
class Running:
    setup: Setup
    base: str
    counting: CountingTransport
    daemon: Daemon
    http: httpx.AsyncClient  # a person's browser, on the relay's listener
    api: httpx.AsyncClient  # the management API, with the token
    client: SessionsClient


@asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    server = token_server(tmp_path, TOKEN)
    base = f"http://{server['listen']}"
    setup = Setup(tmp_path, server=server, actions={"enabled": True, "public_url": base})
    counting = CountingTransport(httpx.ASGITransport(setup.emulator))
    daemon = setup.daemon(upstream_transport=counting)
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with (
        setup.api_http() as api_http,
        httpx.AsyncClient(base_url=base, timeout=10) as http,
        httpx.AsyncClient(base_url=base, timeout=10, headers=headers) as api,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        try:
            yield Running(setup, base, counting, daemon, http, api, setup.api(api_http))
        finally:
            daemon.stop()


def samples_of(run: Running) -> list[Any]:
    return [a for a in run.setup.receiver.delivered if a.event_id.startswith("msg_trigger_")]


async def cli_in_thread(*args: str, runtime: Runtime | None = None) -> Result:
    """The command line, in a thread (it runs its own event loop; the daemon runs in this)."""
    env = {"SESSIONHOOK_WEB_TOKEN": TOKEN}
    return await anyio.to_thread.run_sync(
        lambda: CliRunner().invoke(cli, ["trigger", *args], env=env, obj=runtime)
    )


async def test_a_sample_s_links_say_so_and_act_on_nothing(tmp_path: Path) -> None:
    async with running(tmp_path) as run:
        answer = await run.api.post(
            "/v1/endpoints/rx:trigger", json={"type": "session.action_required"}
        )
        assert answer.status_code == 200, answer.text
        told = answer.json()
        assert told["ok"] is True and told["status_code"] == 200
        assert told["webhook_id"].startswith("msg_trigger_")
        (arrival,) = samples_of(run)  # verified by the receiver (Standard Webhooks)
        assert arrival.event_id == told["webhook_id"]
        data = arrival.body["data"]
        assert data["sample"] is True and set(data["links"]) == {"approve", "open"}

        page = await run.http.get(data["links"]["approve"])
        assert page.status_code == 200
        text = unescape(page.text)
        assert "This is a sample (sessionhook trigger)" in text
        for step in data["plan"]["steps"]:
            assert step["title"] in text
        form = re.search(r'name="form_token" value="([^"]+)"', page.text)
        assert form is not None
        done = await run.http.post(
            data["links"]["approve"], data={"form_token": unescape(form.group(1))}
        )
        assert done.status_code == 200 and "nothing was sent" in unescape(done.text)
        assert run.counting.acts == []

        # Never archived, never a delivery of the outbox.
        events = (await run.api.get("/v1/events")).json()
        deliveries = (await run.api.get("/v1/deliveries")).json()
        assert events.get("events", []) == [] and deliveries.get("deliveries", []) == []
        metrics = (await run.http.get("/metrics")).text
        assert not re.search(r"^sessionhook_deliveries_total\{.*\} [1-9]", metrics, re.M)

        # The command line through the relay: one line, the same marks.
        result = await cli_in_thread("session.failed", "--endpoint", "rx", "--url", run.base)
        assert result.exit_code == 0, result.output
        # (The daemon in this process logs to the same stdout: its lines are left out.)
        [line] = [x for x in result.stdout.splitlines() if x.startswith("200 in ")]
        assert "session.failed to rx (webhook-id msg_trigger_" in line
        assert [a.type for a in samples_of(run)] == ["session.action_required", "session.failed"]


async def test_a_sample_from_an_archived_session(tmp_path: Path) -> None:
    async with running(tmp_path) as run:
        created = await run.client.create_session("Add a health endpoint")
        await run.setup.receiver.wait_for(
            lambda r: any(a.type == "session.completed" for a in r.first_deliveries()),
            within=WITHIN,
        )
        answer = await run.api.post(
            "/v1/endpoints/rx:trigger", json={"type": "session.completed", "session": created.id}
        )
        assert answer.status_code == 200, answer.text
        (arrival,) = samples_of(run)
        session = arrival.body["data"]["session"]
        assert (session["name"], session["title"]) == (created.name, created.title)
        assert arrival.body["data"]["sample"] is True
    # Locally, on the store the daemon left (sessions/<id> or <id>).
    config = str(run.setup.config_path)
    result = await cli_in_thread(
        "activity.session_completed", "--endpoint", "rx", "--config", config,
        "--session", created.name,
        runtime=Runtime(transport=httpx.ASGITransport(run.setup.receiver.app)),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    last = run.setup.receiver.delivered[-1]
    assert last.event_id.startswith("msg_trigger_")
    assert last.body["data"]["activity"]["name"].startswith(created.name + "/activities/")


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"type": "session.nope"}, 400, "unknown event type 'session.nope'"),
        ({"type": "x" * 10_240}, 400, "type"),
        ({"type": "session.failed", "extra": 1}, 400, "extra"),
        ({}, 400, "type"),
        ({"type": "session.failed", "session": "sessions/404"}, 400, "no archived session"),
    ],
)
async def test_hostile_trigger_bodies(
    tmp_path: Path, body: dict[str, Any], status: int, says: str
) -> None:
    async with running(tmp_path) as run:
        answer = await run.api.post("/v1/endpoints/rx:trigger", json=body)
        assert answer.status_code == status, answer.text
        assert says in answer.json()["error"]["message"] and len(answer.text) < 2000
        missing = await run.api.post("/v1/endpoints/nope:trigger", json={"type": "ping"})
        assert missing.status_code == 404
        assert samples_of(run) == []
