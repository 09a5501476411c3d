"""``/v1/sessions``: the archived sessions, one with its events, and what a person does to
one upstream.

``GET /v1/sessions``, ``GET /v1/sessions/{id}`` (its first events; ``more_events`` says to
list the rest through ``/v1/events``), and ``POST /v1/sessions/{id}:approvePlan`` /
``:sendMessage`` (``{"prompt"}``): made with the session's account (``ctx.act``) and
recorded as an ``api`` action; 502 when the service refused, 503 when this relay cannot act.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ...domain.actions import ActionKind
from ...domain.api_models import (
    ApiActed,
    ApiEmptyBody,
    ApiMessageBody,
    ApiSessionDetail,
    ApiSessionPage,
)
from ...ops import OperatorError, pages
from ...ops.actions import Actor, record_direct
from ...ops.wire import event_answer, session_answer
from ...store import OperatorQueries
from ...telemetry.logs import get_logger
from ..answers import api_answer, api_route
from ..auth import client_address
from ..context import WebContext
from .common import (
    ApiProblem,
    not_found,
    page_answer,
    page_request,
    read_json,
    require_store,
    unavailable,
)
from .inputs import session_name

_log = get_logger()


def sessions_routes(ctx: WebContext) -> Sequence[BaseRoute]:
    """The routes of the module docstring."""

    async def listing(request: Request) -> Response:
        store = require_store(ctx)
        page = page_request(request)
        found = await store.run(pages.session_page, size=page.size, after=page.after)
        items = [session_answer(row) for row in found.items]
        return api_answer(page_answer(ApiSessionPage, items, found.after))

    async def one(request: Request) -> Response:
        store = require_store(ctx)
        name = session_name(request.path_params["id"])
        try:
            row, events, more = await store.run(pages.session_detail, name)
        except OperatorError as exc:
            raise not_found(str(exc)) from None
        return api_answer(
            ApiSessionDetail(
                session=session_answer(row),
                events=[event_answer(e) for e in events],
                more_events=more,
            )
        )

    async def act(request: Request, kind: ActionKind, text: str | None) -> Response:
        store = require_store(ctx)
        name = session_name(request.path_params["id"])
        if await store.run(OperatorQueries.get_session, name) is None:
            raise not_found(f"no session {name} in the archive")
        if ctx.act is None:
            raise unavailable("this relay cannot act on sessions (no upstream client here)")
        outcome = await ctx.act(name, kind, text)
        _log.info("api.act", session=name, kind=kind, ok=outcome.ok, status=outcome.status)
        who = Actor("api", client_address(request.scope), request.headers.get("user-agent", ""))
        await record_direct(
            store, name, kind, outcome, actor=who, now=ctx.clock(), metrics=ctx.metrics
        )
        if not outcome.ok:
            detail = " ".join(outcome.detail.split())[:500] or "the service refused"
            raise ApiProblem(502, f"the Sessions API refused: {detail}")
        return api_answer(ApiActed(ok=True, session=name, detail=outcome.detail))

    async def approve(request: Request) -> Response:
        await read_json(request, ApiEmptyBody)  # an empty body, or {}
        return await act(request, "approve_plan", None)

    async def message(request: Request) -> Response:
        body = await read_json(request, ApiMessageBody)
        if not body.prompt.strip():
            raise ApiProblem(400, "prompt: the message is empty")
        return await act(request, "reply", body.prompt)

    return [
        api_route("listSessions", listing),
        api_route("approvePlan", approve),
        api_route("sendMessage", message),
        api_route("getSession", one),
    ]
