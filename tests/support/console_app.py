"""The console in process for tests: the daemon's real route table (access control in
front) over a given store, a client signed in through /login, and a form with its CSRF
token. (The browser tests drive ``sessionhook run`` instead: console_harness.py.)"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
from anyio.from_thread import start_blocking_portal
from starlette.applications import Starlette

from sessionhook.relay.config import Config
from sessionhook.relay.store import AsyncStore
from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import WebContext, create_app
from sessionhook.relay.web.auth import CSRF_FIELD, WebAuth
from sessionhook.relay.web.server import serve
from tests.support.clock import T0

TOKEN = "console-test-token-0123456789abcdefghij"
BASE = "http://127.0.0.1:9187"


def app_for(astore: AsyncStore | None, *, delivery: Any = None, **context: Any) -> Starlette:
    """The daemon's real route table (access control in front) with the console on;
    ``delivery``: the config's ``[delivery]`` keys."""
    config = Config.model_validate(
        {
            "server": {"listen": "127.0.0.1:9187", "token_env": "WEB_TOKEN"},
            "delivery": delivery or {},
        }
    )
    ctx = WebContext(
        config=lambda: config,
        store=lambda: astore,
        metrics=Metrics(),
        auth=WebAuth(TOKEN),
        clock=lambda: T0 + 600,
        **context,
    )
    return create_app(ctx)


@asynccontextmanager
async def logged_in(app: Starlette) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A client that signed in through /login (cookie session) and its CSRF token."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
        yield http, await login(http)


async def login(http: httpx.AsyncClient) -> str:
    """Sign ``http`` in with the token; the session's CSRF token."""
    answer = await http.post("/login", data={"token": TOKEN, "next": "/console/sessions"})
    assert answer.status_code == 303
    page = await http.get("/console/sessions")
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text)
    assert found is not None
    return found.group(1)


def form(token: str, **fields: str) -> dict[str, Any]:
    """``httpx`` keyword arguments posting ``fields`` with the CSRF token."""
    return {"data": {**fields, CSRF_FIELD: token}}


@contextmanager
def serving(app: Starlette) -> Iterator[str]:
    """``app`` served on a free port of 127.0.0.1 (for a browser): its base URL."""
    with start_blocking_portal() as portal:
        server, (_, port) = portal.start_task(serve, "127.0.0.1:0", app)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.cancel()
