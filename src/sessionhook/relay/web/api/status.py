"""``GET /v1/status``: what ``sessionhook status --json`` prints, over HTTP."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ... import ops as operator
from ...ops.wire import status_answer
from ..answers import api_answer, api_route
from ..context import WebContext
from .common import require_store


def status_routes(ctx: WebContext) -> Sequence[BaseRoute]:
    """``GET /v1/status``: endpoints, upstream, archive, history walk, accounts, replicas."""

    async def status(request: Request) -> Response:
        store = require_store(ctx)
        now = ctx.clock()
        overview = await store.run(operator.status, now)
        return api_answer(status_answer(overview, now))

    return [api_route("getStatus", status)]
