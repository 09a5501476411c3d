"""The management API: JSON under ``/v1/`` on ``[server] listen``, behind the same token as
the console and the event stream (:mod:`..auth`; a bearer request needs no CSRF token).

Each module is a group of routes, ``(WebContext) -> routes``, listed in :data:`API_GROUPS`;
:mod:`.common` holds what they share (errors in the Sessions API's shape, JSON bodies,
pages). A path under ``/v1/`` that no group serves is a 404 error body, never the HTML of a
console page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..context import RouteProvider, WebContext
from .actions import actions_routes
from .common import ApiProblem, api_problem_response, not_found
from .deliveries import deliveries_routes
from .endpoints import endpoint_routes
from .events import events_routes
from .sessions import sessions_routes
from .status import status_routes

__all__ = ["API_GROUPS", "ApiProblem", "api_problem_response", "api_routes"]

#: The API's route groups, in order.
API_GROUPS: Final[tuple[RouteProvider, ...]] = (
    status_routes,
    endpoint_routes,
    deliveries_routes,
    events_routes,
    sessions_routes,
    actions_routes,
)

_METHODS: Final = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def api_routes(ctx: WebContext) -> Sequence[BaseRoute]:
    """Every group's routes, then a 404 for any other path under ``/v1/``."""
    routes: list[BaseRoute] = []
    for group in API_GROUPS:
        routes.extend(group(ctx))

    async def unknown(request: Request) -> Response:
        raise not_found(f"no API route {request.method} {request.url.path}")

    routes.append(Route("/v1/{rest:path}", unknown, methods=_METHODS))
    return routes
