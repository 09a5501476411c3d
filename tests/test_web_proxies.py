"""Forwarded headers over a real loopback listener (``server.trusted_proxies``): the
client's address (logged, and recorded with every action taken) and the scheme (the login
cookie's ``Secure``) come from ``X-Forwarded-For`` / ``X-Forwarded-Proto`` only when the
TCP peer is a trusted proxy, never from uvicorn's ``FORWARDED_ALLOW_IPS`` variable, and a
forwarded value that is not an address is never passed on as one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sessionhook.relay.config import ConfigError, ServerConfig
from sessionhook.relay.web import server as health
from sessionhook.relay.web.auth import client_address

pytestmark = [pytest.mark.app, pytest.mark.anyio]


async def _who(request: Request) -> Response:
    return JSONResponse({"client": client_address(request.scope), "scheme": request.url.scheme})


APP = Starlette(routes=[Route("/who", _who)])


@asynccontextmanager
async def serving(trusted: Sequence[str] | None = None) -> AsyncIterator[httpx.AsyncClient]:
    options = {} if trusted is None else {"trusted_proxies": trusted}
    async with anyio.create_task_group() as tg:
        _host, port = await tg.start(
            lambda task_status: health.serve("127.0.0.1:0", APP, task_status=task_status, **options)
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            yield http
        tg.cancel_scope.cancel()


async def _who_is(http: httpx.AsyncClient, **headers: str) -> tuple[str, str]:
    answer = await http.get("/who", headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()["client"], answer.json()["scheme"]


async def test_a_proxy_on_this_machine_is_trusted_by_default() -> None:
    async with serving() as http:
        assert await _who_is(http) == ("127.0.0.1", "http")
        forwarded = {"x-forwarded-for": "203.0.113.9", "x-forwarded-proto": "https"}
        assert await _who_is(http, **forwarded) == ("203.0.113.9", "https")
        # A client's own X-Forwarded-For, with the proxy's addition after it: the address
        # the proxy saw counts, not the one the client wrote.
        chain = {"x-forwarded-for": "198.51.100.7, 203.0.113.9"}
        assert (await _who_is(http, **chain))[0] == "203.0.113.9"
        # A scheme that is neither http nor https is not taken.
        assert (await _who_is(http, **{"x-forwarded-proto": "javascript"}))[1] == "http"


NOT_AN_ADDRESS = "not an address (X-Forwarded-For)"


@pytest.mark.parametrize(
    ("value", "client"),
    [
        (b"<b>x</b>", NOT_AN_ADDRESS),
        (b"not-an-ip", NOT_AN_ADDRESS),
        ("203.0.113.9\u202e".encode(), NOT_AN_ADDRESS),
        (b"1.2.3.4.5", NOT_AN_ADDRESS),
        (b"\xff", NOT_AN_ADDRESS),
        (b",,", "127.0.0.1"),  # nothing forwarded: the peer
    ],
)
async def test_a_forwarded_value_that_is_not_an_address_is_not_passed_on(
    value: bytes, client: str
) -> None:
    async with serving() as http:
        answer = await http.get("/who", headers={"x-forwarded-for": value})
    assert answer.status_code == 200
    assert answer.json()["client"] == client


@pytest.mark.parametrize("trusted", [[], ["10.0.0.0/8"], ["::1"]])
async def test_a_peer_that_is_not_a_trusted_proxy_forwards_nothing(
    trusted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # uvicorn would otherwise read its own variable: "*" would trust everyone.
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    async with serving(trusted) as http:
        forwarded = {"x-forwarded-for": "203.0.113.9", "x-forwarded-proto": "https"}
        assert await _who_is(http, **forwarded) == ("127.0.0.1", "http")


async def test_a_trusted_network_is_trusted() -> None:
    async with serving(["127.0.0.0/8"]) as http:
        assert (await _who_is(http, **{"x-forwarded-for": "2001:db8::5"}))[0] == "2001:db8::5"


def test_the_config_takes_addresses_and_networks_and_names_what_it_refuses() -> None:
    assert ServerConfig().trusted_proxies == ["127.0.0.1", "::1"]
    fine = ServerConfig.model_validate({"trusted_proxies": ["10.0.0.5", "10.0.0.0/24", "fd00::/8"]})
    assert fine.trusted_proxies == ["10.0.0.5", "10.0.0.0/24", "fd00::/8"]
    assert ServerConfig.model_validate({"trusted_proxies": []}).trusted_proxies == []
    for bad in ("*", "proxy.internal", "10.0.0.0/33", "10.0.0.1 "):
        with pytest.raises((ConfigError, ValueError), match="not an IP address or network"):
            ServerConfig.model_validate({"trusted_proxies": [bad]})
    with pytest.raises((ConfigError, ValueError)):
        ServerConfig.model_validate({"trusted_proxies": ["10.0.0.1"] * 65})
