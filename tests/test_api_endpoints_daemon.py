"""Endpoints created at run time, with the real daemon in process (its listener on a
loopback port, the emulator and the consumers behind ASGI transports): an endpoint created
over ``/v1/endpoints`` receives signed deliveries and test pings; a rotated secret signs
beside the new one for the overlap, checked with the Standard Webhooks *reference* package
(``standardwebhooks``); and on PostgreSQL an endpoint created on one replica receives
deliveries from another replica of the same store."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import pytest
from click.testing import CliRunner
from standardwebhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from structlog.testing import capture_logs

from sessionhook.cli import cli
from sessionhook.relay.config import Config, load_config
from sessionhook.relay.daemon.daemon import Daemon, DaemonError
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.ops import endpoint_edits as edits
from sessionhook.relay.store import Store
from tests.support.backends import Backend
from tests.support.daemon_setup import Setup, token_server, write_config

pytestmark = [pytest.mark.app, pytest.mark.anyio]

TOKEN = "endpoints-daemon-token-" + "d" * 30
HOST = "laptop.test"


@dataclass
class Recorder:
    """A consumer of every host: records each POST (host, headers, body), answers 204."""

    posts: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)

    @property
    def app(self) -> Starlette:
        async def hook(request: Request) -> Response:
            body = await request.body()
            self.posts.append((request.url.hostname or "", dict(request.headers), body))
            return Response(status_code=204)

        return Starlette(routes=[Route("/{path:path}", hook, methods=["POST"])])

    def to(self, host: str) -> list[tuple[dict[str, str], bytes]]:
        return [(headers, body) for h, headers, body in self.posts if h == host]


def verifies(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Whether the reference package accepts ``body`` signed with ``secret``."""
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


async def until(check: Callable[[], Awaitable[bool] | bool], within: float = 30) -> None:
    """Wait until ``check()`` holds (every 50 ms, at most ``within`` seconds)."""
    with anyio.fail_after(within):
        for _ in range(int(within / 0.05) + 1):
            got = check()
            if await got if isinstance(got, Awaitable) else got:
                return
            await anyio.sleep(0.05)


async def test_an_endpoint_created_over_http_gets_signed_deliveries_and_rotates(
    backend: Backend, tmp_path: Path
) -> None:
    server = token_server(tmp_path, TOKEN)
    store = {"url": backend.target} if backend.name == "postgresql" else {}
    setup = Setup(tmp_path, server=server, store=store)
    recorder = Recorder()
    daemon = setup.daemon(delivery_transport=httpx.ASGITransport(recorder.app))
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with (
        setup.api_http() as api_http,
        anyio.create_task_group() as tg,
        httpx.AsyncClient(base_url=f"http://{server['listen']}", headers=auth) as http,
    ):
        upstream = setup.api(api_http)
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        created = await http.post(
            "/v1/endpoints",
            json={"name": "laptop", "url": f"http://{HOST}/hook", "events": ["session.*"]},
        )
        assert created.status_code == 201, created.text
        first = created.json()["secret"]

        # A test ping, signed with the stored secret.
        tested = await http.post("/v1/endpoints/laptop:test")
        assert tested.status_code == 200 and tested.json()["ok"] is True, tested.text
        (ping,) = recorder.to(HOST)
        assert verifies(first, *ping) and b'"type":"ping"' in ping[1]

        def of(session: str) -> list[tuple[dict[str, str], bytes]]:
            return [(h, b) for h, b in recorder.to(HOST) if session.encode() in b]

        async def delivered(count: int) -> bool:
            return len(recorder.to(HOST)) >= count

        await upstream.create_session("Before the rotation")
        await until(lambda: delivered(2))
        assert all(verifies(first, h, b) for h, b in recorder.to(HOST))

        rotated = await http.post("/v1/endpoints/laptop:rotateSecret", json={"overlap": 3600})
        assert rotated.status_code == 200, rotated.text
        second = rotated.json()["secret"]
        # Only the sessions created after a rotation: an earlier session's delivery may
        # have been on its way, signed as before, while the rotation committed.
        during = (await upstream.create_session("During the overlap")).name
        await until(lambda: bool(of(during)))
        for headers, body in of(during):
            # Both secrets sign every message of the overlap: each one verifies alone.
            assert len(headers["webhook-signature"].split(" ")) == 2
            assert verifies(first, headers, body) and verifies(second, headers, body)

        ended = await http.post("/v1/endpoints/laptop:rotateSecret", json={"overlap": 0})
        third = ended.json()["secret"]
        after = (await upstream.create_session("After the overlap")).name
        await until(lambda: bool(of(after)))
        for headers, body in of(after):
            assert verifies(third, headers, body)
            assert not verifies(second, headers, body) and not verifies(first, headers, body)
        # The config file's endpoint went on with its own secret all along.
        assert any(h == "rx.test" for h, _, _ in recorder.posts)

        # The other routes, against this daemon.
        assert (await http.get("/v1/endpoints", headers={"authorization": ""})).status_code == 401
        listed = (await http.get("/v1/endpoints")).json()["endpoints"]
        assert [(e["name"], e["source"]) for e in listed] == [("laptop", "api"), ("rx", "config")]
        assert "whsec_" not in json.dumps(listed)
        assert (
            await http.patch("/v1/endpoints/rx", json={"url": "http://x.test/"})
        ).status_code == 409
        changed = await http.patch("/v1/endpoints/laptop", json={"description": "my laptop"})
        assert changed.status_code == 200 and changed.json()["description"] == "my laptop"
        off = await http.post("/v1/endpoints/laptop:disable", json={"reason": "lunch"})
        assert off.json()["enabled"] is False and off.json()["disabled_reason"] == "lunch"
        assert (await http.post("/v1/endpoints/laptop:enable")).json()["enabled"] is True
        got = await http.get("/v1/endpoints/laptop")
        assert got.status_code == 200 and got.json()["definition"]["events"] == ["session.*"]
        deleted = await http.delete("/v1/endpoints/laptop")
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert (await http.get("/v1/endpoints/laptop")).status_code == 404
        daemon.stop()


async def test_an_endpoint_created_on_one_replica_gets_deliveries_from_another(
    pg_url: str, tmp_path: Path
) -> None:
    server = token_server(tmp_path, TOKEN)
    setup = Setup(tmp_path, server=server, store={"url": pg_url})
    first_rx, second_rx = Recorder(), Recorder()
    a = setup.daemon(delivery_transport=httpx.ASGITransport(first_rx.app))
    other = tmp_path / "b"
    other.mkdir()
    b_config = load_config(write_config(other, secret=setup.secret, store={"url": pg_url}))
    b = Daemon(
        b_config,
        upstream_transport=httpx.ASGITransport(setup.emulator),
        delivery_transport=httpx.ASGITransport(second_rx.app),
    )
    auth = {"authorization": f"Bearer {TOKEN}"}
    a_done = anyio.Event()

    async def run_a() -> None:
        try:
            await a.run(handle_signals=False)
        finally:
            a_done.set()

    async with (
        setup.api_http() as api_http,
        anyio.create_task_group() as tg,
        httpx.AsyncClient(base_url=f"http://{server['listen']}", headers=auth) as http,
    ):
        tg.start_soon(run_a)
        tg.start_soon(lambda: b.run(handle_signals=False))
        await a.ready.wait()
        await b.ready.wait()
        created = await http.post(
            "/v1/endpoints", json={"name": "laptop", "url": f"http://{HOST}/hook"}
        )
        assert created.status_code == 201, created.text
        secret = created.json()["secret"]

        def b_knows() -> bool:
            dispatcher = b.dispatcher
            return dispatcher is not None and "laptop" in dispatcher.settings.endpoints

        # B learns of it at once (the store's notification wakes its dispatcher).
        await until(b_knows, within=10)
        # A stops: whatever reaches the new endpoint from now on is B's doing.
        a.stop()
        with anyio.fail_after(30):
            await a_done.wait()
        await setup.api(api_http).create_session("Seen by the other replica")
        await until(lambda: len(second_rx.to(HOST)) >= 2, within=60)
        for headers, body in second_rx.to(HOST):
            assert verifies(secret, headers, body)
        assert first_rx.to(HOST) == []
        b.stop()


async def test_a_config_file_taking_a_name_of_the_stores_is_refused(tmp_path: Path) -> None:
    """At start: exit 2, naming the endpoint; at a reload: the running config kept."""
    setup = Setup(tmp_path)
    empty = Config.model_validate({})
    with Store.open(setup.config.store.path) as store:
        for name in ("rx", "later"):  # "rx" is the file's: created before the file had it
            definition, secret = edits.define_endpoint(
                empty, name, {"url": f"https://hooks.example.com/{name}"}
            )
            edits.create_endpoint(store, empty, definition, secret)
    with pytest.raises(DaemonError, match="'rx' of the config file") as refused:
        await setup.daemon().run(handle_signals=False)
    assert refused.value.exit_code == 2

    with Store.open(setup.config.store.path) as store:
        edits.delete_endpoint(store, empty, "rx")
    daemon = setup.daemon()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        good = setup.config_path.read_text()
        setup.config_path.write_text(
            good + '[[endpoints]]\nname = "later"\nurl = "https://hooks.example.com/l"\n'
            f'secret = "{generate_secret()}"\n'
        )
        with capture_logs() as logs:
            assert await daemon.reload() is False
        failed = next(e for e in logs if e["event"] == "config.reload_failed")
        assert "'later' of the config file" in failed["error"]
        assert [e.name for e in daemon.config.endpoints] == ["rx"]
        daemon.stop()


async def test_an_endpoint_the_cli_creates_beside_a_running_daemon_gets_deliveries(
    tmp_path: Path,
) -> None:
    """SQLite: the CLI writes the store from its own handle (another process, as far as
    the store can tell); the running daemon's dispatcher sees the new revision with a
    round of its own (no notification on SQLite) and delivers to it."""
    setup = Setup(tmp_path)
    recorder = Recorder()
    daemon = setup.daemon(delivery_transport=httpx.ASGITransport(recorder.app))
    async with setup.api_http() as api_http, anyio.create_task_group() as tg:
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        args = ["endpoints", "create", "laptop", "--url", f"http://{HOST}/hook", "--json"]
        args += ["--config", str(setup.config_path)]
        result = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli, args))
        assert result.exit_code == 0, result.output
        # Read back from the store: the daemon's log lines share CliRunner's stdout here.
        with Store.open(setup.config.store.path) as store:
            stored = store.endpoints.stored_endpoint("laptop")
        assert stored is not None and stored.secret in result.output
        secret = stored.secret
        await setup.api(api_http).create_session("Created beside the daemon")
        await until(lambda: len(recorder.to(HOST)) >= 2)
        assert all(verifies(secret, h, b) for h, b in recorder.to(HOST))
        daemon.stop()
