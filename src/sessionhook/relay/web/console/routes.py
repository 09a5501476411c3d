"""The console's route list (:func:`console_provider`): pages, actions, the live feed and
the static assets (nothing loaded from another host, so the CSP can say ``'self'`` only),
all behind :mod:`..auth`.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ...config import DEFAULT_ACCOUNT
from ..context import WebContext
from .actions import Actions
from .common import PACKAGE_DIR, ConsoleDeps
from .endpoint_forms import EndpointForms
from .lists import Lists
from .live import live_route
from .pages import Pages


def console_routes(deps: ConsoleDeps) -> list[BaseRoute]:
    """The console's routes; they expect the access control of :mod:`..auth` in front."""
    pages, lists = Pages(deps), Lists(deps)
    return [
        Route("/console", pages.overview, methods=["GET", "HEAD"]),
        Route("/console/sessions", pages.sessions, methods=["GET", "HEAD"]),
        Route("/console/timeline", pages.timeline, methods=["GET", "HEAD"]),
        Route("/console/deliveries", lists.deliveries, methods=["GET", "HEAD"]),
        Route("/console/events", lists.events, methods=["GET", "HEAD"]),
        # The ids are read by url_int: Starlette's int convertor takes any length.
        Route("/console/deliveries/{delivery_id}", pages.delivery, methods=["GET", "HEAD"]),
        Route("/console/attempts/{attempt_id}", pages.attempt, methods=["GET", "HEAD"]),
        *Actions(deps).routes(),
        *EndpointForms(deps).routes(),
        live_route(deps),
        Mount(
            "/console/static",
            StaticFiles(directory=PACKAGE_DIR / "static"),
            name="console-static",
        ),
    ]


def console_provider(ctx: WebContext) -> list[BaseRoute]:
    """The console's routes on the daemon's :class:`~sessionhook.relay.web.context.WebContext`."""

    def budgets() -> dict[str, int]:
        # Each account's requests_per_minute, as upstream_accounts() derives them (without
        # touching the secrets).
        config = ctx.config()
        rpm = config.api.requests_per_minute
        if not config.accounts:
            return {DEFAULT_ACCOUNT: rpm}
        return {a.name: a.requests_per_minute or rpm for a in config.accounts}

    return console_routes(
        ConsoleDeps(
            store=ctx.store,
            budgets=budgets,
            send_test=ctx.send_test,
            wake=ctx.wake,
            clock=ctx.clock,
            bell=ctx.bell,
            act=ctx.act,
            backend=(ctx.store_facts or {}).get("backend", ""),
            config=ctx.config,
            metrics=ctx.metrics,
        )
    )
