"""Access control of the web layer: the route table, bearer token, login cookie, CSRF.

Every protected route is tried with no token, a wrong token, the right token, and (POSTs)
with the CSRF token missing and wrong; the public routes stay open.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import anyio
import httpx
import pytest
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route
from structlog.testing import capture_logs

from sessionhook.relay.config import Config
from sessionhook.relay.store import AsyncStore
from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import WebContext, create_app
from sessionhook.relay.web import server as health
from sessionhook.relay.web.action_pages import is_public_path
from sessionhook.relay.web.auth import (
    COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    PUBLIC_PATHS,
    WebAuth,
    csrf_field,
    csrf_token,
    read_form,
    safe_next,
    web_session,
)
from sessionhook.relay.web.headers import SECURITY_HEADERS
from tests.support.backends import Backend
from tests.support.loopback import free_port

pytestmark = [pytest.mark.app, pytest.mark.anyio]

TOKEN = "t" * 20 + "0123456789abcdefXYZ"
BASE = "http://127.0.0.1:9187"


def _probe_routes(_ctx: WebContext) -> Sequence[BaseRoute]:
    async def page(request: Request) -> Response:
        return HTMLResponse(f"<form method=post>{csrf_field(request)}</form>")

    async def data(request: Request) -> Response:
        return JSONResponse({"kind": web_session(request).kind})

    async def action(request: Request) -> Response:
        form = await read_form(request)
        return JSONResponse({"done": True, "value": form.get("value")})

    return [
        Route("/probe", page, methods=["GET"]),
        Route("/probe/data", data, methods=["GET"]),
        Route("/probe/action", action, methods=["POST"]),
    ]


def _config(**server: object) -> Config:
    return Config.model_validate({"server": {"listen": "127.0.0.1:9187", **server}})


def _app(token: str | None = TOKEN, *, clock: float | None = None, **server: object) -> object:
    if token is not None and not server:
        server = {"token_env": "WEB_TOKEN"}
    config = _config(**server)
    auth = WebAuth(token) if clock is None else WebAuth(token, clock=lambda: clock)
    ctx = WebContext(config=lambda: config, store=lambda: None, metrics=Metrics(), auth=auth)
    return create_app(ctx, providers=[_probe_routes])


def _client(app: object, base: str = BASE) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base)  # type: ignore[arg-type]


async def _login(client: httpx.AsyncClient, landing: str | None = "/probe") -> str:
    """Log in through the form; the CSRF token of the session (read from the ``landing``
    page's form, or computed from the cookie when there is no page to read it from)."""
    answer = await client.post("/login", data={"token": TOKEN, "next": landing or "/"})
    assert answer.status_code == 303 and answer.headers["location"] == (landing or "/")
    if landing is None:
        session = WebAuth(TOKEN).session_from_cookie(client.cookies[COOKIE])
        assert session is not None
        return session.csrf
    page = await client.get(landing)
    assert page.status_code == 200
    match = re.search(rf'name="{CSRF_FIELD}" value="([^"]+)"', page.text)
    assert match
    return match.group(1)


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/openapi.json"])
async def test_health_routes_stay_public(path: str) -> None:
    async with _client(_app()) as client:
        assert (await client.get(path)).status_code == 200
        bad = await client.get(path, headers={"authorization": "Bearer wrong"})
        assert bad.status_code == 200


@pytest.mark.parametrize("path", ["/probe", "/probe/data", "/nowhere"])
async def test_no_token_is_401(path: str) -> None:
    async with _client(_app()) as client:
        answer = await client.get(path)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")


async def test_a_browser_without_a_login_is_sent_to_the_login_page() -> None:
    async with _client(_app()) as client:
        answer = await client.get("/probe?x=1", headers={"accept": "text/html"})
        assert answer.status_code == 303
        assert answer.headers["location"] == "/login?next=%2Fprobe%3Fx%3D1"
        form = await client.get("/login")
    assert form.status_code == 200 and 'name="token"' in form.text


@pytest.mark.parametrize("path", ["/probe", "/probe/data"])
async def test_wrong_bearer_token_is_401_and_one_log_line_without_the_token(path: str) -> None:
    async with _client(_app()) as client:
        with capture_logs() as logs:
            answer = await client.get(path, headers={"authorization": "Bearer " + TOKEN[:-1] + "!"})
    assert answer.status_code == 401
    assert answer.json()["error"] == {
        "code": 401,
        "message": "wrong token",
        "status": "UNAUTHENTICATED",
    }
    failed = [e for e in logs if e["event"] == "web.auth_failed"]
    assert len(failed) == 1
    assert failed[0]["client"] == "127.0.0.1" and failed[0]["path"] == path
    assert TOKEN[:10] not in repr(logs)


async def test_right_bearer_token_passes_and_needs_no_csrf() -> None:
    async with _client(_app()) as client:
        auth = {"authorization": f"Bearer {TOKEN}"}
        data = await client.get("/probe/data", headers=auth)
        assert data.json() == {"kind": "bearer"}
        # No other site may frame a protected page (clickjacking of the console's buttons).
        assert data.headers["x-frame-options"] == "DENY"
        assert data.headers["content-security-policy"] == "frame-ancestors 'none'"
        done = await client.post("/probe/action", data={"value": "x"}, headers=auth)
    assert done.status_code == 200 and done.json() == {"done": True, "value": "x"}


async def test_login_cookie_then_csrf_checked_on_every_post() -> None:
    async with _client(_app()) as client:
        csrf = await _login(client)
        assert (await client.get("/probe/data")).json() == {"kind": "cookie"}
        with capture_logs() as logs:
            missing = await client.post("/probe/action", data={"value": "x"})
            wrong = await client.post(
                "/probe/action", data={"value": "x", CSRF_FIELD: csrf[:-2] + "AA"}
            )
        right = await client.post("/probe/action", data={"value": "x", CSRF_FIELD: csrf})
        by_header = await client.post(
            "/probe/action", data={"value": "y"}, headers={CSRF_HEADER: csrf}
        )
    assert missing.status_code == 403 and wrong.status_code == 403
    assert [e["event"] for e in logs].count("web.csrf_failed") == 2
    # The body was read for the check and still reaches the route whole.
    assert right.status_code == 200 and right.json() == {"done": True, "value": "x"}
    assert by_header.json() == {"done": True, "value": "y"}


async def test_a_csrf_token_is_bound_to_its_login() -> None:
    app = _app()
    async with _client(app) as first, _client(app) as second:
        csrf_first = await _login(first)
        await _login(second)
        crossed = await second.post("/probe/action", data={CSRF_FIELD: csrf_first})
    assert crossed.status_code == 403


async def test_wrong_token_at_the_login_form_is_401_and_logged() -> None:
    async with _client(_app()) as client:
        with capture_logs() as logs:
            answer = await client.post("/login", data={"token": "nope" * 10})
        assert answer.status_code == 401 and "Wrong token" in answer.text
        assert COOKIE not in answer.cookies
        assert (await client.get("/probe/data")).status_code == 401
    assert [e["via"] for e in logs if e["event"] == "web.auth_failed"] == ["login"]


async def test_the_login_page_carries_the_console_pages_security_headers() -> None:
    async with _client(_app()) as client:
        form = await client.get("/login")
        wrong = await client.post("/login", data={"token": "nope" * 10})
        style = await client.get("/login.css")
        csrf = await _login(client)
        out = await client.post("/logout", data={CSRF_FIELD: csrf})
    for page in (form, wrong):
        assert page.headers["content-type"].startswith("text/html")
        for name, value in SECURITY_HEADERS.items():
            assert page.headers[name] == value, name
        # Styled from this server: the policy forbids an inline style.
        assert "<style" not in page.text and 'href="/login.css"' in page.text
    assert "style-src 'self'" in SECURITY_HEADERS["Content-Security-Policy"]
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    assert out.status_code == 303 and out.headers["x-frame-options"] == "DENY"


async def test_the_cookie_is_httponly_samesite_strict_and_secure_over_https() -> None:
    async with _client(_app()) as client:
        plain = await client.post("/login", data={"token": TOKEN})
    async with _client(_app(), "https://console.example") as client:
        tls = await client.post("/login", data={"token": TOKEN})
    for answer in (plain, tls):
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "Secure" not in plain.headers["set-cookie"]
    assert "Secure" in tls.headers["set-cookie"]


async def test_logout_needs_csrf_and_ends_the_session() -> None:
    async with _client(_app()) as client:
        csrf = await _login(client)
        assert (await client.post("/logout")).status_code == 403
        out = await client.post("/logout", data={CSRF_FIELD: csrf})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert (await client.get("/probe/data")).status_code == 401


async def test_a_forged_or_expired_cookie_is_refused() -> None:
    now = 1_000_000.0
    auth = WebAuth(TOKEN, clock=lambda: now)
    _session, value = auth.new_session()
    assert auth.session_from_cookie(value) is not None
    issued, nonce_mac = value.split(".", 2)[1], value.split(".", 2)[2]
    assert auth.session_from_cookie(f"v1.{int(issued) + 1}.{nonce_mac}") is None
    assert WebAuth("another token " * 3).session_from_cookie(value) is None
    assert WebAuth(TOKEN, clock=lambda: now + 13 * 3600).session_from_cookie(value) is None
    async with _client(_app(clock=now + 13 * 3600)) as client:
        client.cookies.set(COOKIE, value)
        assert (await client.get("/probe/data")).status_code == 401


def test_login_redirects_only_to_local_paths() -> None:
    assert safe_next("/sessions?x=1") == "/sessions?x=1"
    for bad in ("https://evil.example/", "//evil.example", "/\\evil", "", None, "sessions"):
        assert safe_next(bad) == "/"


async def test_without_a_token_the_console_is_off() -> None:
    config = _config()
    ctx = WebContext(
        config=lambda: config, store=lambda: None, metrics=Metrics(), auth=WebAuth(None)
    )
    with capture_logs() as logs:
        app = create_app(ctx, providers=[_probe_routes])
    async with _client(app) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/probe/data")).status_code == 404
        assert (await client.get("/login")).status_code == 404
    assert [e["event"] for e in logs] == ["web.console_off"]


async def test_loopback_opt_out_needs_no_token_but_still_csrf() -> None:
    app = _app(None, allow_unauthenticated=True)
    async with _client(app) as client:
        page = await client.get("/probe")
        assert page.status_code == 200
        assert (await client.get("/probe/data")).json() == {"kind": "anonymous"}
        csrf = re.search(rf'name="{CSRF_FIELD}" value="([^"]+)"', page.text)
        assert csrf
        assert (await client.post("/probe/action", data={"value": "1"})).status_code == 403
        done = await client.post("/probe/action", data={"value": "1", CSRF_FIELD: csrf.group(1)})
        assert done.status_code == 200
    # A name rebound to 127.0.0.1 by another site's DNS is not a loopback name.
    async with _client(app, "http://evil.example:9187") as client:
        assert (await client.get("/probe/data")).status_code == 403


async def test_a_large_post_body_is_refused_before_the_route() -> None:
    async with _client(_app()) as client:
        csrf = await _login(client)
        answer = await client.post("/probe/action", data={CSRF_FIELD: csrf, "value": "x" * 70_000})
    assert answer.status_code == 413


async def test_csrf_token_helper_matches_the_form_field() -> None:
    seen: list[str] = []

    def provider(_ctx: WebContext) -> Sequence[BaseRoute]:
        async def page(request: Request) -> Response:
            seen.append(csrf_token(request))
            return HTMLResponse(str(csrf_field(request)))

        return [Route("/p", page)]

    config = _config(token_env="X")
    ctx = WebContext(
        config=lambda: config, store=lambda: None, metrics=Metrics(), auth=WebAuth(TOKEN)
    )
    app = create_app(ctx, providers=[provider])
    async with _client(app) as client:
        await client.post("/login", data={"token": TOKEN})
        page = await client.get("/p")
    assert seen and f'value="{seen[0]}"' in page.text


# --------------------------------------------------------------------------- every route


def _route_table(backend: Backend) -> tuple[list[tuple[str, str]], Any, AsyncStore]:
    """The daemon's real route table (every provider, the console's included) over
    ``backend``'s store and the ``(method, path)`` of each protected route, path
    parameters filled with ``x``."""
    config = _config(token_env="WEB_TOKEN")
    astore = AsyncStore(backend.open())
    ctx = WebContext(
        config=lambda: config, store=lambda: astore, metrics=Metrics(), auth=WebAuth(TOKEN)
    )
    app = create_app(ctx)
    protected: list[tuple[str, str]] = []
    for route in app.routes:
        path = getattr(route, "path_format", None) or getattr(route, "path", "")
        path = re.sub(r"\{[^}]+\}", "x", path) or "/"
        if path in PUBLIC_PATHS or is_public_path(ctx, path):  # the action links' pages
            continue
        methods = getattr(route, "methods", None) or {"GET"}
        protected += [(m, path) for m in sorted(methods) if m != "HEAD"]
    return protected, app, astore


async def test_every_route_in_the_table_is_guarded(backend: Backend) -> None:
    """No token, a wrong token: 401 on every protected route; the right token gets past
    the guard (and the route answers, on either store engine); a POST from a login needs
    its CSRF token (missing or wrong: 403)."""
    protected, app, astore = _route_table(backend)
    assert ("GET", "/v1/events/stream") in protected and ("POST", "/logout") in protected
    listen = f"127.0.0.1:{free_port()}"
    try:
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(health.serve, listen, app)
            base = f"http://{host}:{port}"
            async with (
                httpx.AsyncClient(base_url=base) as anonymous,
                httpx.AsyncClient(base_url=base) as browser,
            ):
                csrf = await _login(browser, landing=None)
                for method, path in protected:
                    where = f"{method} {path}"
                    assert (await anonymous.request(method, path)).status_code == 401, where
                    wrong = {"authorization": "Bearer " + "w" * 40}
                    answer = await anonymous.request(method, path, headers=wrong)
                    assert answer.status_code == 401, where
                    right = {"authorization": f"Bearer {TOKEN}"}
                    async with anonymous.stream(method, path, headers=right) as answer:
                        assert answer.status_code not in (401, 403), where
                        assert answer.status_code < 500, where
                    if method == "POST":
                        missing = await browser.post(path, data={"x": "1"})
                        assert missing.status_code == 403, where
                        forged = await browser.post(path, data={CSRF_FIELD: csrf[::-1]})
                        assert forged.status_code == 403, where
            tg.cancel_scope.cancel()
    finally:
        await astore.close()
