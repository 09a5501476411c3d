"""Enum values the relay does not know (a new session state, an ``automationMode`` the service
began refusing or accepting): data, never a refusal. The real daemon runs in process against
the emulator behind a transport that rewrites its answers: every ``IN_PROGRESS`` becomes
``DEEP_WORK`` and every session carries ``automationMode: "MANUAL"``."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.daemon_setup import Setup

pytestmark = [pytest.mark.app, pytest.mark.anyio]


class NewValues(httpx.AsyncBaseTransport):
    """The emulator, its sessions in a state and a mode this version does not know."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        answer = await self.inner.handle_async_request(request)
        if "/activities" in request.url.path or answer.status_code != 200:
            return answer
        body = json.loads(await answer.aread())
        for session in body.get("sessions", [body]):
            if isinstance(session, dict) and "state" in session:
                if session["state"] == "IN_PROGRESS":
                    session["state"] = "DEEP_WORK"
                session["automationMode"] = "MANUAL"
        return httpx.Response(200, json=body)


async def test_unknown_values_are_kept_as_text_and_counted(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    daemon = setup.daemon(upstream_transport=NewValues(httpx.ASGITransport(setup.emulator)))
    async with setup.api_http() as http, anyio.create_task_group() as tg:
        api = setup.api(http)
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        created = await api.create_session("Add a health endpoint")
        await setup.receiver.wait_for(
            lambda r: any(a.type == "session.completed" for a in r.first_deliveries()),
            within=30,
        )
        daemon.stop()
    arrivals = setup.receiver.first_deliveries()
    assert {a.session for a in arrivals} == {created.name}
    states = {a.body["data"]["session"]["state"] for a in arrivals}
    assert "DEEP_WORK" in states  # relayed as it came
    registry = daemon.metrics.registry
    for field in ("state", "automationMode"):
        value = registry.get_sample_value("sessionhook_unknown_values_total", {"field": field})
        assert value == 1, field  # once for the session, however often it was read
