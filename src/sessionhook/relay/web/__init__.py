"""The daemon's web layer: one Starlette app on ``[server] listen``, built from a route table.

:func:`create_app` assembles, in this order:

1. the health routes (:mod:`sessionhook.relay.web.server`: ``/healthz``, ``/readyz``,
   ``/metrics``, ``/openapi.json``), always, never authenticated;
2. when the console is on (:attr:`ServerConfig.web_enabled`: a token, or
   ``allow_unauthenticated`` on loopback): ``/login`` and ``/logout``
   (:mod:`.login`) and the routes of every provider in :data:`ROUTE_PROVIDERS` (the event
   stream, the console pages), each provider a function ``(WebContext) -> routes``.

Everything but the health routes and ``/login`` is behind :class:`.auth.AuthMiddleware`
(deny by default: a new route is protected without saying so; POSTs need the CSRF token of
:func:`.auth.csrf_field`). Every answer gets its security headers from
:class:`.headers.SecurityHeaders` (every HTML page, ``/login`` included, the console's
strict Content-Security-Policy; the rest, no framing). With the console off, only the
health routes exist (anything else is 404) and ``web.console_off`` is logged once. A store
that fails under a route (the PostgreSQL server down or restarting, a lost connection) is a
503 and one ``web.store_failed`` log line, never a traceback.

A route reaches the daemon through :class:`WebContext` (``request.app.state.web``, or the
provider's closure): the store once it is open (``None`` before: answer 503), the current
config, the metrics, the bell rung on every ingest, the clock.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from ...redact import redact_userinfo
from ..config import Config
from ..domain.retry import AttemptResult
from ..store import AsyncStore, StoreError, database_errors
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics
from . import server as health
from .auth import PUBLIC_PATHS, AuthMiddleware, WebAuth
from .bell import Bell
from .headers import SecurityHeaders
from .login import login_routes

__all__ = ["ROUTE_PROVIDERS", "Bell", "RouteProvider", "WebAuth", "WebContext", "create_app"]

_log = get_logger()


@dataclass
class WebContext:
    """What web routes may use of the daemon (see the module docstring)."""

    config: Callable[[], Config]
    store: Callable[[], AsyncStore | None]
    metrics: Metrics
    auth: WebAuth
    bell: Bell = field(default_factory=lambda: Bell())
    clock: Callable[[], float] = time.time
    #: The console's actions: send endpoint NAME a signed test event now (``OperatorError``
    #: for an unknown name; ``None``: not available), and wake the dispatcher after a
    #: replay or an endpoint enabled.
    send_test: Callable[[str], Awaitable[AttemptResult]] | None = None
    wake: Callable[[], None] = lambda: None


#: Builds a group of protected routes.
RouteProvider = Callable[[WebContext], Sequence[BaseRoute]]


def _providers() -> list[RouteProvider]:
    # Imported here: the providers import this module for WebContext.
    from .console.pages import console_provider
    from .stream import stream_routes

    return [stream_routes, console_provider]


#: The protected route groups, in order. The console adds its own here.
ROUTE_PROVIDERS: Callable[[], list[RouteProvider]] = _providers


def create_app(
    ctx: WebContext,
    *,
    readiness: health.ReadinessCheck,
    before_scrape: health.ScrapeHook | None = None,
    providers: Sequence[RouteProvider] | None = None,
    store: Mapping[str, str] | None = None,
) -> Starlette:
    """The app for ``[server] listen``: health routes, plus login, stream and console when
    the config turns the console on. ``providers`` replaces :data:`ROUTE_PROVIDERS` (tests);
    ``store`` is what /readyz says of the store (see :func:`health.health_routes`)."""
    routes: list[BaseRoute] = list(
        health.health_routes(
            metrics=ctx.metrics, readiness=readiness, before_scrape=before_scrape, store=store
        )
    )
    server = ctx.config().server
    if server is None or not server.web_enabled:
        _log.info(
            "web.console_off",
            reason="no server.token_env / server.token_file, and no loopback opt-out",
        )
        return Starlette(routes=routes)
    routes.extend(login_routes(ctx.auth))
    for provider in ROUTE_PROVIDERS() if providers is None else providers:
        routes.extend(provider(ctx))
    # The daemon builds the app before it opens the store: name the engine's errors now.
    postgresql = store is not None and store.get("backend") == "postgresql"
    errors = database_errors(postgresql=postgresql)
    handlers = {kind: _store_failed for kind in (StoreError, *errors)}
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(AuthMiddleware, auth=ctx.auth, public=PUBLIC_PATHS),
        ],
        exception_handlers=handlers,
    )
    app.state.web = ctx
    return app


async def _store_failed(request: Request, exc: Exception) -> Response:
    """A route's store read failed (PostgreSQL down or restarting, a lost connection, a
    broken file): a 503 and one log line, never a traceback. Console pages get a page
    saying so (the browser can simply reload), anything else a JSON error."""
    text = str(exc).strip()
    error = redact_userinfo(text.splitlines()[0] if text else type(exc).__name__)
    _log.warning("web.store_failed", path=request.url.path, error=error)
    if request.url.path.startswith("/console"):
        from .console.pages import store_failed_page  # the console imports this module

        return store_failed_page(request, error)
    return JSONResponse(
        {"error": f"the store cannot be read now: {error}"},
        status_code=503,
        headers={"retry-after": "5"},
    )
