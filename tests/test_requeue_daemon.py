"""The operator's loop with the real daemon (in process: the emulator upstream, a recording
consumer, the web listener on a loopback port), on both store engines: a consumer that is
down until every delivery of two sessions is dead; it comes back; one ``POST
/v1/deliveries:recover``, or ``sessionhook deliveries recover`` on its own store handle
(what another process does: the daemon learns of it through the store alone);
everything arrives, each session's events in order, with the webhook-ids and bodies of
the failed attempts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from click.testing import CliRunner

from sessionhook.cli import cli
from tests.support.backends import Backend
from tests.support.daemon_setup import Setup, token_server

pytestmark = pytest.mark.app

TOKEN = "loop-token-" + "w" * 30


async def _until(check: Callable[[], Awaitable[bool]], within: float = 60) -> None:
    """Wait until ``check()`` holds (every 0.1 s, at most ``within`` seconds)."""
    with anyio.fail_after(within):
        for _ in range(int(within / 0.1) + 1):
            if await check():
                return
            await anyio.sleep(0.1)


async def _all(http: httpx.AsyncClient, path: str, key: str, **params: str) -> list[Any]:
    """Every item of a listed collection, page after page (at most 20 pages)."""
    items: list[Any] = []
    query = {"pageSize": "200", **params}
    for _ in range(20):
        answer = await http.get(path, params=query)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        items += page[key]
        if "nextPageToken" not in page:
            return items
        query = {**query, "pageToken": page["nextPageToken"]}
    raise AssertionError(f"{path}: more than 20 pages")


@pytest.mark.anyio
@pytest.mark.parametrize("way", ["api", "cli"])
async def test_consumer_down_then_fixed_then_recover_delivers_everything_in_order(
    backend: Backend, tmp_path: Path, way: str
) -> None:
    server = token_server(tmp_path, TOKEN)
    setup = Setup(
        tmp_path,
        server=server,
        store={"url": backend.target} if backend.name == "postgresql" else {},
        delivery={"retry_delays": [0.05], "allow_private_networks": True},
    )
    setup.receiver.status = 503  # the consumer is down
    daemon = setup.daemon()
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with (
        setup.api_http() as api_http,
        anyio.create_task_group() as tg,
        httpx.AsyncClient(base_url=f"http://{server['listen']}", headers=auth) as http,
    ):
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        api = setup.api(api_http)
        created = [await api.create_session(f"Task {i}") for i in range(2)]

        async def all_dead() -> bool:
            for s in created:
                state = (await http.get(f"/v1/sessions/{s.id}")).json()
                if state.get("session", {}).get("state") != "COMPLETED":
                    return False
            still = await _all(http, "/v1/deliveries", "deliveries", status="pending")
            still += await _all(http, "/v1/deliveries", "deliveries", status="failed")
            return not still

        await _until(all_dead)
        dead = await _all(http, "/v1/deliveries", "deliveries", status="dead")
        archived = {
            s.name: await _all(http, "/v1/events", "events", session=s.name) for s in created
        }
        assert sorted(d["event_id"] for d in dead) == sorted(
            e["id"] for events in archived.values() for e in events
        )
        assert setup.receiver.delivered == []
        failed_bodies = {a.event_id: a.body for a in setup.receiver.arrivals}

        setup.receiver.status = None  # fixed
        if way == "api":
            answer = await http.post(
                "/v1/deliveries:recover", json={"endpoint": "rx", "since": "1h"}
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["recovered"] == len(dead)
        else:
            args = ["deliveries", "recover", "--config", str(setup.config_path)]
            args += ["--endpoint", "rx", "--since", "1h"]
            result = await anyio.to_thread.run_sync(CliRunner().invoke, cli, args)
            assert result.exit_code == 0, result.output
            # The in-process daemon's log lines share CliRunner's stdout: find the command's line.
            said = f"recovered {len(dead)} deliveries of rx, due now"
            assert any(line.startswith(said) for line in result.output.splitlines()), result.output

        want = {e["id"] for events in archived.values() for e in events}
        assert all(len(events) >= 3 for events in archived.values())
        await setup.receiver.wait_for(lambda r: r.delivered_ids() >= want, within=30)
        daemon.stop()

    delivered = setup.receiver.delivered
    assert len(delivered) == len(want)  # each once
    for name, events in archived.items():
        got = [a.event_id for a in delivered if a.body["data"]["session"]["name"] == name]
        assert got == [e["id"] for e in events]  # the session's order (ingest order)
    for arrival in delivered:
        assert arrival.headers["webhook-id"] == arrival.event_id
        assert arrival.body == failed_bodies[arrival.event_id]  # the same body as before
    assert setup.receiver.max_in_flight_per_session <= 1
    assert setup.receiver.rejected == []
