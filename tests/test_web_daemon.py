"""The daemon's web layer in-process: the stream is woken by the daemon's own ingest (the
bell), not only by its store poll, on either store engine; the health routes stay open
beside it."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from sessionhook.api.models import Session
from sessionhook.relay.domain.events import make_event
from sessionhook.relay.store import PostgresStore
from sessionhook.relay.web import stream as stream_module
from tests.support.backends import Backend
from tests.support.daemon_setup import Setup, token_server
from tests.support.web_relay import read_messages

pytestmark = pytest.mark.app

TOKEN = "daemon-token-" + "z" * 30
T = "2026-11-23T10:00:00Z"


@pytest.mark.anyio
async def test_the_daemons_ingest_wakes_the_stream(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the store poll an hour away, only the bell can bring the events in time.
    monkeypatch.setattr(stream_module, "POLL_SECONDS", 3600.0)
    server = token_server(tmp_path, TOKEN)
    store = {"url": backend.target} if backend.name == "postgresql" else {}
    setup = Setup(
        tmp_path,
        server=server,
        store=store,
    )
    daemon = setup.daemon()
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with (
        setup.api_http() as api_http,
        anyio.create_task_group() as tg,
        httpx.AsyncClient(base_url=f"http://{server['listen']}", headers=auth) as http,
    ):
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        assert (await http.get("/healthz", headers={"authorization": ""})).status_code == 200
        async with http.stream("GET", "/v1/events/stream?type=session.*") as response:
            assert response.status_code == 200
            session = await setup.api(api_http).create_session("Watched live")
            got = await read_messages(response, 1, within=30)
        daemon.stop()
    assert got[0].event == "session.discovered"
    assert session.name in got[0].data
    assert daemon.bell.rings > 0


@pytest.mark.anyio
async def test_a_reload_keeps_the_listener_and_its_token(tmp_path: Path) -> None:
    server = token_server(tmp_path, TOKEN)
    setup = Setup(tmp_path, server=server)
    daemon = setup.daemon()
    token_file = tmp_path / "web-token"  # where token_server put it
    token_file.write_text("another-token-" + "q" * 30)
    with capture_logs() as logs:
        assert await daemon.reload() is True
    assert any(e["event"] == "config.reload_partial" for e in logs)
    assert daemon.config.server is not None and daemon.config.server.token is not None
    assert daemon.config.server.token.get_secret_value() == TOKEN


@pytest.mark.anyio
async def test_another_replicas_deliveries_ring_the_stream_on_postgresql(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the deliveries another replica queues are notified (LISTEN/NOTIFY):
    the daemon rings its bell, and its stream carries the other replica's event without
    waiting for its store poll (an hour away here)."""
    monkeypatch.setattr(stream_module, "POLL_SECONDS", 3600.0)
    server = token_server(tmp_path, TOKEN)
    setup = Setup(
        tmp_path,
        server=server,
        store={"url": pg_url},
    )
    daemon = setup.daemon()
    auth = {"authorization": f"Bearer {TOKEN}"}
    name = "sessions/elsewhere"
    # Delivered to rx as well (whenever the dispatcher gets to it): a body the test receiver
    # reads, like every event, with data.session.name.
    event = make_event(
        "evt_" + "e" * 32, "session.discovered", name, None, T, {"session": {"name": name}}
    )

    def archive_elsewhere() -> None:
        """What another replica does: archive an event, and queue its delivery to rx."""
        with PostgresStore.open(pg_url) as other:
            raw = {
                "name": name,
                "id": "elsewhere",
                "title": "t",
                "state": "QUEUED",
                "createTime": T,
                "updateTime": T,
            }
            other.ingest.upsert_session(Session.model_validate(raw), baseline=False)
            other.ingest.ingest_session_events(name, [event], True)

    async with (
        setup.api_http(),
        anyio.create_task_group() as tg,
        httpx.AsyncClient(base_url=f"http://{server['listen']}", headers=auth) as http,
    ):
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        async with http.stream("GET", "/v1/events/stream") as response:
            assert response.status_code == 200
            rings = daemon.bell.rings
            await anyio.to_thread.run_sync(archive_elsewhere)
            got = await read_messages(response, 1, within=30)
        daemon.stop()
    assert got[0].id == event.id and got[0].event == "session.discovered"
    assert daemon.bell.rings > rings
