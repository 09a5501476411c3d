"""The daemon's web layer: one Starlette app on ``[server] listen``, built from a route table.

:func:`create_app` assembles the health routes (:mod:`.server`, never authenticated), the
pages behind signed action links (:mod:`.action_pages`), and, when the console is on,
``/login`` (:mod:`.login`), the MCP server at ``/mcp`` (:mod:`.mcp`, unless ``[mcp]
enabled = false``; what it runs beside its routes is in ``app.state.services``, entered by
:func:`.server.serve`) and every provider of :data:`ROUTE_PROVIDERS` (the event stream, the
console, the API), each a function ``(WebContext) -> routes``. All but the public routes
are behind :class:`.auth.AuthMiddleware`; every answer gets :class:`.headers.SecurityHeaders`.
A store that fails under a route is a 503 and one ``web.store_failed`` line. A route reaches
the daemon only through :class:`.context.WebContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ExceptionHandler

from ...redact import redact_userinfo
from ..store import StoreError
from ..telemetry.logs import get_logger
from .action_pages import action_routes, is_public_path
from .answers import error_response
from .api import ApiProblem, api_problem_response, api_routes
from .api.slack import slack_routes
from .auth import PUBLIC_PATHS, AuthMiddleware, WebAuth, logged_path
from .bell import Bell
from .console.common import store_failed_page
from .console.routes import console_provider
from .context import RouteProvider, SendSample, WebContext
from .headers import SecurityHeaders
from .login import login_routes
from .mcp import McpService
from .server import health_routes
from .stream import stream_routes

__all__ = [
    "ROUTE_PROVIDERS",
    "Bell",
    "RouteProvider",
    "SendSample",
    "WebAuth",
    "WebContext",
    "create_app",
]

_log = get_logger()

#: The protected route groups, in order.
ROUTE_PROVIDERS: Final[tuple[RouteProvider, ...]] = (stream_routes, console_provider, api_routes)


def create_app(ctx: WebContext, *, providers: Sequence[RouteProvider] | None = None) -> Starlette:
    """The app for ``[server] listen``: health routes, plus login, stream and console when
    the config turns the console on. ``providers`` replaces :data:`ROUTE_PROVIDERS` (tests)."""
    routes: list[BaseRoute] = list(
        health_routes(
            metrics=ctx.metrics,
            readiness=ctx.readiness,
            before_scrape=ctx.before_scrape,
            store=ctx.store_facts,
        )
    )
    config = ctx.config()
    server = config.server
    if server is None or not server.web_enabled:
        _log.info(
            "web.console_off",
            reason="no server.token_env / server.token_file, and no loopback opt-out",
        )
        # The action pages are capabilities: they need no console (off: they answer 404;
        # with require_login they refuse whoever is not logged in, and here nobody is).
        # Slack's interactivity needs none either: Slack's signature is its credential.
        off = Starlette(
            routes=[*routes, *action_routes(ctx), *slack_routes(ctx)],
            middleware=[Middleware(SecurityHeaders)],
            exception_handlers={ApiProblem: api_problem_response},
        )
        off.state.web = ctx
        return off
    routes.extend(login_routes(ctx.auth))
    routes.extend(action_routes(ctx))
    services: list[Callable[[], AbstractAsyncContextManager[None]]] = []
    if config.mcp.enabled:
        mcp = McpService(ctx)
        routes.extend(mcp.routes())
        services.append(mcp.running)
    for provider in ROUTE_PROVIDERS if providers is None else providers:
        routes.extend(provider(ctx))
    failures: tuple[type[Exception], ...] = (StoreError, *ctx.store_errors)
    handlers: dict[Any, ExceptionHandler] = {kind: _store_failed for kind in failures}
    handlers[ApiProblem] = api_problem_response
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(
                AuthMiddleware,
                auth=ctx.auth,
                public=PUBLIC_PATHS,
                is_public=lambda path: is_public_path(ctx, path),
            ),
        ],
        exception_handlers=handlers,
    )
    app.state.web = ctx
    #: What runs beside the routes while the listener serves (``server.serve``).
    app.state.services = services
    return app


async def _store_failed(request: Request, exc: Exception) -> Response:
    """A route's store read failed: a 503 and one log line, never a traceback (a page for
    the console, a JSON error elsewhere)."""
    text = str(exc).strip()
    error = redact_userinfo(text.splitlines()[0] if text else type(exc).__name__)
    _log.warning("web.store_failed", path=logged_path(request.url.path), error=error)
    if request.url.path.startswith("/console"):
        return store_failed_page(request, error)
    return error_response(503, f"the store cannot be read now: {error}", {"retry-after": "5"})
